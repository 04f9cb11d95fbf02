"""vLLM's KV events (``--kv-events-config``) on the wire: the config, the events, a batch written and read.

vLLM (vllm/distributed/kv_events.py, ZmqEventPublisher) sends each engine step's events as one ZMQ PUB
message of three frames: the topic, an 8-byte big-endian sequence number counting from 0, and a msgpack
``EventBatch`` of ``BlockStored``, ``BlockRemoved`` and ``AllBlocksCleared`` (docs/prefix.md, "KV events on
the wire", has the layout and the vLLM commits it was read from).

Written (the emulator's publisher): the array layout (msgspec ``array_like=True``, what vLLM's own example
subscriber decodes). Read (the proxy's subscriber): msgspec's array layout or its map layout, as the
releases since the first (b4e69e0a) write them, decoded into operations on the prefix index. The fields
were checked against vLLM 0.32.0: BlockStored's block_hashes, parent_block_hash, token_ids, block_size,
lora_id, medium, lora_name, extra_keys, group_idx (and newer fields the reader ignores); BlockRemoved's
block_hashes, medium, group_idx. The reader trusts no byte: anything that is not such a batch is a
BadMessage with its kind.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

import msgpack

from calroute.contract.blocks import BLOCK_TOKENS
from calroute.errors import CalrouteError, ConfigError


@dataclass(frozen=True)
class BlockStored:
    """Blocks that became cached: a chain of full blocks, ``parent`` the block before the first (None: the
    prompt's first block), ``token_ids`` the tokens of all of them (as vLLM's event carries them)."""

    block_hashes: list[int]
    parent: int | None
    token_ids: list[int]


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: list[int]


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


MEDIUM_GPU = "GPU"  # vLLM's medium for blocks in device memory


@dataclass(frozen=True)
class KvEventsConfig:
    """vLLM's KVEventsConfig (vllm/config/kv_events.py): the same keys and defaults."""

    enable_kv_cache_events: bool = False
    publisher: str | None = None  # None: "zmq" when events are enabled, else "null" (as vLLM)
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    @property
    def enabled(self) -> bool:
        return self.enable_kv_cache_events and self.publisher in (None, "zmq")

    @classmethod
    def from_json(cls, text: str) -> KvEventsConfig:
        """Parse ``--kv-events-config``; a ConfigError names a bad or unknown key."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"--kv-events-config is not JSON: {e}") from e
        if not isinstance(raw, dict):
            raise ConfigError("--kv-events-config must be a JSON object")
        known = {f.name: f for f in fields(cls)}
        for key in raw:
            if key not in known:
                raise ConfigError(f"--kv-events-config: unknown key {key!r} (vLLM's are {sorted(known)})")
        cfg = cls(**raw)
        if not isinstance(cfg.enable_kv_cache_events, bool):
            raise ConfigError("--kv-events-config: enable_kv_cache_events must be true or false")
        if cfg.publisher not in (None, "null", "zmq"):
            raise ConfigError(f"--kv-events-config: publisher must be null or zmq, got {cfg.publisher!r}")
        if not isinstance(cfg.endpoint, str) or not cfg.endpoint.startswith(
            ("tcp://", "ipc://", "inproc://")
        ):
            raise ConfigError(f"--kv-events-config: endpoint must be a ZMQ address, got {cfg.endpoint!r}")
        if not isinstance(cfg.topic, str):
            raise ConfigError("--kv-events-config: topic must be a string")
        for name in ("hwm", "buffer_steps", "max_queue_size"):
            if not isinstance(getattr(cfg, name), int) or getattr(cfg, name) < 1:
                raise ConfigError(f"--kv-events-config: {name} must be a positive integer")
        if cfg.replay_endpoint is not None:
            # The replay ROUTER socket is not emulated: say so rather than accept and never answer.
            raise ConfigError("--kv-events-config: replay_endpoint is not emulated")
        return cfg


_TCP = re.compile(r"^tcp://(?P<host>[^:]+|\[[^\]]+\]):(?P<port>\d+|\*)$")


def binds(endpoint: str) -> bool:
    """vLLM's rule: the publisher binds an endpoint with a wildcard (or an ipc/inproc one) and connects to
    any other, where a subscriber is expected to bind."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def engine_endpoint(endpoint: str, index: int, host: str) -> str:
    """Engine ``index``'s endpoint in a process that runs several: the port offset by the index, as vLLM
    offsets it by the data-parallel rank (ZmqEventPublisher.offset_endpoint_port); a wildcard port (``*``)
    stays one (each engine binds a free port). A wildcard host (``*``) becomes ``host``: the emulator binds
    loopback only, where vLLM's default ``tcp://*:5557`` listens on every interface. Whether to bind or
    connect is decided on the endpoint as configured (``binds``), before this rewrite."""
    m = _TCP.match(endpoint)
    if m is None:
        return endpoint if index == 0 else f"{endpoint}_dp{index}"  # ipc:// and inproc://, as vLLM
    h = host if m["host"] in ("*", "[::]") else m["host"]
    port = m["port"] if m["port"] == "*" else str(int(m["port"]) + index)
    return f"tcp://{h}:{port}"


