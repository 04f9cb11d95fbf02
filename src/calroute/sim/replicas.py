"""N routers in front of one simulated cluster (issue 38): a load balancer splits the arrivals, each router
has its own ledger and its own prefix index, and what one router learns reaches the others only as a live
deployment would let it.

What each router knows:

- its own admissions, and the later events of the requests it admitted (prefill done, first token, done):
  the proxy that admitted a request is the one that sees its answer;
- every engine's metrics as polled every sample interval (each replica scrapes every engine's /metrics);
- every engine's KV events, with their delay, in the precise prefix source (each replica subscribes to every
  engine's publisher, as Dynamo's replicas subscribe to every worker's); in the approximate source, its own
  placements only;
- with state sharing (``share_delay_s`` not None), the other routers' admissions, prefill completions,
  first tokens and completions, ``share_delay_s`` after they happened, in its ledger, so that each ledger
  converges on the cluster's (Dynamo's ``--router-replica-sync``). Only the ledger hears them: a shared
  admission is not a placement in the receiver's prefix index, and teaches its output-length predictor
  nothing.

Balancers (``BALANCERS``): ``round_robin`` (admitted arrivals in turn), ``random`` (a uniform router per
arrival, from the run's seed) and ``session`` (session affinity, as HAProxy's ``balance hdr``: a request
with ``prefix_blocks`` goes to the router its first block id hashes to, so a conversation's turns and a
shared system prompt's requests stay on one router; a request without blocks goes round-robin, as HAProxy
falls back to round-robin when the header is absent).

Shared events are kept in a heap and handed over lazily: before the group passes on any event at time t,
every shared event due by t reaches its ledgers first, so each ledger still hears its events in time order.
A group of one router without sharing passes every call straight to it: its records are a plain router's,
byte for byte.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from calroute.errors import ConfigError
from calroute.routing.heap import Entry, MinHeap
from calroute.routing.ledger import Ledger
from calroute.routing.router import Decision, Router, TrueView
from calroute.routing.seeds import derive_seed
from calroute.sim.herd import HerdCounter, HerdStats
from calroute.sim.sampling import HeldMetrics, Sample, poll
from calroute.splitmix import hash64
from calroute.types import PicklesByConstructor, SloClass

BALANCERS = ("round_robin", "random", "session")
# The window in which two routers' picks of one engine count as a herd when no share delay sets it: about
# the time a booking takes to reach a peer over a broker (and the default KV-event delay).
HERD_WINDOW_S = 0.01


class Balancer(Protocol):
    def pick(self, prefix_blocks: Sequence[int]) -> int:
        """The router (an index) that admits the next arrival."""
        ...


class RoundRobin:
    def __init__(self, routers: int) -> None:
        self._routers = routers
        self._next = 0

    def pick(self, prefix_blocks: Sequence[int]) -> int:
        i = self._next
        self._next = (i + 1) % self._routers
        return i


class RandomBalancer:
    def __init__(self, routers: int, seed: int) -> None:
        self._routers = routers
        self._rng = random.Random(derive_seed(seed, "balancer"))

    def pick(self, prefix_blocks: Sequence[int]) -> int:
        return self._rng.randrange(self._routers)


class SessionAffinity:
    def __init__(self, routers: int) -> None:
        self._routers = routers
        self._fallback = RoundRobin(routers)

    def pick(self, prefix_blocks: Sequence[int]) -> int:
        if not prefix_blocks:
            return self._fallback.pick(prefix_blocks)
        # hashed, not taken modulo as it is: ids made by a counter would go round-robin by block
        return hash64(prefix_blocks[0]) % self._routers


def check_group(routers: int, balancer: str, share_delay_s: float | None, near_best: float | None) -> None:
    """A ConfigError naming what is wrong with a group's settings (``near_best``: sim/herd.py's tolerance)."""
    if routers < 1:
        raise ConfigError(f"routers must be >= 1, got {routers}")
    if balancer not in BALANCERS:
        raise ConfigError(f"unknown balancer {balancer!r}; known: {', '.join(BALANCERS)}")
    if share_delay_s is not None and share_delay_s < 0:
        raise ConfigError(f"share_delay_s must be >= 0, got {share_delay_s}")
    if near_best is not None and not 0.0 <= near_best <= 1.0:
        raise ConfigError(f"near_best must be in [0, 1], got {near_best}")


def make_balancer(name: str, routers: int, seed: int) -> Balancer:
    check_group(routers, name, None, None)
    if name == "random":
        return RandomBalancer(routers, seed)
    return SessionAffinity(routers) if name == "session" else RoundRobin(routers)


@dataclass(frozen=True)
class GroupStats(PicklesByConstructor):
    """What a run of a group did: each router's admissions and the herd (sim/herd.py)."""

    routers: int
    balancer: str
    share_delay_s: float | None
    admissions: tuple[int, ...]
    herd: HerdStats

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GroupStats:
        return cls(
            d["routers"], d["balancer"], d["share_delay_s"], tuple(d["admissions"]), HerdStats(**d["herd"])
        )


