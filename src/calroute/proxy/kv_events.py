"""The precise source of the router's prefix index: the engines' KV events (docs/prefix.md, "KV events on
the wire"), one ZMQ SUB socket per engine.

Each engine's stream is either **live**, and then its view in the index comes from its events only, or
**stale**, and then the router records its own placements for it (the approximate source), as it does for
engines without a stream. A stream goes stale when its connection drops (a closed socket, or a peer that
stops answering ZMQ heartbeats), when it sends ``garbage_limit`` bad messages in a row, or when it stays
silent ``silence_timeout_s`` after the proxy saw the engine finish a prompt with blocks the index did not
have (an idle engine publishes nothing, so silence alone proves nothing). It is live again on (re)connection
or on its next good message, with the engine's view cleared: events were missed meanwhile. A seq gap or an
undecodable message also clears the view (the events they stood for are lost); vLLM's replay socket is not
used.

Every read is bounded: a message part over ``max_message_bytes`` makes libzmq drop the connection (it
reconnects; counted as a disconnect), at most ``max_queued_messages`` wait per socket (past that libzmq drops
and the seq gap shows it), a tick reads at most ``max_messages_per_tick`` per engine, and decoding has
msgpack's size limits. Nothing an engine sends can raise out of here: it is counted in
``calroute_kv_events_errors_total{engine, kind}`` and skipped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import zmq
from prometheus_client import CollectorRegistry, Counter, Gauge
from zmq.utils.monitor import recv_monitor_message

from calroute.errors import CalrouteError
from calroute.routing.prefix_index import PrefixIndex
from calroute.types import InstanceSpec

logger = logging.getLogger(__name__)

_MASK64 = (1 << 64) - 1
# A message is [topic, seq, payload]: more parts than this are garbage (and read no further than needed).
_PARTS = 3


class PreciseIndex(PrefixIndex):
    """The router's prefix index with both sources: the router's placements count only for engines whose
    event stream is not live (``live``); a live engine's view is what its events say. (A subclass, so the
    index's own semantics stay as they are.)"""

    def __init__(self, instances: Sequence[InstanceSpec], block_tokens: int) -> None:
        super().__init__(instances, block_tokens)
        self.live: set[str] = set()

    def placed(self, instance_id: str, blocks: Iterable[int]) -> None:
        if instance_id not in self.live:
            super().placed(instance_id, blocks)


