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

The emulator's events name blocks by the router's own hashes. Real vLLM's name them by vLLM's: with
``translate_hashes`` each engine's stored blocks are translated from the tokens the events carry
(contract/blocks.py), and what cannot be is counted in ``calroute_kv_events_skipped_blocks_total{engine,
reason}`` and logged (a warning on an engine's first skip for a reason).

Every read is bounded: a message part over ``max_message_bytes`` makes libzmq drop the connection (it
reconnects; counted as a disconnect), at most ``max_queued_messages`` wait per socket (past that libzmq drops
and the seq gap shows it), a tick reads at most ``max_messages_per_tick`` per engine, and decoding has
msgpack's size limits. Nothing an engine sends can raise out of here: it is counted in
``calroute_kv_events_errors_total{engine, kind}`` and skipped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import zmq
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from zmq.utils.monitor import recv_monitor_message

from calroute.contract.blocks import BlockTranslator
from calroute.contract.kv_events import BadMessage, Op, decode_timed_batch
from calroute.routing.prefix_index import PrefixIndex
from calroute.types import InstanceSpec

logger = logging.getLogger(__name__)

# A message is [topic, seq, payload]: more parts than this are garbage (and read no further than needed).
_PARTS = 3


class PreciseIndex(PrefixIndex):
    """The router's prefix index with both sources: the router's placements count only for engines whose
    event stream is not live (``live``); a live engine's view is what its events say. (A subclass, so the
    index's own semantics stay as they are.)"""

    hears_events: ClassVar[bool] = True

    def __init__(self, instances: Sequence[InstanceSpec], block_tokens: int) -> None:
        super().__init__(instances, block_tokens)
        self.live: set[str] = set()

    def placed(self, instance_id: str, blocks: Iterable[int]) -> None:
        if instance_id not in self.live:
            super().placed(instance_id, blocks)


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
    translator: BlockTranslator | None = None  # vLLM's hashes -> the router's (translate_hashes)
    skips_logged: frozenset[str] = frozenset()  # skip reasons already warned about


class KvEventSubscriber:
    """Feeds ``index`` from the engines' event streams (``endpoints``: engine id -> ZMQ address).
    ``translate_hashes``: the engines name blocks by their own hashes (real vLLM), not the router's."""

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
        translate_hashes: bool = False,
        translate_slack: int = 2,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``wall``: the wall clock a batch's ``ts`` is read against (the publisher's, on the same host)."""
        self.index = index
        self._wall = wall
        self.translate_hashes = translate_hashes
        # A translator holds about what its engine caches; the slack covers a KV capacity the cluster
        # file underestimates and blocks whose removal is still in flight.
        self.translate_slack = translate_slack
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
        self.skipped = Counter(
            "calroute_kv_events_skipped_blocks",
            "Stored blocks of an engine whose hashes are not the router's (real vLLM) that could not be "
            "translated, by reason: unknown_parent (the block before it was never seen, or was dropped), "
            "block_size (the engine's block size is not the cluster file's block_tokens), layout (tokens "
            "and hashes do not line up), keyed (hashed on more than tokens: LoRA, cache salt, multimodal), "
            "token_ids (not token ids).",
            ["engine", "reason"],
            registry=registry,
        )
        self.delay = Histogram(
            "calroute_kv_events_delay_seconds",
            "From a KV event batch's ts (the engine's wall clock as it published the batch, after the step "
            "that changed its cache) to the index applying it: what the simulator's --kv-event-delay-s "
            "stands for (an engine on another host adds its clock's offset).",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0),
            registry=registry,
        )
        for engine_id in self._endpoints:
            self.live_gauge.labels(engine_id).set(0)

    # ---- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        for engine_id, endpoint in self._endpoints.items():
            sock, monitor = self._open(endpoint)
            translator = (
                BlockTranslator(
                    self.index.block_tokens, self.translate_slack * self.index.capacity_blocks(engine_id)
                )
                if self.translate_hashes
                else None
            )
            self._streams[engine_id] = _Stream(engine_id, endpoint, sock, monitor, translator=translator)
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
            ts, ops = decode_timed_batch(parts[2], self.max_message_bytes)
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
            self._clear_view(s)
        s.last_seq = seq
        self._apply(s, ops)
        self.messages.labels(s.engine_id).inc()
        if ts is not None:
            self.delay.observe(max(0.0, self._wall() - ts))

    def _apply(self, s: _Stream, ops: list[Op]) -> None:
        index, engine_id, tr = self.index, s.engine_id, s.translator
        for op in ops:
            if op.kind == "stored":
                blocks = op.blocks
                if tr is not None:
                    blocks, why = tr.stored(
                        op.blocks, op.parent, op.token_ids, op.block_size, op.plain_blocks
                    )
                    if why is not None:
                        self._skipped(s, why, len(op.blocks) - len(blocks))
                index.stored(engine_id, blocks)
            elif op.kind == "removed":
                index.removed(engine_id, op.blocks if tr is None else tr.removed(op.blocks))
            else:
                self._clear_view(s)

    def _skipped(self, s: _Stream, why: str, blocks: int) -> None:
        self.skipped.labels(s.engine_id, why).inc(blocks)
        if why not in s.skips_logged:
            s.skips_logged |= {why}
            logger.warning(
                "KV events of %s: %d stored blocks not translated (%s); the index misses them (further "
                "skips are counted in calroute_kv_events_skipped_blocks_total)",
                s.engine_id,
                blocks,
                why,
            )

    def _clear_view(self, s: _Stream) -> None:
        """What the index holds from this engine's events is no longer known (or the engine said it holds
        nothing): forget it, and the translations with it."""
        self.index.cleared(s.engine_id)
        if s.translator is not None:
            s.translator.cleared()

    def _bad(self, s: _Stream, e: BadMessage, seq: int | None) -> None:
        self.errors.labels(s.engine_id, e.kind).inc()
        if seq is not None:
            s.last_seq = seq  # its events are lost, but the next message is no gap
        s.bad_streak += 1
        logger.debug("KV events of %s: bad message (%s: %s)", s.engine_id, e.kind, e)
        if self.is_live(s.engine_id):
            self._clear_view(s)  # the events it stood for are lost
            if s.bad_streak >= self.garbage_limit:
                self._stale(s, f"{s.bad_streak} bad messages in a row ({e.kind})")

    # ---- live and stale -----------------------------------------------------------------------------

    def _live(self, s: _Stream, why: str) -> None:
        if self.is_live(s.engine_id):
            return
        if s.bad_streak >= self.garbage_limit:
            return  # still sending garbage: stays stale until a good message
        # Events were missed while stale (or before connecting): start from an empty view.
        self._clear_view(s)
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