# kinds of shared event
_ADMIT, _PREFILL_DONE, _FIRST_TOKEN, _DONE = range(4)


class _Booking:
    """An admission as it is shared: what the receivers' ledgers book (Ledger.admit's arguments)."""

    __slots__ = ("prefill_id", "decode_id", "prompt_tokens", "predicted_output_tokens", "cached", "blocks")

    def __init__(
        self,
        prefill_id: str,
        decode_id: str,
        prompt_tokens: int,
        predicted_output_tokens: int,
        cached: int,
        blocks: tuple[int, ...],
    ) -> None:
        self.prefill_id = prefill_id
        self.decode_id = decode_id
        self.prompt_tokens = prompt_tokens
        self.predicted_output_tokens = predicted_output_tokens
        self.cached = cached
        self.blocks = blocks


class _Shared:
    """One event of a router, on its way to the others' ledgers."""

    __slots__ = ("kind", "origin", "request_id", "booking", "local", "output_tokens", "ok")

    def __init__(
        self,
        kind: int,
        origin: int,
        request_id: str,
        booking: _Booking | None = None,
        local: bool = False,
        output_tokens: int = 0,
        ok: bool = True,
    ) -> None:
        self.kind = kind
        self.origin = origin
        self.request_id = request_id
        self.booking = booking
        self.local = local
        self.output_tokens = output_tokens
        self.ok = ok