class BadMessage(CalrouteError, ValueError):
    """An event message the subscriber will not apply; ``kind`` labels the error counter."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


# An operation on the index: ("stored" | "removed", block ids) or ("cleared", []).
Op = tuple[str, list[int]]


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


def _event(ev: Any) -> Op | None:
    """One event, array layout ([tag, fields...]) or map layout ({"type": tag, ...}); None for a tag this
    subscriber does not know (a newer vLLM's event: skipped, not an error)."""
    if isinstance(ev, list) and ev and isinstance(ev[0], str):
        tag, fields = ev[0], ev[1:]
        first = fields[0] if fields else None
        medium = fields[5] if tag == "BlockStored" and len(fields) > 5 else None
        if tag == "BlockRemoved" and len(fields) > 1:
            medium = fields[1]
    elif isinstance(ev, dict) and isinstance(ev.get("type"), str):
        tag, first, medium = ev["type"], ev.get("block_hashes"), ev.get("medium")
    else:
        raise BadMessage("schema", "an event is neither [tag, ...] nor {type: tag, ...}")
    if tag == "AllBlocksCleared":
        return ("cleared", [])
    if tag not in ("BlockStored", "BlockRemoved"):
        return None
    if medium not in (None, "GPU"):
        return None  # blocks offloaded to another tier: the router prices device hits only
    return ("stored" if tag == "BlockStored" else "removed", _hashes(first))


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


@dataclass
class _Stream:
    engine_id: str
    endpoint: str
    sock: zmq.Socket[bytes]
    monitor: zmq.Socket[bytes]
    connected: bool = False
    last_seq: int | None = None
    bad_streak: int = 0
    expect_since_s: float | None = None  # events are owed since then (see expect)
    reopen_at_s: float | None = None  # disconnected: a fresh socket then, if libzmq has not reconnected


class KvEventSubscriber:
    """Feeds ``index`` from the engines' event streams (``endpoints``: engine id -> ZMQ address)."""

    def __init__(
        self,
        endpoints: Mapping[str, str],
        index: PreciseIndex,
        registry: CollectorRegistry,
        now: Callable[[], float],
        *,
        max_message_bytes: int = 4 * 1024 * 1024,
        max_queued_messages: int = 32,
        max_messages_per_tick: int = 64,
        silence_timeout_s: float = 5.0,
        garbage_limit: int = 3,
        poll_interval_s: float = 0.01,
        heartbeat_s: float = 1.0,
        reopen_after_s: float = 1.0,
    ) -> None:
        self.index = index
        self._now = now
        self.max_message_bytes = max_message_bytes
        self.max_queued_messages = max_queued_messages
        self.max_messages_per_tick = max_messages_per_tick
        self.silence_timeout_s = silence_timeout_s
        self.garbage_limit = garbage_limit
        self.poll_interval_s = poll_interval_s
        self.heartbeat_s = heartbeat_s
        self.reopen_after_s = reopen_after_s
        self._endpoints = dict(endpoints)
        self._streams: dict[str, _Stream] = {}
        self._task: asyncio.Task[None] | None = None
        self.live_gauge = Gauge(
            "calroute_kv_events_live",
            "1 while the engine's KV event stream is live (its prefix view comes from its events), 0 while "
            "it is stale and the router's own placements stand in.",
            ["engine"],
            registry=registry,
        )
        self.messages = Counter(
            "calroute_kv_events_messages", "KV event batches applied.", ["engine"], registry=registry
        )
        self.errors = Counter(
            "calroute_kv_events_errors",
            "KV event stream troubles, by kind: decode (not msgpack), schema (not an EventBatch), frames "
            "(not [topic, seq, payload]), gap (seq skipped: events lost), disconnect (also a message over "
            "the size cap: libzmq drops its connection), silent (no events where some were owed).",
            ["engine", "kind"],
            registry=registry,
        )
        for engine_id in self._endpoints:
            self.live_gauge.labels(engine_id).set(0)

    # ---- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        for engine_id, endpoint in self._endpoints.items():
            sock, monitor = self._open(endpoint)
            self._streams[engine_id] = _Stream(engine_id, endpoint, sock, monitor)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="kv-events")

    def _open(self, endpoint: str) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes]]:
        sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        sock.setsockopt(zmq.RCVHWM, self.max_queued_messages)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 5000)
        # ZMTP heartbeats: a peer that stops answering (a hung process) drops the connection.
        ivl_ms = int(self.heartbeat_s * 1000)
        sock.setsockopt(zmq.HEARTBEAT_IVL, ivl_ms)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * ivl_ms)
        sock.setsockopt(zmq.SUBSCRIBE, b"")  # one socket per engine: every topic on it is the engine's
        # Live on a finished ZMTP handshake, not on a TCP connection: whatever listens there must speak ZMQ.
        monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        sock.connect(endpoint)
        return sock, monitor

    @staticmethod
    def _close(s: _Stream) -> None:
        s.sock.disable_monitor()
        s.monitor.close(linger=0)
        s.sock.close(linger=0)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        for s in self._streams.values():
            self._close(s)
        self._streams.clear()

    def is_live(self, engine_id: str) -> bool:
        return engine_id in self.index.live

    def expect(self, engine_id: str) -> None:
        """The engine just finished a prompt with blocks the index did not have: it owes a BlockStored.
        Without one (or any message) within ``silence_timeout_s`` its stream counts as stale."""
        s = self._streams.get(engine_id)
        if s is not None and s.expect_since_s is None:
            s.expect_since_s = self._now()

    # ---- the loop -----------------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            for s in self._streams.values():
                try:
                    self.tick(s)
                except Exception:  # never let one stream's trouble stop the others' (or the proxy)
                    logger.exception("KV events of %s: unexpected error", s.engine_id)
            await asyncio.sleep(self.poll_interval_s)

    def tick(self, s: _Stream) -> None:
        if s.reopen_at_s is not None and self._now() >= s.reopen_at_s:
            # libzmq reconnects by itself after a closed connection, not after one it dropped for a
            # protocol error (a message over MAXMSGSIZE): a new socket covers both.
            self._close(s)
            s.sock, s.monitor = self._open(s.endpoint)
            s.reopen_at_s = self._now() + self.reopen_after_s
        self._read_monitor(s)
        for _ in range(self.max_messages_per_tick):
            parts = self._recv(s)
            if parts is None:
                break
            self._handle(s, parts)
        if (
            s.expect_since_s is not None
            and self.is_live(s.engine_id)
            and self._now() - s.expect_since_s > self.silence_timeout_s
        ):
            self.errors.labels(s.engine_id, "silent").inc()
            s.expect_since_s = None
            self._stale(s, f"no KV events {self.silence_timeout_s:g} s after a prompt it had to cache")

    def _read_monitor(self, s: _Stream) -> None:
        while s.monitor.poll(0):
            try:
                event = recv_monitor_message(s.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                s.connected = True
                s.reopen_at_s = None
                s.last_seq = None  # a new connection: whatever came before is gone
                s.bad_streak = 0
                self._live(s, "connected")
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                s.connected = False
                s.reopen_at_s = self._now() + self.reopen_after_s
                self.errors.labels(s.engine_id, "disconnect").inc()
                self._stale(s, "disconnected")

    def _recv(self, s: _Stream) -> list[bytes] | None:
        """One message's parts (at most _PARTS kept; the rest read and dropped), None if none waits."""
        try:
            first = s.sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            return None
        parts = [first]
        while s.sock.getsockopt(zmq.RCVMORE):
            part = s.sock.recv()  # the rest of a message arrives with its first part: this never waits
            if len(parts) <= _PARTS:
                parts.append(part)
        return parts

    def _handle(self, s: _Stream, parts: list[bytes]) -> None:
        seq: int | None = None
        try:
            if len(parts) != _PARTS or len(parts[1]) != 8:
                raise BadMessage("frames", f"{len(parts)} parts")
            seq = int.from_bytes(parts[1], "big")
            ops = decode_batch(parts[2], self.max_message_bytes)
        except BadMessage as e:
            self._bad(s, e, seq)
            return
        s.bad_streak = 0
        s.expect_since_s = None
        if not self.is_live(s.engine_id):
            # Messages still queued from a connection that has dropped are true but do not make the stream
            # live: the reconnection does (clearing the view, as events are missed in between).
            if s.connected:
                self._live(s, "events resumed")
        elif s.last_seq is not None and seq != s.last_seq + 1:
            # Lost (or replayed, or a restarted publisher's) batches: what the view holds is unknown.
            self.errors.labels(s.engine_id, "gap").inc()
            logger.warning("KV events of %s: seq %d after %d, view cleared", s.engine_id, seq, s.last_seq)
            self.index.cleared(s.engine_id)
        s.last_seq = seq
        self._apply(s.engine_id, ops)
        self.messages.labels(s.engine_id).inc()

    def _apply(self, engine_id: str, ops: list[Op]) -> None:
        index = self.index
        for op, blocks in ops:
            if op == "stored":
                index.stored(engine_id, blocks)
            elif op == "removed":
                index.removed(engine_id, blocks)
            else:
                index.cleared(engine_id)

    def _bad(self, s: _Stream, e: BadMessage, seq: int | None) -> None:
        self.errors.labels(s.engine_id, e.kind).inc()
        if seq is not None:
            s.last_seq = seq  # its events are lost, but the next message is no gap
        s.bad_streak += 1
        logger.debug("KV events of %s: bad message (%s: %s)", s.engine_id, e.kind, e)
        if self.is_live(s.engine_id):
            self.index.cleared(s.engine_id)  # the events it stood for are lost
            if s.bad_streak >= self.garbage_limit:
                self._stale(s, f"{s.bad_streak} bad messages in a row ({e.kind})")

    # ---- live and stale -----------------------------------------------------------------------------

    def _live(self, s: _Stream, why: str) -> None:
        if self.is_live(s.engine_id):
            return
        if s.bad_streak >= self.garbage_limit:
            return  # still sending garbage: stays stale until a good message
        # Events were missed while stale (or before connecting): start from an empty view.
        self.index.cleared(s.engine_id)
        self.index.live.add(s.engine_id)
        self.live_gauge.labels(s.engine_id).set(1)
        logger.info("KV events of %s live (%s): precise prefix view", s.engine_id, why)

    def _stale(self, s: _Stream, why: str) -> None:
        if not self.is_live(s.engine_id):
            return
        # The view keeps what the events last said; the router's placements add to it from now on.
        self.index.live.discard(s.engine_id)
        self.live_gauge.labels(s.engine_id).set(0)
        logger.warning(
            "KV events of %s stale (%s): falling back to the router's own placements", s.engine_id, why
        )
