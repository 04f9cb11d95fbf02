"""Chained block hashes: equal leading blocks give equal hashes, anything else differs."""

from __future__ import annotations

import numpy as np
import pytest

from calroute.routing.block_hash import PromptBlocks, block_hashes, machine_token_ids, root_hash

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


def test_hashing_resumes_from_any_blocks_hash() -> None:
    tokens = np.random.default_rng(2).integers(0, 150_000, 40 * B).tolist()
    full = block_hashes(tokens, B)
    for k in (1, 7, 39):
        assert block_hashes(tokens[k * B :], B, parent=full[k - 1]) == full[k:]
    assert block_hashes(tokens, B, parent=root_hash(B)) == full


def test_the_block_size_is_part_of_every_hash() -> None:
    tokens = list(range(64))
    assert not set(block_hashes(tokens, 16)) & set(block_hashes(tokens, 32))
    with pytest.raises(ValueError, match="block_tokens"):
        block_hashes(tokens, 0)


@pytest.mark.parametrize("first", [1, 3, 64])
def test_prompt_blocks_hash_lazily_what_block_hashes_would(first: int) -> None:
    tokens = np.random.default_rng(3).integers(0, 150_000, 100 * B + 5).tolist()
    want = block_hashes(tokens, B)
    blocks = PromptBlocks(tokens, B, first_blocks=first)
    assert len(blocks) == 100 and blocks.hashed == 0
    assert blocks[0] == want[0] and blocks.hashed == min(first, 100)
    sizes = [len(part) for part in PromptBlocks(tokens, B, first_blocks=first).stretches()]
    assert sum(sizes) == 100 and sizes[: len(sizes) - 1] == [first * 2**i for i in range(len(sizes) - 1)]
    assert blocks[-1] == want[-1] and blocks[10:20] == want[10:20]
    assert list(blocks) == want == PromptBlocks(tokens, B, first).all()
    assert list(PromptBlocks(np.array(tokens), B)) == want


def test_a_bad_token_ends_a_prompts_blocks_where_its_stretch_begins() -> None:
    tokens = list(range(10 * B))
    tokens[7 * B + 3] = -1
    blocks = PromptBlocks(tokens, B, first_blocks=2)  # stretches of 2, 4 and 8 blocks: the third holds it
    assert list(blocks) == block_hashes(tokens[: 6 * B], B) and len(blocks) == 6
    with pytest.raises(IndexError):
        blocks[6]


def test_hashing_resumes_past_the_precomputed_tables() -> None:
    tokens = np.random.default_rng(3).integers(0, 50_000, 8300 * B)
    head = block_hashes(tokens[: 8190 * B], B)
    assert head + block_hashes(tokens[8190 * B :], B, parent=head[-1]) == block_hashes(tokens, B)


@pytest.mark.parametrize(
    ("ids", "machine"),
    [
        ([5, 0, 1, 150_000], [5, 0, 1, 150_000]),
        ([0, 2**64 - 1], [0, 2**64 - 1]),
        ([3, -1], None),  # negative: not a token id (the proxy's loop lets the engine refuse it)
        ([1, True], None),  # JSON's true is not a token id, though it converts as 1
        ([False], None),
        ([3, 2.0], None),
        ([3, "4"], None),
        ([3, None], None),
        ([2**64], None),  # past 64 bits: not a machine integer
        ([], None),
        ("12", None),
        ((1, 2), None),  # a JSON array is a list
    ],
)
def test_machine_token_ids_take_json_integers_only(ids: object, machine: list[int] | None) -> None:
    out = machine_token_ids(ids)
    assert (None if out is None else out.tolist()) == machine


def test_a_machine_prompt_hashes_as_its_list_does() -> None:
    ids = [int(x) for x in np.random.default_rng(3).integers(0, 150_000, 1000)]
    machine = machine_token_ids(ids)
    assert machine is not None
    assert PromptBlocks(machine, 16).all() == block_hashes(ids, 16)
    # a negative id ends the blocks where its stretch begins, in a list or a signed array alike: here
    # blocks 1-2 are the second stretch
    bad_list = [*ids[:40], -1, *ids[41:]]
    blocks = PromptBlocks(np.array(bad_list, dtype=np.int64), 16, first_blocks=1)
    assert blocks.all() == PromptBlocks(bad_list, 16, first_blocks=1).all()
    assert len(blocks) == 1
