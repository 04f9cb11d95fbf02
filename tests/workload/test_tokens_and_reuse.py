"""Prompt token ids from block ids (equal blocks, equal tokens) and the unbounded-cache reuse ceiling."""

from __future__ import annotations

import time

import numpy as np
import pytest

from calroute.errors import ConfigError
from calroute.types import PREFIX_BLOCK_TOKENS, RequestSpec, SloClass
from calroute.workload.prefix_families import generate_prefix_family
from calroute.workload.reuse import ReuseStats, unbounded_hit_ratio, unbounded_reuse
from calroute.workload.tokens import DEFAULT_VOCAB_SIZE, FIRST_TOKEN_ID, prompt_token_ids

BLOCK = PREFIX_BLOCK_TOKENS


def spec(
    request_id: str, prompt_tokens: int, blocks: tuple[int, ...] = (), arrival_s: float = 0.0
) -> RequestSpec:
    return RequestSpec(request_id, arrival_s, prompt_tokens, 8, SloClass.TIGHT, blocks)


def test_equal_blocks_equal_tokens_then_the_prompts_own() -> None:
    a = prompt_token_ids(spec("a", 3 * BLOCK + 100, (7, 8, 9)))
    b = prompt_token_ids(spec("b", 2 * BLOCK + 5, (7, 8)))
    c = prompt_token_ids(spec("c", 3 * BLOCK, (7, 8, 10)))
    assert len(a) == 3 * BLOCK + 100 and len(b) == 2 * BLOCK + 5 and len(c) == 3 * BLOCK
    assert a.dtype == np.int64
    np.testing.assert_array_equal(a[: 2 * BLOCK], b[: 2 * BLOCK])
    np.testing.assert_array_equal(a[: 2 * BLOCK], c[: 2 * BLOCK])
    # A different block, or the prompt's own tokens, differ from their first tokens on (16-token pages).
    assert not np.array_equal(a[2 * BLOCK : 2 * BLOCK + 16], c[2 * BLOCK : 2 * BLOCK + 16])
    assert not np.array_equal(a[2 * BLOCK : 2 * BLOCK + 5], b[2 * BLOCK :])
    # Deterministic, and the block's tokens do not depend on where else it is used.
    np.testing.assert_array_equal(prompt_token_ids(spec("a", 3 * BLOCK + 100, (7, 8, 9))), a)


def test_own_tokens_depend_on_request_and_seed() -> None:
    x = prompt_token_ids(spec("r000001", 64))
    assert not np.array_equal(x, prompt_token_ids(spec("r000002", 64)))
    assert not np.array_equal(x, prompt_token_ids(spec("r000001", 64), seed=1))
    np.testing.assert_array_equal(x, prompt_token_ids(spec("r000001", 64)))


def test_fixed_values_do_not_drift() -> None:
    # Pinned: a change here changes every live run's prompts with reuse (and their prefix-cache behaviour).
    r = spec("r000001", 2 * BLOCK + 4, (7, 2**64 - 1))
    for ids, want in (
        (prompt_token_ids(r), ([702, 605, 419, 798], [514, 80, 643, 386], [344, 455, 613, 896])),
        (
            prompt_token_ids(r, 151_643, seed=5),
            ([50899, 34096, 64115, 128119], [144512, 36119, 78212, 109228], [19286, 73165, 62779, 45855]),
        ),
    ):
        assert (ids[:4].tolist(), ids[BLOCK : BLOCK + 4].tolist(), ids[2 * BLOCK :].tolist()) == want


@pytest.mark.parametrize("vocab_size", [DEFAULT_VOCAB_SIZE, 4096, 151_643])
def test_token_range(vocab_size: int) -> None:
    ids = prompt_token_ids(spec("r", 4 * BLOCK + 300, (0, 1, 2**62, 2**64 - 1)), vocab_size)
    assert ids.min() >= FIRST_TOKEN_ID
    assert ids.max() < vocab_size
    # Spread over the range, not stuck on a few ids.
    assert len(np.unique(ids)) > min(vocab_size - FIRST_TOKEN_ID, len(ids)) * 0.5


def test_fast_for_long_prompts() -> None:
    long_prompt = spec("r", 16 * BLOCK + 200, tuple(range(10**6, 10**6 + 16)))
    start = time.perf_counter()
    for _ in range(100):
        prompt_token_ids(long_prompt)
    assert (time.perf_counter() - start) / 100 < 0.005


@pytest.mark.parametrize(
    ("prompt", "pattern"),
    [
        (spec("x", BLOCK - 1, (1,)), "do not fit"),
        (spec("x", 0), "at least 1 token"),
        (spec("x", BLOCK, (-1,)), "block ids"),
        (spec("x", BLOCK, (2**64,)), "block ids"),
    ],
)
def test_token_ids_refuse(prompt: RequestSpec, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        prompt_token_ids(prompt)
    with pytest.raises(ConfigError, match="vocab_size"):
        prompt_token_ids(spec("x", 10), vocab_size=FIRST_TOKEN_ID)


def test_unbounded_reuse_counts_leading_blocks_seen_before() -> None:
    reqs = [
        spec("late", 3 * BLOCK, (1, 2, 5), arrival_s=3.0),  # 1, 2 seen: 2 blocks
        spec("first", 2 * BLOCK + 10, (1, 2), arrival_s=1.0),  # nothing before it
        spec("diverges", 3 * BLOCK, (1, 3, 2), arrival_s=2.0),  # 1 seen, then a miss: 2 does not count
        spec("own", 100, (), arrival_s=4.0),
    ]
    stats = unbounded_reuse(reqs)
    assert stats == ReuseStats(requests=4, prompt_tokens=8 * BLOCK + 110, blocks=8, hit_blocks=3)
    assert stats.hit_ratio == pytest.approx(3 * BLOCK / (8 * BLOCK + 110))
    assert stats.block_hit_ratio == pytest.approx(3 / 8)
    assert unbounded_hit_ratio(reqs) == stats.hit_ratio
    assert unbounded_reuse([]).hit_ratio == 0.0 and unbounded_reuse([]).block_hit_ratio == 0.0


def test_families_without_blocks_reuse_nothing() -> None:
    from calroute.workload.families import generate_family

    assert unbounded_hit_ratio(generate_family("mixed-bursty", 2.0, 300, 0)) == 0.0


def test_generated_prompts_share_tokens_as_their_blocks_say() -> None:
    reqs = generate_prefix_family("shared-prefix", 2.0, 200, 0)
    by_prompt: dict[int, list[RequestSpec]] = {}
    for r in reqs:
        by_prompt.setdefault(r.prefix_blocks[0], []).append(r)
    a, b = next(group for group in by_prompt.values() if len(group) >= 2)[:2]
    shared = 0
    while shared < min(len(a.prefix_blocks), len(b.prefix_blocks)) and (
        a.prefix_blocks[shared] == b.prefix_blocks[shared]
    ):
        shared += 1
    assert shared >= 4  # a system prompt is 2,048 tokens at least
    ta, tb = prompt_token_ids(a), prompt_token_ids(b)
    np.testing.assert_array_equal(ta[: shared * BLOCK], tb[: shared * BLOCK])
    assert not np.array_equal(
        ta[shared * BLOCK : shared * BLOCK + 16], tb[shared * BLOCK : shared * BLOCK + 16]
    )
