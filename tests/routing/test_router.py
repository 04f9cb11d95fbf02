"""The router's contract, shared by the simulator and the proxy: what the predictor, the policy, the ledger
and online recalibration each hear, and when."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

import pytest

from calroute.costmodel.calibration import Calibration
from calroute.costmodel.online import OnlineCalibrator
from calroute.routing.block_hash import PromptBlocks, block_hashes
from calroute.routing.ledger import Ledger
from calroute.routing.prefix_index import PrefixIndex
from calroute.routing.router import Decision, OnlineRecalibration, Router
from calroute.types import Admission, ClusterView, InstanceSpec, Role, RouteDecision, SloClass

SPECS = [
    InstanceSpec("p0", Role.PREFILL, 60_000),
    InstanceSpec("p1", Role.PREFILL, 60_000),
    InstanceSpec("d0", Role.DECODE, 60_000),
    InstanceSpec("d1", Role.DECODE, 60_000),
]


@dataclass
class Predictor:
    """Predicts a fixed length and records what it is told."""

    name: str = "fixed"
    length: int = 100
    asked: list[tuple[int, int | None]] = field(default_factory=list)
    observed: list[tuple[int, int]] = field(default_factory=list)

    def predict(self, prompt_tokens: int, oracle_output_tokens: int | None = None) -> int:
        self.asked.append((prompt_tokens, oracle_output_tokens))
        return self.length

    def observe(self, prompt_tokens: int, output_tokens: int) -> None:
        self.observed.append((prompt_tokens, output_tokens))


@dataclass
class Policy:
    """Picks the last healthy member of each pool and keeps the views it saw."""

    name: ClassVar[str] = "last_healthy"
    reads_engine_samples: ClassVar[bool] = False
    views: list[ClusterView] = field(default_factory=list)

    def route(self, adm: Admission, view: ClusterView) -> RouteDecision:
        self.views.append(view)
        pre = [s for s in view.prefill if s.healthy][-1]
        dec = [s for s in view.decode if s.healthy][-1]
        return RouteDecision(pre.instance_id, dec.instance_id)


class Calibrator(OnlineCalibrator):
    """Records the observations; hands out ``refit_to`` at the next refit when set."""

    def __init__(self, start: Calibration) -> None:
        super().__init__(start)
        self.prefills: list[tuple[int, float]] = []
        self.decodes: list[tuple[int, float, float]] = []
        self.refit_to: Calibration | None = None

    def observe_prefill(self, prompt_tokens: int, latency_s: float) -> None:
        self.prefills.append((prompt_tokens, latency_s))

    def observe_decode(self, batch: int, context_tokens: float, tpot_s: float) -> None:
        self.decodes.append((batch, context_tokens, tpot_s))

    def maybe_refit(self) -> Calibration | None:
        new, self.refit_to = self.refit_to, None
        if new is not None:
            self.current = new
        return new


def in_flight(ledger: Ledger, now_s: float) -> dict[str, int]:
    v = ledger.view(now_s)
    return {s.instance_id: s.in_flight for s in v.prefill + v.decode}


def test_admit_predicts_routes_and_commits(calibration: Calibration) -> None:
    ledger, predictor, policy = Ledger(SPECS, calibration), Predictor(), Policy()
    heard: list[Decision] = []
    router = Router(policy, predictor, ledger, on_decision=heard.append)
    d = router.admit("r", 700, SloClass.TIGHT, 1.0, oracle_output_tokens=42)
    assert predictor.asked == [(700, 42)]
    assert d.admission == Admission("r", 700, 100, SloClass.TIGHT)
    assert (d.route.prefill_id, d.route.decode_id) == ("p1", "d1")
    assert heard == [d] and d.view is policy.views[0] and d.match == {}
    assert policy.views[0].now_s == 1.0
    assert in_flight(ledger, 1.0) == {"p0": 0, "p1": 1, "d0": 0, "d1": 1}
    router.prefill_done("r", 1.2, 700)
    assert in_flight(ledger, 1.2)["p1"] == 0
    router.first_token("r", 1.3)
    router.done("r", 700, 55, 2.0, ok=True, first_token_s=1.3)
    assert predictor.observed == [(700, 55)]
    assert in_flight(ledger, 2.0) == {"p0": 0, "p1": 0, "d0": 0, "d1": 0}


def test_decide_commits_nothing_and_admit_places_the_whole_lazy_prompt(calibration: Calibration) -> None:
    ledger, policy = Ledger(SPECS, calibration), Policy()
    index = PrefixIndex(SPECS, 16)
    tokens = list(range(100 * 16))
    hashes = block_hashes(tokens, 16)
    index.stored("p1", hashes[:10])
    router = Router(policy, Predictor(), ledger, prefix=index)
    blocks = PromptBlocks(tokens, 16, first_blocks=4)
    d = router.decide("r", len(tokens), SloClass.TIGHT, 1.0, prefix_blocks=blocks)
    assert d.match == {"p1": 160} and [s.cached_tokens for s in d.view.prefill] == [0, 160]
    assert blocks.hashed == 4 + 8  # block 10 is nobody's: the walk stopped in the second stretch
    assert in_flight(ledger, 1.0) == {"p0": 0, "p1": 0, "d0": 0, "d1": 0} and len(index) == 10
    assert router.admit("r", len(tokens), SloClass.TIGHT, 1.0, prefix_blocks=blocks).match == {"p1": 160}
    assert in_flight(ledger, 1.0) == {"p0": 0, "p1": 1, "d0": 0, "d1": 1}
    assert index.match(hashes) == {"p1": 1600, "d1": 1600}  # placed: every block, hashed for it


def test_a_true_view_given_with_the_decision_replaces_the_ledgers(calibration: Calibration) -> None:
    ledger, policy = Ledger(SPECS, calibration), Policy()
    router = Router(policy, Predictor(), ledger)
    truth = ledger.view(5.0).replace(now_s=-1.0)
    asked: list[tuple[float, int, int]] = []

    def true_view(now_s: float, seq: int, blocks: Sequence[int], prompt_tokens: int) -> ClusterView:
        asked.append((now_s, seq, prompt_tokens))
        return truth

    d = router.admit("r", 700, SloClass.LOOSE, 2.0, true_view=true_view)
    assert d.view is truth and policy.views == [truth] and asked == [(2.0, 0, 700)]
    assert router.admit("s", 700, SloClass.LOOSE, 3.0).view.now_s == 3.0  # the next, on the ledger's


def test_a_failed_request_teaches_the_predictor_nothing(calibration: Calibration) -> None:
    ledger, predictor = Ledger(SPECS, calibration), Predictor()
    router = Router(Policy(), predictor, ledger)
    router.admit("r", 700, SloClass.LOOSE, 0.0)
    router.done("r", 700, 0, 0.5, ok=False)
    assert predictor.observed == [] and in_flight(ledger, 0.5)["d1"] == 0


@pytest.mark.parametrize(
    ("unhealthy", "routable_prefill", "routable_decode"),
    [
        ((), ("p0", "p1"), ("d0", "d1")),
        (("p1",), ("p0",), ("d0", "d1")),
        (("d0", "d1"), ("p0", "p1"), ("d0", "d1")),  # a pool with no healthy member: all are tried
        (("p0", "p1", "d1"), ("p0", "p1"), ("d0",)),
    ],
)
def test_panic_mode_per_pool(
    calibration: Calibration,
    unhealthy: tuple[str, ...],
    routable_prefill: tuple[str, ...],
    routable_decode: tuple[str, ...],
) -> None:
    ledger, policy = Ledger(SPECS, calibration), Policy()
    for engine in unhealthy:
        ledger.set_healthy(engine, False)
    Router(policy, Predictor(), ledger).admit("r", 10, SloClass.LOOSE, 0.0)
    [view] = policy.views
    assert tuple(s.instance_id for s in view.prefill if s.healthy) == routable_prefill
    assert tuple(s.instance_id for s in view.decode if s.healthy) == routable_decode


def test_online_recalibration_hears_unqueued_prefills_and_decodes_then_swaps_the_policy(
    calibration: Calibration,
) -> None:
    ledger, calibrator = Ledger(SPECS, calibration), Calibrator(calibration)
    built: list[Calibration] = []

    def factory(cal: Calibration) -> Policy:
        built.append(cal)
        return Policy()

    first = Policy()
    router = Router(first, Predictor(), ledger, online=OnlineRecalibration(calibrator, factory))
    router.admit("a", 800, SloClass.LOOSE, 0.0)  # p1 was idle: its prefill time is a clean sample
    router.admit("b", 300, SloClass.LOOSE, 0.1)  # p1 busy with "a": queued, no sample
    router.prefill_done("a", 0.4, 800)
    router.prefill_done("b", 0.6, 300)
    assert calibrator.prefills == [(800, pytest.approx(0.4))]

    ledger.record_sample("d1", kv_used_tokens=2000, running=4, waiting=0, now_s=0.5)
    router.first_token("a", 0.5)
    ledger.record_sample("d1", kv_used_tokens=4000, running=6, waiting=0, now_s=1.5)
    refitted = replace(calibration, tau_pre_s=calibration.tau_pre_s * 2)
    calibrator.refit_to = refitted
    router.done("a", 800, 11, 1.5, ok=True, first_token_s=0.5)
    # batch and context: the means of the decode engine's samples at first and last token
    assert calibrator.decodes == [(5, 3000.0, pytest.approx(0.1))]
    assert built == [refitted] and router.policy is not first and router.constants is refitted

    # A request of one token has no TPOT; a failed one teaches nothing.
    router.first_token("b", 0.7)
    router.done("b", 300, 1, 0.8, ok=True, first_token_s=0.7)
    assert len(calibrator.decodes) == 1


def test_without_online_recalibration_nothing_is_tracked(calibration: Calibration) -> None:
    router = Router(Policy(), Predictor(), Ledger(SPECS, calibration))
    router.admit("a", 800, SloClass.LOOSE, 0.0)
    router.prefill_done("a", 0.4, 800)
    router.first_token("a", 0.5)
    router.done("a", 800, 11, 1.5, ok=True, first_token_s=0.5)
    assert router.constants is None and router._tracked == {}


@dataclass
class BlockReader(Policy):
    """A Policy that asks the ledger to count the active sequences' blocks."""

    reads_active_blocks: bool = True


