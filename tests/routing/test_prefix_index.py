"""The router's prefix index: longest leading runs, LRU bounds, and the two sources' events."""

from __future__ import annotations

import numpy as np
import pytest

from calroute.errors import ConfigError
from calroute.routing.block_hash import PromptBlocks, block_hashes
from calroute.routing.prefix_index import PrefixIndex
from calroute.types import InstanceSpec, Role

B = 16


def index(capacity_blocks: int = 100, n: int = 3) -> PrefixIndex:
    return PrefixIndex(
        [InstanceSpec(f"e{i}", Role.PREFILL, capacity_blocks * B) for i in range(n)], block_tokens=B
    )


@pytest.mark.parametrize(
    ("held", "blocks", "expected"),
    [
        ({}, (1, 2, 3), {}),
        ({"e0": (1, 2, 3)}, (1, 2, 3), {"e0": 3 * B}),
        ({"e0": (1, 2, 3)}, (1, 2, 3, 4, 5), {"e0": 3 * B}),
        ({"e0": (1, 2)}, (1, 2, 3), {"e0": 2 * B}),
        # a hit is a *leading* run: holding later blocks without the first is no hit
        ({"e0": (2, 3)}, (1, 2, 3), {}),
        ({"e0": (1, 3)}, (1, 2, 3), {"e0": B}),
        ({"e0": (1, 2, 3), "e1": (1,), "e2": (1, 2)}, (1, 2, 3), {"e0": 3 * B, "e1": B, "e2": 2 * B}),
        ({"e1": (1, 2), "e2": (9,)}, (1, 2), {"e1": 2 * B}),
        ({"e0": (1, 2)}, (), {}),
    ],
)
def test_match_is_the_longest_leading_run_per_engine(
    held: dict[str, tuple[int, ...]], blocks: tuple[int, ...], expected: dict[str, int]
) -> None:
    ix = index()
    for iid, bs in held.items():
        ix.stored(iid, bs)
    assert ix.match(blocks) == expected


def test_lru_bound_ages_the_oldest_blocks_out() -> None:
    ix = index(capacity_blocks=4)
    ix.placed("e0", (1, 2, 3))
    ix.placed("e0", (1, 7))  # touches 1: now 2 is the oldest
    ix.placed("e0", (8, 9))
    assert ix.blocks_held("e0") == 4
    assert ix.match((1,)) == {"e0": B}
    assert ix.match((1, 2)) == {"e0": B}  # 2 and 3 aged out
    assert len(ix) == 4


def test_a_flood_of_stored_events_stays_bounded() -> None:
    ix = index(capacity_blocks=50, n=2)
    ix.stored("e0", range(1_000_000, 1_100_000))
    assert ix.blocks_held("e0") == 50 and len(ix) == 50


def test_removed_and_cleared_forget_only_that_engine() -> None:
    ix = index()
    ix.stored("e0", (1, 2, 3))
    ix.stored("e1", (1, 2, 3))
    ix.removed("e0", (2, 99))  # 99 unknown: ignored
    assert ix.match((1, 2, 3)) == {"e0": B, "e1": 3 * B}
    ix.cleared("e1")
    assert ix.match((1, 2, 3)) == {"e0": B}
    ix.cleared("e0")
    assert ix.match((1,)) == {} and len(ix) == 0


def test_block_size_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="block size"):
        PrefixIndex([], block_tokens=0)


def test_the_evicted_reuse_ratio_counts_evictions_wanted_back() -> None:
    ix = index(capacity_blocks=4, n=2)
    assert ix.reuse_ratio("e0") == 0.0  # nothing evicted yet: no evidence
    ix.placed("e0", (1, 2, 3, 4))
    ix.placed("e0", (5, 6))  # evicts 4 and 3, the first prompt's tail
    assert ix.reuse_ratio("e0") == 0.0
    ix.placed("e0", (4,))  # 4 wanted back (and 2 evicted): one regret in three evictions
    assert ix.reuse_ratio("e0") == pytest.approx(1 / 3, rel=0.2)
    ix.placed("e1", (3,))  # wanted again, but on another engine: e0 is not charged
    assert ix.reuse_ratio("e0") == pytest.approx(1 / 3, rel=0.2) and ix.reuse_ratio("e1") == 0.0
    # a stream of blocks never seen again drives it down
    ix.placed("e0", range(100, 200))
    assert ix.reuse_ratio("e0") < 0.05


