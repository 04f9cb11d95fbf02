"""The simulated cluster: arrivals, the router, prefill and decode engines, KV transfers, records.

The router sees only what a live proxy could: its ledger (fed at prefill done, first token and done, the
moments a proxy observes, in time order) and engine metrics as polled every ``sample_interval_s`` (stale
in between; see sampling.py). Nothing of an engine's true remaining work reaches the policy.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from calroute.costmodel.profiles import HardwareProfile
from calroute.errors import ConfigError
from calroute.results.records import RequestRecord
from calroute.routing.heap import Entry, MinHeap
from calroute.routing.router import Router, TrueView
from calroute.sim.cache_events import CacheListener
from calroute.sim.decode import DecodeInstance
from calroute.sim.kernel import Kernel
from calroute.sim.prefill import PrefillInstance
from calroute.sim.replicas import RouterGroup
from calroute.sim.requests import SimRequest
from calroute.sim.sampling import ReadHorizon, Sample, poll
from calroute.types import (
    PREFIX_BLOCK_TOKENS,
    ClusterView,
    InstanceSpec,
    PicklesByConstructor,
    RequestSpec,
    RequestStatus,
    Role,
)

RecordSink = Callable[[RequestRecord], None]


@dataclass(frozen=True)
class ClusterShape(PicklesByConstructor):
    prefill: int
    decode: int

    def __post_init__(self) -> None:
        # No prefill instance: an aggregated cluster, whose policy keeps every prefill local
        # (policies/aggregated.py); a policy that disaggregates fails on it with a clear error.
        if self.prefill < 0 or self.decode < 1:
            raise ConfigError(f"a cluster needs 1 decode instance or more, 0 prefill or more, got {self}")

    def instances(self, kv_capacity_tokens: int) -> list[InstanceSpec]:
        return [
            InstanceSpec(f"prefill-{i}", Role.PREFILL, kv_capacity_tokens) for i in range(self.prefill)
        ] + [InstanceSpec(f"decode-{i}", Role.DECODE, kv_capacity_tokens) for i in range(self.decode)]


@dataclass(frozen=True)
class SimStats(PicklesByConstructor):
    requests: int
    events: int
    end_s: float
    preemptions: int
    peak_kv_used_tokens: dict[str, int]


class ClusterSim:
    """One run: ``run(requests, sink)`` feeds every request to exactly one record in ``sink``."""

    def __init__(
        self,
        profile: HardwareProfile,
        shape: ClusterShape,
        router: Router | RouterGroup,
        policy_name: str,
        sample_interval_s: float = 0.05,
        max_stretch_steps: int | None = None,
        block_tokens: int = PREFIX_BLOCK_TOKENS,
        kv_event_delay_s: float | None = None,
    ) -> None:
        """``block_tokens``: the size of the blocks that workloads' ``prefix_blocks`` name.

        ``kv_event_delay_s``: the engines publish their prefix caches' changes as vLLM's KV events do, and
        the router's prefix index hears each this long after it happened (its precise source). None: no
        events; the router learns only from its own placements, if at all.

        ``router``: a RouterGroup in place of one Router models several routers (sim/replicas.py); it gets
        every request event, engine sample and KV event, and hands each to the routers it concerns.
        """
        self._group = router if isinstance(router, RouterGroup) else None
        # checked and read on the first router: a group's routers are built alike
        router = router.routers[0] if isinstance(router, RouterGroup) else router
        if sample_interval_s <= 0:
            raise ConfigError(f"sample_interval_s must be > 0, got {sample_interval_s}")
        if kv_event_delay_s is not None:
            if kv_event_delay_s < 0:
                raise ConfigError(f"kv_event_delay_s must be >= 0, got {kv_event_delay_s}")
            if router.prefix is None:
                raise ConfigError("KV events need a router with a prefix index")
        self.kernel = Kernel()
        # The only reader of the engines' metrics (at arrivals): its promise lets them skip samples.
        self._horizon = ReadHorizon()
        self._router = router
        self._policy_name = policy_name
        self._limits = profile.limits
        cal = profile.calibration
        lim = profile.limits
        self.prefill = {
            s.instance_id: PrefillInstance(
                s.instance_id,
                self.kernel,
                cal.prefill,
                lim.kv_capacity_tokens,
                lim.max_batched_tokens,
                self._prefill_done,
                sample_interval_s=sample_interval_s,
                block_tokens=block_tokens,
                horizon=self._horizon,
                cache_listener=self._publisher(s.instance_id, kv_event_delay_s),
            )
            for s in shape.instances(lim.kv_capacity_tokens)
            if s.role is Role.PREFILL
        }
        self.decode = {
            s.instance_id: DecodeInstance(
                s.instance_id,
                self.kernel,
                cal.decode,
                cal.prefill,
                cal.transfer_s,
                lim,
                self._pulled,
                self._first_tokens,
                self._done,
                max_stretch_steps,
                sample_interval_s=sample_interval_s,
                block_tokens=block_tokens,
                horizon=self._horizon,
                cache_listener=self._publisher(s.instance_id, kv_event_delay_s),
            )
            for s in shape.instances(lim.kv_capacity_tokens)
            if s.role is Role.DECODE
        }
        self._sink: RecordSink = lambda rec: None
        self._arrivals: Iterator[RequestSpec] = iter(())
        self._in_flight = 0
        # first tokens are known when a decode stretch is planned; the router hears of them at their time
        self._first_token_heap = MinHeap()  # entries (time, seq, SimRequest)
        self._first_token_seq = 0
        self._engines: list[PrefillInstance | DecodeInstance] = [
            *self.prefill.values(),
            *self.decode.values(),
        ]
        self._max_request_tokens = profile.limits.max_request_tokens
        self._samplers = [(e.instance_id, e.metrics) for e in self._engines]
        self._last_samples: list[Sample | None] = [None] * len(self._engines)
        self._count = 0
        self._last_arrival_s = 0.0
        # A policy that routes on the truth (the clairvoyant marginal_cost) is handed it at each decision.
        self._truth: TrueView | None = (
            self._true_view if getattr(router.policy, "needs_true_state", False) else None
        )
        self._tau_pre_s = cal.tau_pre_s
        self._tau_dec_s = cal.tau_dec_s

    # ---- driving ------------------------------------------------------------------------------------

    def run(self, requests: Iterable[RequestSpec], sink: RecordSink) -> SimStats:
        self._sink = sink
        self._arrivals = iter(requests)
        self._schedule_next_arrival()
        # The run allocates millions of short-lived, acyclic tuples and objects: the cyclic collector's
        # passes over them find nothing and cost a few percent. Reference counting still frees them.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            self.kernel.run()
        finally:
            if gc_was_enabled:
                gc.enable()
        if self._in_flight:
            raise RuntimeError(f"simulation ended with {self._in_flight} requests still in flight")
        return SimStats(
            requests=self._count,
            events=self.kernel.events_processed,
            end_s=self.kernel.now_s,
            preemptions=sum(d.preemptions for d in self.decode.values()),
            peak_kv_used_tokens={
                **{i: p.peak_kv_used_tokens for i, p in self.prefill.items()},
                **{i: d.peak_kv_used_tokens for i, d in self.decode.items()},
            },
        )

    def _schedule_next_arrival(self) -> None:
        spec = next(self._arrivals, None)
        if spec is None:
            return
        if spec.arrival_s < self._last_arrival_s:
            raise ConfigError(
                f"request {spec.request_id!r} arrives at {spec.arrival_s} s, before the previous one "
                f"({self._last_arrival_s} s): workloads must be sorted by arrival"
            )
        self._last_arrival_s = spec.arrival_s
        self.kernel.at(spec.arrival_s, self._arrive, spec)

    def _arrive(self, spec: RequestSpec) -> None:
        now = self.kernel.now_s
        self._count += 1
        self._schedule_next_arrival()
        request_id, arrival_s, prompt_tokens, output_tokens, slo_class, prefix_blocks, answer_blocks = spec
        error = None
        if prompt_tokens < 1 or output_tokens < 1 or prompt_tokens + output_tokens > self._max_request_tokens:
            error = self._admission_error(spec)
        if error is not None:
            self._sink(
                RequestRecord(
                    request_id=spec.request_id,
                    slo_class=spec.slo_class,
                    prompt_tokens=spec.prompt_tokens,
                    target_output_tokens=spec.output_tokens,
                    predicted_output_tokens=0,
                    output_tokens=0,
                    policy=self._policy_name,
                    prefill_id=None,
                    decode_id=None,
                    arrival_s=spec.arrival_s,
                    prefill_done_s=None,
                    first_token_s=None,
                    last_token_s=None,
                    status=RequestStatus.REJECTED,
                    error=error,
                )
            )
            return
        if self._first_token_heap.top_key() <= now:
            self._notify_first_tokens(now)
        self._record_samples(now)
        # Engine metrics are read at (admitted) arrivals only, so none is read before the next arrival.
        # Arrivals are sorted (checked when scheduled), so the horizon never decreases, even across runs.
        self._horizon.next_read_s = self._last_arrival_s
        group = self._group
        if group is None:
            d = self._router.admit(
                request_id, prompt_tokens, slo_class, now, output_tokens, prefix_blocks, self._truth
            )
        else:
            d = group.admit(
                request_id, prompt_tokens, slo_class, now, output_tokens, prefix_blocks, self._truth
            )
        decision = d.route
        req = SimRequest(
            request_id,
            arrival_s,
            prompt_tokens,
            output_tokens,
            slo_class,
            d.admission.predicted_output_tokens,
            decision.prefill_id,
            decision.decode_id,
            prefix_blocks,
            d.match.get(decision.prefill_id, 0) if d.match else 0,
            decision.local,
            decision.reason,
            answer_blocks,
        )
        self._in_flight += 1
        if decision.local:
            self.decode[decision.decode_id].enqueue(req)
        else:
            self.prefill[decision.prefill_id].enqueue(req)

    def _admission_error(self, spec: RequestSpec) -> str | None:
        if spec.prompt_tokens < 1 or spec.output_tokens < 1:
            return "prompt_tokens and output_tokens must be >= 1"
        limit = self._limits.max_request_tokens
        if spec.prompt_tokens + spec.output_tokens > limit:
            return (
                f"prompt_tokens + output_tokens = {spec.prompt_tokens + spec.output_tokens} "
                f"exceeds the engine limit of {limit} tokens"
            )
        return None

    # ---- engine callbacks ---------------------------------------------------------------------------

    def _prefill_done(self, req: SimRequest) -> None:
        now = self.kernel.now_s
        if self._first_token_heap.top_key() <= now:
            self._notify_first_tokens(now)
        if self._group is None:
            self._router.prefill_done(req.request_id, now, req.prompt_tokens)
        else:
            self._group.prefill_done(req.request_id, now, req.prompt_tokens)
        self.decode[req.decode_id].enqueue(req)

    def _pulled(self, req: SimRequest) -> None:
        self.prefill[req.prefill_id].release_kv(req)

    def _first_tokens(self, t_s: float, reqs: list[SimRequest]) -> None:
        for req in reqs:
            self._first_token_heap.push(Entry(t_s, self._first_token_seq, req))
            self._first_token_seq += 1

    def _notify_first_tokens(self, now: float) -> None:
        """Tell the router of first tokens emitted up to ``now``, in order, before it hears anything later."""
        heap = self._first_token_heap
        first_token = self._router.first_token if self._group is None else self._group.first_token
        while heap.top_key() <= now:
            entry = heap.pop()
            req: SimRequest = entry.item
            first_token(req.request_id, entry.key)

    def _done(self, req: SimRequest) -> None:
        now = self.kernel.now_s
        if self._first_token_heap.top_key() <= now:
            self._notify_first_tokens(now)
        self._in_flight -= 1
        request_id, prompt_tokens, output_tokens, first_token_s = (
            req.request_id,
            req.prompt_tokens,
            req.output_tokens,
            req.first_token_s,
        )
        if self._group is None:
            self._router.done(request_id, prompt_tokens, output_tokens, now, True, first_token_s)
        else:
            self._group.done(request_id, prompt_tokens, output_tokens, now, True, first_token_s)
        self._sink(
            RequestRecord(
                request_id=request_id,
                slo_class=req.slo_class,
                prompt_tokens=prompt_tokens,
                target_output_tokens=output_tokens,
                predicted_output_tokens=req.predicted_output_tokens,
                output_tokens=output_tokens,
                policy=self._policy_name,
                prefill_id=req.prefill_id,
                decode_id=req.decode_id,
                arrival_s=req.arrival_s,
                # a local prefill ends with the step that emits the first token
                prefill_done_s=first_token_s if req.local else req.prefill_done_s,
                first_token_s=first_token_s,
                last_token_s=req.last_token_s,
                status=RequestStatus.OK,
                error=None,
                cached_tokens=req.cached_prefill_tokens,
                predicted_cached_tokens=req.predicted_cached_tokens,
                local_prefill=req.local,
                path_reason=req.path_reason,
            )
        )

    def _true_view(self, now_s: float, seq: int, blocks: Sequence[int], prompt_tokens: int) -> ClusterView:
        """Every engine as it is at ``now_s`` (policies/clairvoyant.py): what no live router can see."""
        b = tuple(blocks)
        index = self._router.prefix
        reuse = index.reuse_ratios() if index is not None and b else {}
        return ClusterView(
            now_s,
            seq,
            tuple(
                p.true_state(self._tau_pre_s, b, prompt_tokens, reuse.get(p.instance_id, 0.0))
                for p in self.prefill.values()
            ),
            tuple(
                d.true_state(now_s, self._tau_dec_s, b, prompt_tokens, reuse.get(d.instance_id, 0.0))
                for d in self.decode.values()
            ),
        )

    def _publisher(self, instance_id: str, delay_s: float | None) -> CacheListener | None:
        """What an engine's cache tells its changes to: the router's index, ``delay_s`` later (None: no
        KV events, nothing listens)."""
        if delay_s is None:
            return None
        kernel = self.kernel
        deliver = self._kv_event

        def publish(stored: bool, blocks: tuple[int, ...]) -> None:
            kernel.at(kernel.now_s + delay_s, deliver, (instance_id, stored, blocks))

        return publish

    def _kv_event(self, event: tuple[str, bool, tuple[int, ...]]) -> None:
        instance_id, stored, blocks = event
        if self._group is not None:
            self._group.kv_event(instance_id, stored, blocks)
            return
        index = self._router.prefix
        if index is None:
            return
        if stored:
            index.stored(instance_id, blocks)
        else:
            index.removed(instance_id, blocks)

    def _record_samples(self, now: float) -> None:
        """Hand the ledger each engine's metrics as last polled (only this method feeds it samples)."""
        if self._group is not None:
            self._group.poll(self._samplers, now)
            return
        poll(self._samplers, self._last_samples, now, self._router.ledger)