def encode_event(event: KvEvent) -> list[Any]:
    """One event as vLLM's msgspec writes a tagged ``array_like`` struct: the class name, then the fields
    in order. vLLM's msgspec writes every field of an array, defaults too; this stops after lora_name (the
    last field without a default): msgspec decoders give missing trailing fields their defaults and ignore
    extra ones, so releases before and after read it alike."""
    if isinstance(event, BlockStored):
        # block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name
        return ["BlockStored", event.block_hashes, event.parent, event.token_ids, BLOCK_TOKENS, None,
                MEDIUM_GPU, None]  # fmt: skip
    if isinstance(event, BlockRemoved):
        return ["BlockRemoved", event.block_hashes, MEDIUM_GPU]
    if isinstance(event, AllBlocksCleared):
        return ["AllBlocksCleared"]
    raise TypeError(f"not a KV event: {event!r}")


def encode_batch(events: Sequence[KvEvent], ts: float, data_parallel_rank: int = 0) -> bytes:
    """An EventBatch: [ts, events, data_parallel_rank] (vLLM's publisher always sets the rank)."""
    payload: bytes = msgpack.packb(
        [ts, [encode_event(e) for e in events], data_parallel_rank], use_bin_type=True
    )
    return payload


# ---- reading ------------------------------------------------------------------------------------------

_MASK64 = (1 << 64) - 1


class BadMessage(CalrouteError, ValueError):
    """An event message the subscriber will not apply; ``kind`` labels the error counter."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


class Op(NamedTuple):
    """An operation on the index: "stored" or "removed" with its block ids, or "cleared". A stored op keeps
    what translating vLLM's hashes needs (blocks.py), unchecked until then."""

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
    if f.get("medium") not in (None, MEDIUM_GPU):
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
    return decode_timed_batch(payload, max_bytes)[1]


def decode_timed_batch(payload: bytes, max_bytes: int) -> tuple[float | None, list[Op]]:
    """An EventBatch payload: its ``ts`` (the publisher's wall clock when it sent the batch; None when it is
    not a finite number) and its index operations, in order; BadMessage if it is not one."""
    if len(payload) > max_bytes:
        raise BadMessage("oversized", f"{len(payload)} bytes")
    try:
        # unpackb caps every string, array and map at the payload's own length (bounded above), so a
        # header claiming 2**32 elements fails instead of allocating.
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several types (ExtraData, FormatError, ValueError, ...)
        raise BadMessage("decode", f"{type(e).__name__}: {e}") from e
    if isinstance(batch, list) and len(batch) >= 2:
        ts, events = batch[0], batch[1]
    elif isinstance(batch, dict):
        ts, events = batch.get("ts"), batch.get("events")
    else:
        raise BadMessage("schema", "the batch is neither [ts, events, ...] nor {ts, events, ...}")
    if not isinstance(events, list):
        raise BadMessage("schema", "events is not a list")
    stamp = float(ts) if isinstance(ts, int | float) and not isinstance(ts, bool) else None
    if stamp is not None and not math.isfinite(stamp):
        stamp = None
    return stamp, [op for op in (_event(e) for e in events) if op is not None]
