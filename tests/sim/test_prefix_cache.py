"""The simulated prefix cache: leading-run hits, pins, LRU of freed blocks, the last-token rule."""

from __future__ import annotations

from calroute.sim.prefix_cache import BlockCache

B = 512


def test_hits_are_the_leading_run_of_held_blocks() -> None:
    c = BlockCache(B)
    assert c.acquire((1, 2, 3), 3 * B + 10) == 0
    c.release((1, 2, 3))
    assert c.acquire((1, 2, 4), 3 * B + 10) == 2 * B
    assert c.acquire((5, 2, 3), 3 * B + 10) == 0  # a leading miss: nothing after it counts
    assert c.hits_tokens == 2 * B and c.queried_tokens == 3 * (3 * B + 10)


def test_a_prompt_is_never_served_whole_from_cache() -> None:
    c = BlockCache(B)
    c.acquire((1, 2), 2 * B)
    c.release((1, 2))
    # vLLM computes at least the last token: a prompt of exactly two cached blocks hits one
    assert c.acquire((1, 2), 2 * B) == B
    assert c.acquire((1, 2), 2 * B + 1) == 2 * B


def test_pinned_blocks_are_shared_and_never_evicted() -> None:
    c = BlockCache(B)
    c.acquire((1, 2), 3 * B)
    assert c.acquire((1, 2), 3 * B) == 2 * B  # in use by another request: still a hit
    c.trim(0)
    assert c.holds(1) and c.holds(2)
    c.release((1, 2))
    c.trim(0)
    assert c.holds(1)  # still pinned once
    c.release((1, 2))
    assert c.free_blocks == 2
    c.trim(B)  # room for one free block: the last one freed is the first block, which stays
    assert c.free_blocks == 1 and c.holds(1) and not c.holds(2)


def test_trim_evicts_least_recently_freed_first() -> None:
    c = BlockCache(B)
    for blocks in ((1,), (2,), (3,)):
        c.acquire(blocks, 2 * B)
        c.release(blocks)
    c.trim(2 * B)
    assert not c.holds(1) and c.holds(2) and c.holds(3)


def test_a_freed_prompt_is_evicted_from_its_tail_as_vllm_frees_it() -> None:
    # vLLM frees a request's blocks last first ("so that the tail blocks are evicted first"): under pressure
    # the prompt keeps its head, which still hits; evicting its first block would strand the rest
    c = BlockCache(B)
    c.acquire((1, 2, 3, 4), 5 * B)
    c.release((1, 2, 3, 4))
    c.trim(2 * B)
    assert c.holds(1) and c.holds(2) and not c.holds(3) and not c.holds(4)
    assert c.peek((1, 2, 3, 4), 5 * B) == 2 * B
