"""The router: predictor + policy + ledger, driven by request events. The simulator and the proxy both
call exactly this, so a policy sees the same kind of information in both."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from calroute.costmodel.calibration import Calibration
from calroute.costmodel.online import OnlineCalibrator
from calroute.costmodel.predictors import OutputLengthPredictor
from calroute.policies.base import RoutingPolicy
from calroute.routing.ledger import Ledger
from calroute.routing.prefix_index import PrefixIndex
from calroute.types import (
    PREFIX_BLOCK_TOKENS,
    Admission,
    ClusterView,
    InstanceState,
    PicklesByConstructor,
    RouteDecision,
    SloClass,
    SlottedValue,
)

# The simulator's truth for a policy that may see it (policies/clairvoyant.py):
# (now, seq, blocks, prompt) -> view.
TrueView = Callable[[float, int, Sequence[int], int], ClusterView]
PolicyFactory = Callable[[Calibration], RoutingPolicy]


class Decision(SlottedValue):
    """Everything one decision produced: the admission (with its predicted length), the view the policy
    saw, its choice, and the prompt's prefix match (instance id -> cached prompt tokens; empty without a
    prefix index or block ids), which the proxy records as the hit it predicted."""

    _fields = ("admission", "view", "route", "match")
    __slots__ = _fields

    def __init__(
        self, admission: Admission, view: ClusterView, route: RouteDecision, match: dict[str, int]
    ) -> None:
        self.admission: Final = admission
        self.view: Final = view
        self.route: Final = route
        self.match: Final = match


DecisionHook = Callable[[Decision], None]


@dataclass(frozen=True)
class OnlineRecalibration(PicklesByConstructor):
    """Online recalibration: what refits the constants from completed requests, and how the policy is
    rebuilt with the new ones."""

    calibrator: OnlineCalibrator
    policy_factory: PolicyFactory


@dataclass
class _Tracked:
    """What online recalibration remembers of a request in flight."""

    prefill_id: str
    decode_id: str
    admitted_s: float
    unqueued_prefill: bool
    at_first_token: tuple[int, int] | None = None  # the decode engine's (running, KV tokens) then


def _panic(view: ClusterView) -> ClusterView:
    """A pool with no healthy member is routed as if all were healthy (Envoy's panic mode at 0 %).

    Health marks can be wrong (a probe times out on an overloaded engine); trying is the only way to know,
    and a request that then fails everywhere still gets a clear error after its retries.
    """
    if not _any_healthy(view.prefill):
        view = view.replace(prefill=tuple(s.replace(healthy=True) for s in view.prefill))
    if not _any_healthy(view.decode):
        view = view.replace(decode=tuple(s.replace(healthy=True) for s in view.decode))
    return view


def _any_healthy(pool: tuple[InstanceState, ...]) -> bool:
    # a loop, not any() over a generator: a generator's frame costs more than the pool's first member
    for s in pool:
        if s.healthy:
            return True
    return False


class Router:
    def __init__(
        self,
        policy: RoutingPolicy,
        predictor: OutputLengthPredictor,
        ledger: Ledger,
        on_decision: DecisionHook | None = None,
        online: OnlineRecalibration | None = None,
        prefix: PrefixIndex | None = None,
        record_placements: bool = True,
    ) -> None:
        """``online``: refit the constants from completed requests and rebuild the policy with them.

        ``prefix``: the view of the engines' prefix caches that requests with block ids are matched against;
        ``record_placements`` feeds it the router's own placements (its approximate source). Without it the
        index learns only from the engines' KV events, fed by whoever receives them.

        What a policy asks of the router, by its attributes (read again when the policy is switched):
        ``reads_active_blocks``, the ledger counts the active sequences' blocks and matches each request
        against them (``InstanceState.active_shared_tokens``, ``active_overlap_tokens``), a cost only such
        a policy pays; ``prefix_source = "approximate"``, it is matched against the router's own placements
        alone: where ``prefix`` hears KV events, against an index of its own that only placements feed.
        """
        self.policy = policy
        self.predictor = predictor
        self.ledger = ledger
        self.on_decision = on_decision
        self.online = online
        self.prefix = prefix
        self.record_placements = record_placements
        self._tracked: dict[str, _Tracked] = {}
        self._own_index: PrefixIndex | None = None  # the policy's placements-only index (prefix_source)
        self._follow_policy()

    def _follow_policy(self) -> None:
        """Give the current policy what its attributes ask for (see __init__)."""
        policy = self.policy
        index = self.prefix
        if getattr(policy, "reads_active_blocks", False):
            self.ledger.track_active_blocks(index.block_tokens if index is not None else PREFIX_BLOCK_TOKENS)
        else:
            self.ledger.track_active_blocks(None)
        own = None
        if index is not None and getattr(policy, "prefix_source", None) == "approximate":
            if index.hears_events or not self.record_placements:
                own = self._own_index if self._own_index is not None else index.placements_only()
        self._own_index = own

    @property
    def policy_index(self) -> PrefixIndex | None:
        """The prefix index the current policy is matched against."""
        return self._own_index if self._own_index is not None else self.prefix

    def decide(
        self,
        request_id: str,
        prompt_tokens: int,
        slo_class: SloClass,
        now_s: float,
        oracle_output_tokens: int | None = None,
        prefix_blocks: Sequence[int] = (),
        true_view: TrueView | None = None,
    ) -> Decision:
        """Predict and decide on the current view, committing nothing (``admit`` does both).

        ``prefix_blocks``: the prompt's block ids, in the prefix index's block size (see PrefixIndex); a
        ``PromptBlocks`` is hashed only as far as the match needs. ``true_view``: the simulator's, for a
        policy that routes on the truth (the clairvoyant), in place of the ledger's view."""
        predicted = self.predictor.predict(prompt_tokens, oracle_output_tokens)
        adm = Admission(request_id, prompt_tokens, predicted, slo_class)
        own = self._own_index
        index = own if own is not None else self.prefix
        match = index.match(prefix_blocks) if index is not None and prefix_blocks else {}
        if true_view is not None:
            view = true_view(now_s, self.ledger.decisions, prefix_blocks, prompt_tokens)
        else:
            reuse = index.reuse_ratios() if index is not None and prefix_blocks else None
            ledger = self.ledger
            overlap = ledger.active_overlap(prefix_blocks) if ledger.tracks_active_blocks else None
            view = _panic(ledger.view(now_s, match, reuse, overlap))
        return Decision(adm, view, self.policy.route(adm, view), match)

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
        """Predict, decide on the current view, and commit the decision to the ledger (and the prompt's
        blocks to the prefix index, as placed: all of them, hashing the rest of a ``PromptBlocks``).

        ``prefix_blocks`` and ``true_view``: as ``decide`` takes them."""
        d = self.decide(
            request_id, prompt_tokens, slo_class, now_s, oracle_output_tokens, prefix_blocks, true_view
        )
        if self.on_decision is not None:
            self.on_decision(d)
        decision, match = d.route, d.match
        self.ledger.admit(
            request_id,
            decision.prefill_id,
            decision.decode_id,
            prompt_tokens,
            d.admission.predicted_output_tokens,
            now_s,
            match.get(decision.prefill_id, 0) if match else 0,
            prefix_blocks,
            decision.local,
        )
        index = self.prefix
        if index is not None and prefix_blocks and self.record_placements:
            if not decision.local:
                index.placed(decision.prefill_id, prefix_blocks)
            index.placed(decision.decode_id, prefix_blocks)
        own = self._own_index
        if own is not None and prefix_blocks:
            if not decision.local:
                own.placed(decision.prefill_id, prefix_blocks)
            own.placed(decision.decode_id, prefix_blocks)
        if self.online is not None and not decision.local:
            # a local prefill runs in decode steps: it says nothing of a prefill engine's rate
            pre = next(s for s in d.view.prefill if s.instance_id == decision.prefill_id)
            self._tracked[request_id] = _Tracked(
                decision.prefill_id, decision.decode_id, now_s, pre.in_flight == 0
            )
        return d

    def switch_policy(self, policy: RoutingPolicy) -> None:
        """Route with ``policy`` from the next decision on (the proxy's /admin/policy)."""
        self.policy = policy
        self._follow_policy()

    def prefill_done(self, request_id: str, now_s: float, prompt_tokens: int | None = None) -> None:
        self.ledger.prefill_done(request_id, now_s)
        if not self._tracked:  # nothing tracked without online recalibration: skip the lookups
            return
        t = self._tracked.get(request_id)
        if t is not None and t.unqueued_prefill and prompt_tokens is not None and self.online is not None:
            self.online.calibrator.observe_prefill(prompt_tokens, now_s - t.admitted_s)

    def first_token(self, request_id: str, now_s: float) -> None:
        self.ledger.first_token(request_id, now_s)
        if not self._tracked:
            return
        t = self._tracked.get(request_id)
        if t is not None:
            t.at_first_token = self.ledger.sampled_load(t.decode_id)

    def done(
        self,
        request_id: str,
        prompt_tokens: int,
        output_tokens: int,
        now_s: float,
        ok: bool,
        first_token_s: float | None = None,
    ) -> None:
        self.ledger.done(request_id, now_s, output_tokens, ok)
        if ok:
            self.predictor.observe(prompt_tokens, output_tokens)
        if not self._tracked:
            return
        t = self._tracked.pop(request_id, None)
        if t is None or self.online is None or not ok or output_tokens < 2 or first_token_s is None:
            return
        calibrator = self.online.calibrator
        if t.at_first_token is not None:
            running, kv = self.ledger.sampled_load(t.decode_id)
            batch = max(1, round((running + t.at_first_token[0]) / 2))
            calibrator.observe_decode(
                batch, (kv + t.at_first_token[1]) / 2, (now_s - first_token_s) / (output_tokens - 1)
            )
        new = calibrator.maybe_refit()
        if new is not None:
            self.policy = self.online.policy_factory(new)
            self._follow_policy()

    @property
    def constants(self) -> Calibration | None:
        """The constants online recalibration currently prices with (None without it)."""
        return None if self.online is None else self.online.calibrator.current