def test_a_prompt_ages_out_from_its_tail_as_vllm_frees_it() -> None:
    # vLLM frees a request's blocks last first, so under pressure a cached prompt keeps its head: what is
    # left of it still hits. Evicting the first block would leave blocks that no prompt can reach.
    ix = index(capacity_blocks=6, n=1)
    ix.placed("e0", (1, 2, 3, 4))
    ix.placed("e0", (7, 8, 9))  # one block over: the first prompt's last block goes
    assert ix.match((1, 2, 3, 4)) == {"e0": 3 * B}
    assert ix.match((7, 8, 9)) == {"e0": 3 * B}
    ix.placed("e0", (10, 11))  # two more: 3 and 2 go, the older prompt's head stays
    assert ix.match((1, 2, 3, 4)) == {"e0": B}
    assert ix.match((7, 8, 9)) == {"e0": 3 * B}


def test_removed_events_count_as_evictions_too() -> None:
    ix = index(capacity_blocks=10, n=1)
    ix.stored("e0", (1, 2))
    ix.removed("e0", (1, 2))
    ix.stored("e0", (1,))
    assert ix.reuse_ratio("e0") == pytest.approx(0.5, rel=0.2)


@pytest.mark.parametrize("seed", range(6))
def test_match_agrees_with_a_block_by_block_walk(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = [3, 70][seed % 2]  # a mask past 64 bits too
    ix = index(capacity_blocks=60, n=n)  # no engine is given more than 60 blocks: none evicts
    prompt = list(range(1000, 1050))
    held: dict[str, set[int]] = {}
    for i in range(n):
        if rng.random() < 0.8:  # a leading share of the prompt, perhaps with holes, and other blocks
            share = [b for b in prompt[: rng.integers(0, 50)] if rng.random() < 0.97]
            others = rng.integers(0, 2000, 10).tolist()
            ix.stored(f"e{i}", share + others)
            held[f"e{i}"] = set(share) | set(others)
    for blocks in (prompt, prompt[:7], prompt[3:], []):
        want = {}
        for iid, bs in held.items():
            run = next((k for k, b in enumerate(blocks) if b not in bs), len(blocks))
            if run:
                want[iid] = run * B
        assert ix.match(blocks) == want == ix.match(tuple(blocks))


def test_a_lazy_prompt_is_hashed_only_as_far_as_some_engine_holds_it() -> None:
    tokens = list(range(200 * B))
    hashes = block_hashes(tokens, B)
    ix = index(capacity_blocks=300)
    ix.stored("e0", hashes[:3])
    ix.stored("e1", hashes[:40])
    blocks = PromptBlocks(tokens, B, first_blocks=16)
    assert ix.match(blocks) == {"e0": 3 * B, "e1": 40 * B} == ix.match(hashes)
    assert blocks.hashed == 16 + 32  # the stretch with block 40 (nobody's) ends the walk
    ix.stored("e2", hashes)
    assert ix.match(PromptBlocks(tokens, B, first_blocks=16)) == {"e0": 3 * B, "e1": 40 * B, "e2": 200 * B}
    assert ix.match(PromptBlocks([], B)) == {}


@pytest.mark.parametrize("seed", range(4))
def test_a_lazy_match_over_a_wide_pool_agrees_with_a_block_by_block_walk(seed: int) -> None:
    # 70 engines: the running set starts past a machine word and, once the engines numbered 64 and up have
    # left it in the first stretches, fits one, while the holders of later blocks still name them
    rng = np.random.default_rng(seed)
    n, blocks_n = 70, 120
    tokens = rng.integers(0, 150_000, blocks_n * B).tolist()
    hashes = block_hashes(tokens, B)
    ix = index(capacity_blocks=200, n=n)
    held: dict[str, set[int]] = {}
    for i in range(n):
        top = int(rng.integers(0, 4)) if i >= 64 else int(rng.integers(0, blocks_n + 1))
        share = [h for h in hashes[:top] if rng.random() < 0.98]
        if i >= 64:
            share += hashes[60:90]  # later blocks without the head: no hit there
        ix.stored(f"e{i}", share)
        held[f"e{i}"] = set(share)
    want = {}
    for iid, bs in held.items():
        run = next((k for k, h in enumerate(hashes) if h not in bs), blocks_n)
        if run:
            want[iid] = run * B
    for first in (1, 2, 5, 64):
        assert ix.match(PromptBlocks(tokens, B, first_blocks=first)) == want
    assert ix.match(hashes) == want
