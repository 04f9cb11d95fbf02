"""Chained block hashes: equal leading blocks give equal hashes, anything else differs."""

from __future__ import annotations

import numpy as np
import pytest

from calroute.routing.block_hash import block_hashes

B = 16


def test_two_prompts_share_exactly_their_common_full_blocks() -> None:
    rng = np.random.default_rng(0)
    a = rng.integers(0, 150_000, 8192).tolist()
    for common in (0, 15, 16, 17, 4000, 8191):
        b = a[:common] + [(t + 1) % 150_000 for t in a[common:]]
        ha, hb = block_hashes(a, B), block_hashes(b, B)
        shared = sum(1 for x, y in zip(ha, hb, strict=True) if x == y)
        assert shared == common // B and ha[: common // B] == hb[: common // B]


@pytest.mark.parametrize(
    ("tokens", "blocks"),
    [([], 0), (list(range(15)), 0), (list(range(16)), 1), (list(range(47)), 2)],
)
def test_only_full_blocks_are_hashed(tokens: list[int], blocks: int) -> None:
    assert len(block_hashes(tokens, B)) == blocks


def test_a_block_hash_depends_on_what_came_before_it() -> None:
    x, y = list(range(100, 116)), list(range(200, 216))
    assert block_hashes(x + y, B)[1] != block_hashes(y + y, B)[1]
    assert block_hashes(x + x, B)[0] != block_hashes(x + x, B)[1]  # same tokens, another position


def test_lists_and_arrays_hash_alike_and_hashes_spread() -> None:
    tokens = list(range(100_000))
    assert block_hashes(tokens, B) == block_hashes(np.array(tokens), B)
    assert len(set(block_hashes(tokens, B))) == 100_000 // B
    # a prompt longer than the precomputed tables hashes consistently with its shorter prefix
    long = np.random.default_rng(1).integers(0, 50_000, 8200 * B)
    assert block_hashes(long, B)[:100] == block_hashes(long[: 100 * B], B)


@pytest.mark.parametrize("bad", [[-1] * 16, [1.5] * 16, ["a"] * 16, [2**64] * 16])
def test_bad_token_ids_are_a_value_error(bad: list[object]) -> None:
    with pytest.raises(ValueError, match="token ids"):
        block_hashes(bad, B)  # type: ignore[arg-type]
