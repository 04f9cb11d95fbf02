"""The one prefix-cache model (kvcache/pool.py) against what vLLM 0.32's block pool does."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from calroute.kvcache.pool import BlockPool, RequestBlocks

B = 16


class Heard:
    def __init__(self) -> None:
        self.events: list[tuple[str, list[int], int | None, int]] = []

    def stored(
        self, hashes: list[int], parent: int | None, first_block: int, tokens: Sequence[int] | None
    ) -> None:
        self.events.append(("stored", list(hashes), parent, first_block))

    def removed(self, hashes: list[int]) -> None:
        self.events.append(("removed", list(hashes), None, 0))

    def cleared(self) -> None:
        self.events.append(("cleared", [], None, 0))


def run(pool: BlockPool, hashes: Sequence[int], tokens: int) -> RequestBlocks:
    """A request computed whole and finished: admitted with its hit, every full block cached, freed."""
    rb = serve(pool, hashes, tokens)
    pool.free(rb)
    return rb


def serve(pool: BlockPool, hashes: Sequence[int], tokens: int) -> RequestBlocks:
    rb = RequestBlocks()
    hit = pool.lookup(hashes, tokens)
    assert pool.admit(rb, hashes, hit, tokens - hit * B, tokens)
    pool.cache(rb, hashes, tokens // B)
    return rb


def test_a_hit_is_the_leading_run_of_cached_blocks() -> None:
    pool = BlockPool(100 * B, B)
    run(pool, (1, 2, 3), 3 * B + 5)
    assert pool.lookup((1, 2, 4), 3 * B + 5) == 2
    assert pool.lookup((5, 2, 3), 3 * B + 5) == 0  # a leading miss: nothing after it counts


@pytest.mark.parametrize(
    ("tokens", "hit"),
    [(2 * B, 1), (2 * B + 1, 2), (B, 0), (B + 1, 1)],
    ids=["exact-two-blocks", "one-token-more", "one-block", "one-block-and-a-token"],
)
def test_the_last_token_is_always_computed(tokens: int, hit: int) -> None:
    # vLLM's get_computed_blocks: max_cache_hit_length = num_tokens - 1
    pool = BlockPool(100 * B, B)
    run(pool, (1, 2), 2 * B + 1)
    assert pool.lookup((1, 2), tokens) == hit


def test_blocks_are_cached_as_scheduled_not_when_the_request_ends() -> None:
    pool = BlockPool(100 * B, B)
    rb = RequestBlocks()
    assert pool.admit(rb, (1, 2, 3, 4), 0, 4 * B + 3, 4 * B + 3)
    pool.cache(rb, (1, 2, 3, 4), 2)  # the first chunk: two blocks
    assert pool.lookup((1, 2, 3, 4), 4 * B + 3) == 2  # another request hits them while this one runs
    pool.cache(rb, (1, 2, 3, 4), 4)
    assert pool.lookup((1, 2, 3, 4), 4 * B + 3) == 4


def test_held_blocks_are_shared_and_never_evicted() -> None:
    pool = BlockPool(4 * B, B)
    a = serve(pool, (1, 2), 2 * B + 1)
    b = serve(pool, (1, 2), 2 * B + 1)
    # the second shares both blocks: only its last token is its own
    assert pool.used_tokens == 2 * B + 2
    assert not pool.allocate(RequestBlocks(), 2 * B)  # no room: held blocks are not evicted
    pool.free(a)
    assert pool.holds(1) and pool.holds(2) and pool.cached_free_blocks == 0
    pool.free(b)
    assert pool.cached_free_blocks == 2 and pool.used_tokens == 0


def test_cached_free_blocks_count_as_free_and_an_allocation_evicts_them() -> None:
    heard = Heard()
    pool = BlockPool(4 * B, B, heard)
    run(pool, (1, 2, 3), 3 * B + 1)
    assert pool.free_tokens == 4 * B  # vLLM's usage counts cached free blocks as free
    # one uncached block's room is free: taken first, nothing evicted
    assert pool.allocate(RequestBlocks(), B)
    assert pool.cached_free_blocks == 3
    # the next block's room is a cached one's: the tail of the prompt goes first
    assert pool.allocate(RequestBlocks(), B)
    assert heard.events[-1] == ("removed", [3], None, 0)
    assert pool.lookup((1, 2, 3), 3 * B + 1) == 2


def test_a_prompt_is_evicted_from_its_tail_as_vllm_frees_it() -> None:
    pool = BlockPool(4 * B, B)
    run(pool, (1, 2, 3, 4), 4 * B)
    pool.fit(other_tokens=2 * B)
    assert pool.holds(1) and pool.holds(2) and not pool.holds(3) and not pool.holds(4)


def test_least_recently_freed_prompts_go_first() -> None:
    pool = BlockPool(3 * B, B)
    for h in (1, 2, 3):
        run(pool, (h,), B + 1)
    pool.fit(other_tokens=B)
    assert not pool.holds(1) and pool.holds(2) and pool.holds(3)


def test_a_hit_on_a_free_block_takes_its_room_back() -> None:
    # vLLM's touch: a cached free block a request hits leaves the free queue
    pool = BlockPool(3 * B, B)
    run(pool, (1, 2), 2 * B + 1)
    assert pool.admission_tokens((1, 2), 2, 1) == 2 * B + 1
    assert pool.admission_tokens((1, 2), 0, 2 * B + 1) == 2 * B + 1
    rb = RequestBlocks()
    assert not pool.admit(rb, (1, 2), 2, 1, 2 * B + 1, other_tokens=B)  # 2 blocks + 1 token + 1 block > 3
    assert pool.admit(rb, (1, 2), 2, 1, 2 * B + 1)
    assert pool.used_tokens == 2 * B + 1 and pool.hit_tokens == 2 * B


def test_a_block_computed_twice_at_once_is_kept_once() -> None:
    pool = BlockPool(100 * B, B)
    a, b = RequestBlocks(), RequestBlocks()
    assert pool.admit(a, (1, 2), 0, 2 * B + 1, 2 * B + 1)
    assert pool.admit(b, (1, 2), 0, 2 * B + 1, 2 * B + 1)  # both missed: neither had cached them yet
    pool.cache(a, (1, 2), 2)
    pool.cache(b, (1, 2), 2)
    assert pool.used_tokens == 2 * B + 2  # b shares a's copies and frees its own
    pool.free(a)
    pool.free(b)
    assert pool.used_tokens == 0 and pool.cached_free_blocks == 2


def test_events_name_each_new_run_with_its_parent() -> None:
    heard = Heard()
    pool = BlockPool(100 * B, B, heard)
    run(pool, (1, 2), 2 * B + 1)
    serve(pool, (1, 2, 3, 4), 4 * B + 1)  # hits 1 and 2, stores 3 and 4 chained on 2
    assert heard.events == [("stored", [1, 2], None, 0), ("stored", [3, 4], 2, 2)]


def test_clear_drops_every_hash_and_keeps_the_accounting() -> None:
    heard = Heard()
    pool = BlockPool(100 * B, B, heard)
    run(pool, (1, 2), 2 * B + 1)
    held = serve(pool, (1, 2, 3), 3 * B + 1)
    other = serve(pool, (1, 2, 3), 3 * B + 1)
    pool.clear()
    assert heard.events[-1][0] == "cleared"
    assert pool.lookup((1, 2, 3), 3 * B + 1) == 0 and pool.cached_blocks == 0
    pool.cache(held, (1, 2, 3), 3)  # a request admitted before the clear caches nothing more
    assert pool.cached_blocks == 0
    pool.free(held)
    pool.free(other)
    assert pool.used_tokens == 0


def test_a_cached_block_must_be_held() -> None:
    pool = BlockPool(100 * B, B)
    rb = RequestBlocks()
    assert pool.admit(rb, (1, 2), 0, B, 2 * B)
    with pytest.raises(RuntimeError):
        pool.cache(rb, (1, 2), 2)


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        BlockPool(0, B)
