"""The emulator's KV-event publisher: vLLM's ``--kv-events-config`` on vLLM's transport and wire format.

vLLM (vllm/distributed/kv_events.py, ZmqEventPublisher) sends each engine step's events as one ZMQ PUB
message of three frames: the topic, an 8-byte big-endian sequence number counting from 0, and a msgpack
``EventBatch``. docs/prefix.md ("KV events on the wire") has the layout and the vLLM commits it was read
from. The emulator writes the array layout (msgspec ``array_like=True``, what vLLM's own example subscriber
decodes), with block hashes as 64-bit integers (kvcache.block_hashes, routing/block_hash.py, not vLLM's
sha256: an index fed by the emulator only matches prompts hashed by the same function).

Sending happens on the engine's event loop: a PUB socket never blocks (past its high-water mark it drops,
as vLLM's does), so no thread is needed.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import msgpack
import zmq

from calroute.engines.kvcache import BLOCK_TOKENS, AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from calroute.errors import ConfigError

logger = logging.getLogger(__name__)

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


class ZmqPublisher:
    """One engine's PUB socket: bound at ``endpoint``, or connected to a subscriber bound there."""

    def __init__(self, endpoint: str, bind: bool, topic: str = "", hwm: int = 100_000) -> None:
        self._sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)
        self._sock.setsockopt(zmq.SNDHWM, hwm)
        self._sock.setsockopt(zmq.LINGER, 0)
        if bind:
            self._sock.bind(endpoint)
            # the address subscribers connect to (a wildcard port resolved)
            self.endpoint: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        else:
            self._sock.connect(endpoint)
            self.endpoint = endpoint
        self._topic = topic.encode()
        self._seq = 0
        self.dropped = 0

    def publish(self, events: Sequence[KvEvent]) -> None:
        if not events:
            return
        payload = encode_batch(events, time.time())
        try:
            self._sock.send_multipart([self._topic, self._seq.to_bytes(8, "big"), payload], zmq.NOBLOCK)
        except zmq.Again:
            # PUB drops at its high-water mark rather than block; counted, and the seq still advances so
            # subscribers see the gap.
            self.dropped += 1
        self._seq += 1

    def close(self) -> None:
        self._sock.close(linger=0)