@dataclass
class PlacementReader(Policy):
    """A Policy matched against the router's own placements alone."""

    prefix_source: str = "approximate"


def test_the_ledger_counts_blocks_only_for_a_policy_that_reads_them(calibration: Calibration) -> None:
    ledger, plain, reader = Ledger(SPECS, calibration), Policy(), BlockReader()
    router = Router(plain, Predictor(), ledger, prefix=PrefixIndex(SPECS, 16))
    router.admit("a", 64, SloClass.LOOSE, 0.0, prefix_blocks=[1, 2, 3, 4])
    assert not ledger.tracks_active_blocks
    assert [(s.active_tokens, s.active_overlap_tokens) for s in plain.views[-1].decode] == [(0, 0), (0, 0)]
    router.switch_policy(reader)
    router.admit("b", 64, SloClass.LOOSE, 0.0, prefix_blocks=[1, 2, 3, 5])
    router.decide("c", 64, SloClass.LOOSE, 0.0, prefix_blocks=[1, 2, 9, 9])
    d1 = reader.views[-1].decode[1]
    assert ledger.tracks_active_blocks
    # a's blocks, admitted before, are not counted; b's are, and c's first two blocks are among them
    assert (d1.active_tokens, d1.active_shared_tokens, d1.active_overlap_tokens) == (128, 0, 32)
    router.switch_policy(Policy())
    assert not ledger.tracks_active_blocks


