"""Decoding vLLM's KV-event batches: every layout vLLM writes, what a translation needs, and bounds."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from calroute.contract.kv_events import BadMessage, Op, decode_batch


def _ops(batch: Any) -> list[tuple[str, list[int]]]:
    return [(op.kind, op.blocks) for op in decode_batch(msgpack.packb(batch, use_bin_type=True), 10_000)]


def test_decode_batch_bounds() -> None:
    with pytest.raises(BadMessage, match="bytes"):
        decode_batch(b"\x90" * 100, max_bytes=10)
    with pytest.raises(BadMessage):
        decode_batch(msgpack.packb([1.0, [["BlockStored", [True]]]]), max_bytes=1000)
    with pytest.raises(BadMessage):
        decode_batch(msgpack.packb([[[[[]]]]] * 3), max_bytes=1000)
    assert _ops([1.0, [["BlockStored", [-1]]], 0]) == [("stored", [2**64 - 1])]


def test_decode_batch_reads_every_vllm_layout() -> None:
    """The payloads vLLM's msgspec writes (these literals pack to the same bytes as msgspec 0.23's encoder
    given vLLM's structs; checked when written): all arrays with every field (msgspec's array_like keeps
    defaults), an array batch of map events (what vLLM 0.32.0 writes: its events are tagged structs that
    are not array_like, and omit their defaults), all maps."""
    top, digest = 2**64 - 1, b"\x01" * 32
    folded = int.from_bytes(digest, "big") & (2**64 - 1)
    stored_array = ["BlockStored", [top, digest], None, [5] * 32, 16, None, "GPU", None, None, 0, None, None]
    arrays = [1.0, [stored_array, ["BlockRemoved", [7], "GPU", 0], ["AllBlocksCleared"]], 0]
    stored = {
        "type": "BlockStored",
        "block_hashes": [top, digest],
        "parent_block_hash": None,
        "token_ids": [5] * 32,
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "group_idx": 0,
    }
    removed = {"type": "BlockRemoved", "block_hashes": [7], "medium": "GPU", "group_idx": 0}
    cleared = {"type": "AllBlocksCleared"}
    mixed = [1.0, [stored, removed, cleared], 0]
    maps = {"ts": 1.0, "events": [stored, removed, cleared], "data_parallel_rank": 0}
    oldest = [1.0, [["BlockStored", [3], 2, [5] * 16, 16, None], ["BlockRemoved", [3]]]]  # b4e69e0a
    want = [("stored", [top, folded]), ("removed", [7]), ("cleared", [])]
    for batch in (arrays, mixed, maps):
        assert _ops(batch) == want
        # what a translation needs rides along with a stored op
        first = decode_batch(msgpack.packb(batch, use_bin_type=True), 10_000)[0]
        assert first == Op("stored", [top, folded], None, [5] * 32, 16, None)
    assert _ops(oldest) == [("stored", [3]), ("removed", [3])]
    assert decode_batch(msgpack.packb(oldest), 10_000)[0].parent == 2


def _stored(**fields: Any) -> Any:
    return [1.0, [{"type": "BlockStored", "block_hashes": [1, 2, 3], "medium": "GPU", **fields}], 0]


@pytest.mark.parametrize(
    ("fields", "plain"),
    [
        ({}, None),
        ({"extra_keys": None}, None),
        ({"extra_keys": [None, None, None]}, None),  # vLLM writes a list of Nones for blocks without keys
        ({"extra_keys": [None, ["salt"], None]}, 1),
        ({"extra_keys": [["salt"], None, None]}, 0),  # vLLM puts a cache salt on the first block only
        ({"lora_name": "adapter"}, 0),
        ({"lora_id": 1}, 0),
    ],
)
def test_blocks_hashed_on_more_than_tokens_are_marked(fields: dict[str, Any], plain: int | None) -> None:
    (op,) = decode_batch(msgpack.packb(_stored(**fields)), 10_000)
    assert op.plain_blocks == plain


def test_other_kv_cache_groups_and_tiers_are_skipped_and_bad_fields_are_errors() -> None:
    assert _ops(_stored(group_idx=1)) == []
    assert _ops(_stored(medium="CPU")) == []
    assert _ops(_stored(group_idx=0)) == [("stored", [1, 2, 3])]
    with pytest.raises(BadMessage, match="extra_keys"):
        decode_batch(msgpack.packb(_stored(extra_keys="salt")), 10_000)
    with pytest.raises(BadMessage, match="block hash"):
        decode_batch(msgpack.packb(_stored(parent_block_hash=[1])), 10_000)
