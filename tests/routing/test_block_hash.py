"""Chained block hashes: equal leading blocks give equal hashes, anything else differs."""

from __future__ import annotations

import numpy as np
import pytest

from calroute.routing.block_hash import ChainLink, block_hashes, extend_chain

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


@pytest.mark.parametrize("block_tokens", [16, 128])
@pytest.mark.parametrize("split", [0, 1, 3, 40])
def test_a_chain_extended_from_a_link_hashes_as_the_whole_prompt(block_tokens: int, split: int) -> None:
    tokens = np.random.default_rng(2).integers(0, 150_000, 64 * block_tokens + 5).tolist()
    head = extend_chain(None, tokens[: split * block_tokens], block_tokens)
    assert len(head) == split and all(link.blocks == i + 1 for i, link in enumerate(head))
    tail = extend_chain(head[-1] if head else None, tokens[split * block_tokens :], block_tokens)
    assert [link.block_hash for link in head + tail] == block_hashes(tokens, block_tokens)
    # a link carries everything its children need: rebuilt from its fields, it chains the same
    rebuilt = ChainLink(*head[-1]) if head else None
    assert extend_chain(rebuilt, tokens[split * block_tokens :], block_tokens) == tail


def test_a_chain_extended_past_the_precomputed_tables() -> None:
    tokens = np.random.default_rng(3).integers(0, 50_000, 8300 * B)
    head = extend_chain(None, tokens[: 8190 * B], B)
    tail = extend_chain(head[-1], tokens[8190 * B :], B)
    assert [link.block_hash for link in head + tail] == block_hashes(tokens, B)


def test_extending_a_chain_checks_token_ids() -> None:
    with pytest.raises(ValueError, match="token ids"):
        extend_chain(None, [-1] * B, B)
    assert extend_chain(None, [1] * (B - 1), B) == []