class HeardIndex(PrefixIndex):
    hears_events = True


@pytest.mark.parametrize(
    ("index_cls", "record_placements", "own"),
    [
        (PrefixIndex, True, False),  # the run's index is the router's placements: shared
        (PrefixIndex, False, True),  # KV events only (the simulator's precise source)
        (HeardIndex, True, True),  # events and placements (the proxy's PreciseIndex)
    ],
)
def test_a_policy_on_the_approximate_source_is_matched_against_placements_alone(
    index_cls: type[PrefixIndex], record_placements: bool, own: bool, calibration: Calibration
) -> None:
    index = index_cls(SPECS, 16)
    index.stored("p0", [1, 2, 3])  # what an engine's events said, never a placement
    policy = PlacementReader()
    router = Router(
        policy, Predictor(), Ledger(SPECS, calibration), prefix=index, record_placements=record_placements
    )
    assert (router.policy_index is not index) == own
    d = router.admit("a", 64, SloClass.LOOSE, 0.0, prefix_blocks=[1, 2, 3, 4])
    assert d.match == ({} if own else {"p0": 48})
    # the placement (p1, d1) is what the policy's index learns
    assert router.decide("b", 64, SloClass.LOOSE, 0.1, prefix_blocks=[1, 2, 3, 4]).match == (
        {"p1": 64, "d1": 64} if own else {"p0": 48, "p1": 64, "d1": 64}
    )
    # the run's index is unchanged by the policy's own
    assert index.match([1, 2, 3, 4]) == (
        {"p0": 48} if not record_placements else {"p0": 48, "p1": 64, "d1": 64}
    )
    router.switch_policy(Policy())
    assert router.policy_index is index