class RouterGroup:
    """What the simulator talks to in place of one Router (sim/simulator.py): ``routers`` (each with a
    ledger and a prefix index of its own, built alike), the balancer by name (``random`` draws from
    ``seed``'s stream), state sharing's delay (None: none), and the herd's window (sim/herd.py)."""

    def __init__(
        self,
        routers: Sequence[Router],
        balancer: str = "round_robin",
        seed: int = 0,
        share_delay_s: float | None = None,
        herd_window_s: float = HERD_WINDOW_S,
    ) -> None:
        check_group(len(routers), balancer, share_delay_s, None)
        if len({id(r.ledger) for r in routers}) != len(routers):
            raise ConfigError("each router of a group needs a ledger of its own")
        indexes = [id(r.prefix) for r in routers if r.prefix is not None]
        if len(set(indexes)) != len(indexes):
            raise ConfigError("each router of a group needs a prefix index of its own")
        if len(routers) > 1 and any(getattr(r.policy, "needs_true_state", False) for r in routers):
            # its view is the cluster's truth: more routers change nothing it sees
            raise ConfigError("a policy that routes on the simulator's truth runs as one router")
        self.routers = list(routers)
        self._balancer = make_balancer(balancer, len(routers), seed)
        self._balancer_name = balancer
        self.share_delay_s = share_delay_s
        # sharing with nobody is no sharing: one router's calls pass straight through
        self._sharing = share_delay_s is not None and len(routers) > 1
        self._owner: dict[str, int] = {}  # request id -> the router that admitted it
        self._admissions = [0] * len(routers)
        self._herd = HerdCounter(herd_window_s)
        self._shared = MinHeap()  # entries (delivery time, seq, _Shared)
        self._shared_seq = 0
        self._last_samples: list[list[Sample | None]] = [[] for _ in routers]

    # ---- request events, as ClusterSim gives them to one router ------------------------------------------

    def admit(
        self,
        request_id: str,
        prompt_tokens: int,
        slo_class: SloClass,
        now_s: float,
        oracle_output_tokens: int | None = None,
        prefix_blocks: Sequence[int] = (),
        true_view: TrueView | None = None,
    ) -> Decision:
        if self._shared.top_key() <= now_s:
            self._deliver(now_s)
        i = self._balancer.pick(prefix_blocks)
        d = self.routers[i].admit(
            request_id, prompt_tokens, slo_class, now_s, oracle_output_tokens, prefix_blocks, true_view
        )
        self._owner[request_id] = i
        self._admissions[i] += 1
        route = d.route
        self._herd.admitted(now_s, i, route.prefill_id, route.decode_id)
        if self._sharing:
            booking = _Booking(
                route.prefill_id,
                route.decode_id,
                prompt_tokens,
                d.admission.predicted_output_tokens,
                d.match.get(route.prefill_id, 0) if d.match else 0,
                tuple(prefix_blocks),
            )
            self._share(now_s, _Shared(_ADMIT, i, request_id, booking, route.local))
        return d

    def prefill_done(self, request_id: str, now_s: float, prompt_tokens: int | None = None) -> None:
        if self._shared.top_key() <= now_s:
            self._deliver(now_s)
        i = self._owner[request_id]
        self.routers[i].prefill_done(request_id, now_s, prompt_tokens)
        if self._sharing:
            self._share(now_s, _Shared(_PREFILL_DONE, i, request_id))

    def first_token(self, request_id: str, now_s: float) -> None:
        if self._shared.top_key() <= now_s:
            self._deliver(now_s)
        i = self._owner[request_id]
        self.routers[i].first_token(request_id, now_s)
        if self._sharing:
            self._share(now_s, _Shared(_FIRST_TOKEN, i, request_id))

    def done(
        self,
        request_id: str,
        prompt_tokens: int,
        output_tokens: int,
        now_s: float,
        ok: bool,
        first_token_s: float | None = None,
    ) -> None:
        if self._shared.top_key() <= now_s:
            self._deliver(now_s)
        i = self._owner.pop(request_id)
        self.routers[i].done(request_id, prompt_tokens, output_tokens, now_s, ok, first_token_s)
        if self._sharing:
            self._share(now_s, _Shared(_DONE, i, request_id, output_tokens=output_tokens, ok=ok))

    # ---- what every router hears -------------------------------------------------------------------------

    def kv_event(self, instance_id: str, stored: bool, blocks: tuple[int, ...]) -> None:
        """An engine's KV event, as it reaches every router's prefix index (their subscriptions' delays
        are one: the simulator's ``kv_event_delay_s``)."""
        for r in self.routers:
            index = r.prefix
            if index is None:
                continue
            if stored:
                index.stored(instance_id, blocks)
            else:
                index.removed(instance_id, blocks)

    def poll(self, engines: list[tuple[str, HeldMetrics]], now_s: float) -> None:
        """Every router's ledger polls every engine's metrics (sim/sampling.py ``poll``)."""
        for r, last in zip(self.routers, self._last_samples, strict=True):
            if len(last) != len(engines):
                last[:] = [None] * len(engines)
            poll(engines, last, now_s, r.ledger)

    def stats(self) -> GroupStats:
        return GroupStats(
            len(self.routers),
            self._balancer_name,
            self.share_delay_s,
            tuple(self._admissions),
            self._herd.stats(),
        )

    # ---- sharing -----------------------------------------------------------------------------------------

    def _share(self, now_s: float, event: _Shared) -> None:
        assert self.share_delay_s is not None
        self._shared.push(Entry(now_s + self.share_delay_s, self._shared_seq, event))
        self._shared_seq += 1

    def _deliver(self, now_s: float) -> None:
        """Hand every shared event due by ``now_s`` to the ledgers of the routers that did not make it (the
        maker's has it already: a shared admission is booked once there)."""
        heap = self._shared
        while heap.top_key() <= now_s:
            entry = heap.pop()
            event: _Shared = entry.item
            for j, r in enumerate(self.routers):
                if j != event.origin:
                    _apply(r.ledger, event, entry.key)


def _apply(ledger: Ledger, e: _Shared, t_s: float) -> None:
    if e.kind == _ADMIT:
        b = e.booking
        assert b is not None
        ledger.admit(
            e.request_id,
            b.prefill_id,
            b.decode_id,
            b.prompt_tokens,
            b.predicted_output_tokens,
            t_s,
            b.cached,
            b.blocks,
            e.local,
        )
    elif e.kind == _PREFILL_DONE:
        ledger.prefill_done(e.request_id, t_s)
    elif e.kind == _FIRST_TOKEN:
        ledger.first_token(e.request_id, t_s)
    else:
        ledger.done(e.request_id, t_s, e.output_tokens, e.ok)
