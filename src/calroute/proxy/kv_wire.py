"""vLLM's KV events on the wire, read (docs/prefix.md, "KV events on the wire"): a msgpack ``EventBatch``
of ``BlockStored``, ``BlockRemoved`` and ``AllBlocksCleared``, in msgspec's array layout or its map layout,
as the releases since the first (b4e69e0a) write them, decoded into operations on the prefix index. The
fields were checked against vLLM 0.32.0 (vllm/distributed/kv_events.py): BlockStored's block_hashes,
parent_block_hash, token_ids, block_size, lora_id, medium, lora_name, extra_keys, group_idx (and newer
fields this reader ignores); BlockRemoved's block_hashes, medium, group_idx. Nothing here trusts the bytes:
anything that is not such a batch is a BadMessage with its kind."""

from __future__ import annotations

from typing import Any, NamedTuple

import msgpack

from calroute.errors import CalrouteError

_MASK64 = (1 << 64) - 1


class BadMessage(CalrouteError, ValueError):
    """An event message the subscriber will not apply; ``kind`` labels the error counter."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


class Op(NamedTuple):
    """An operation on the index: "stored" or "removed" with its block ids, or "cleared". A stored op keeps
    what translating vLLM's hashes needs (vllm_blocks.py), unchecked until then."""

    kind: str
    blocks: list[int]
    parent: int | None = None
    token_ids: Any = None
    block_size: Any = None
    plain_blocks: int | None = None  # leading blocks hashed on their tokens alone (None: all)


# vLLM's msgspec array layout: the fields after the tag, in order (older releases stop earlier, newer ones
# add more at the end).
_ARRAY_FIELDS: dict[str, tuple[str, ...]] = {
    "BlockStored": (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "extra_keys",
        "group_idx",
    ),
    "BlockRemoved": ("block_hashes", "medium", "group_idx"),
}


def _block_id(h: Any) -> int:
    """A wire block hash as the index keys it: ints as they are (to 64 bits), bytes folded to their low 64
    bits read big-endian, as vLLM's maybe_convert_block_hash makes its ints, so both forms agree."""
    if isinstance(h, bool):
        raise BadMessage("schema", "a block hash is a bool")
    if isinstance(h, int):
        return h & _MASK64
    if isinstance(h, bytes):
        return int.from_bytes(h, "big") & _MASK64
    raise BadMessage("schema", f"a block hash is a {type(h).__name__}")


def _hashes(v: Any) -> list[int]:
    if not isinstance(v, list):
        raise BadMessage("schema", "block_hashes is not a list")
    return [_block_id(h) for h in v]


def _plain_blocks(f: dict[str, Any]) -> int | None:
    """How many leading blocks of a BlockStored vLLM hashed on their tokens alone (None: all of them)."""
    if f.get("lora_id") is not None or f.get("lora_name") is not None:
        return 0
    extra = f.get("extra_keys")
    if extra is None:
        return None
    if not isinstance(extra, list):
        raise BadMessage("schema", "extra_keys is not a list")
    return next((i for i, keys in enumerate(extra) if keys is not None), None)


def _event(ev: Any) -> Op | None:
    """One event, array layout ([tag, fields...]) or map layout ({"type": tag, ...}); None for a tag this
    subscriber does not know (a newer vLLM's event: skipped, not an error)."""
    if isinstance(ev, list) and ev and isinstance(ev[0], str):
        tag = ev[0]
        f = dict(zip(_ARRAY_FIELDS.get(tag, ()), ev[1:], strict=False))
    elif isinstance(ev, dict) and isinstance(ev.get("type"), str):
        tag, f = ev["type"], ev
    else:
        raise BadMessage("schema", "an event is neither [tag, ...] nor {type: tag, ...}")
    if tag == "AllBlocksCleared":
        return Op("cleared", [])
    if tag not in _ARRAY_FIELDS:
        return None
    if f.get("medium") not in (None, "GPU"):
        return None  # blocks offloaded to another tier: the router prices device hits only
    if f.get("group_idx") not in (None, 0):
        return None  # another KV cache group of a hybrid model: the index follows the first
    blocks = _hashes(f.get("block_hashes"))
    if tag == "BlockRemoved":
        return Op("removed", blocks)
    parent = f.get("parent_block_hash")
    return Op(
        "stored",
        blocks,
        None if parent is None else _block_id(parent),
        f.get("token_ids"),
        f.get("block_size"),
        _plain_blocks(f),
    )


def decode_batch(payload: bytes, max_bytes: int) -> list[Op]:
    """An EventBatch payload as index operations, in order; BadMessage if it is not one."""
    if len(payload) > max_bytes:
        raise BadMessage("oversized", f"{len(payload)} bytes")
    try:
        # unpackb caps every string, array and map at the payload's own length (bounded above), so a
        # header claiming 2**32 elements fails instead of allocating.
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several types (ExtraData, FormatError, ValueError, ...)
        raise BadMessage("decode", f"{type(e).__name__}: {e}") from e
    if isinstance(batch, list) and len(batch) >= 2:
        events = batch[1]
    elif isinstance(batch, dict):
        events = batch.get("events")
    else:
        raise BadMessage("schema", "the batch is neither [ts, events, ...] nor {ts, events, ...}")
    if not isinstance(events, list):
        raise BadMessage("schema", "events is not a list")
    return [op for op in (_event(e) for e in events) if op is not None]
