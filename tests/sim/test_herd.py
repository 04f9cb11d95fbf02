"""The herd's mitigation (NearBest: each pool's engine drawn among the near-best) and its measure
(HerdCounter: two routers' picks of one decode engine within a window)."""

from __future__ import annotations

from typing import ClassVar

import pytest

from calroute.errors import ConfigError
from calroute.sim.herd import HerdCounter, HerdStats, NearBest
from calroute.types import Admission, ClusterView, RouteDecision, local_decision
from tests.conftest import make_admission, make_view


class Fixed:
    """A policy answering one decision, whatever it is asked."""

    name: ClassVar[str] = "fixed"
    reads_engine_samples: ClassVar[bool] = True
    reads_active_blocks = True
    prefix_source = "approximate"

    def __init__(self, decision: RouteDecision) -> None:
        self.decision = decision

    def route(self, adm: Admission, view: ClusterView) -> RouteDecision:
        return self.decision


# decode scores of decode-0..3: decode-1 best, decode-3 close to it, decode-0 and decode-2 far
SCORES = (10.0, 1.0, 9.0, 1.5)
SCORED = RouteDecision("prefill-0", "decode-1", (1.0, 5.0), SCORES)


def decode_picks(tolerance: float, decision: RouteDecision = SCORED, seqs: int = 200) -> set[str]:
    policy = NearBest(Fixed(decision), tolerance, seed=3)
    return {policy.route(make_admission(), make_view(seq=seq)).decode_id for seq in range(seqs)}


@pytest.mark.parametrize(
    ("tolerance", "decision", "want"),
    [
        (0.0, SCORED, {"decode-1"}),  # only ties with the best: the inner pick
        (0.1, SCORED, {"decode-1", "decode-3"}),  # decode-3 is 0.5 of a spread of 9 above the best
        (1.0, SCORED, {"decode-0", "decode-1", "decode-2", "decode-3"}),
        (1.0, RouteDecision("prefill-0", "decode-2"), {"decode-2"}),  # no scores: as it is
        (1.0, local_decision("decode-0", "short", SCORES), {"decode-0"}),  # local: as it is
        (1.0, RouteDecision("prefill-0", "decode-1", (), SCORES[:3]), {"decode-1"}),  # scores off the pool
    ],
    ids=["ties only", "near-best", "anyone", "no scores", "local", "misaligned scores"],
)
def test_near_best_draws_among_the_candidates_close_to_the_best(
    tolerance: float, decision: RouteDecision, want: set[str]
) -> None:
    assert decode_picks(tolerance, decision) == want


def test_near_best_is_a_pure_function_of_the_view_and_its_seed() -> None:
    a = NearBest(Fixed(SCORED), 1.0, seed=3)
    b = NearBest(Fixed(SCORED), 1.0, seed=4)
    view = make_view(seq=17)
    assert a.route(make_admission(), view) == a.route(make_admission(), view)
    draws_a = [a.route(make_admission(), make_view(seq=s)).decode_id for s in range(50)]
    draws_b = [b.route(make_admission(), make_view(seq=s)).decode_id for s in range(50)]
    assert draws_a != draws_b  # routers given different seeds spread differently


def test_near_best_keeps_to_healthy_engines_and_the_prefill_pool_too() -> None:
    view = make_view(decode=[{}, {}, {"healthy": False}, {}], seq=1)
    # the inner policy scores the healthy members only, as the registry's policies do
    decision = RouteDecision("prefill-0", "decode-1", (1.0, 1.0), (4.0, 1.0, 4.0))
    policy = NearBest(Fixed(decision), 1.0, seed=0)
    picks = {policy.route(make_admission(), view.replace(seq=s)) for s in range(200)}
    assert {d.decode_id for d in picks} == {"decode-0", "decode-1", "decode-3"}
    assert {d.prefill_id for d in picks} == {"prefill-0", "prefill-1"}


def test_near_best_forwards_what_the_router_reads_off_its_policy() -> None:
    policy = NearBest(Fixed(SCORED), 0.2, seed=0)
    assert policy.reads_engine_samples and policy.reads_active_blocks
    assert policy.prefix_source == "approximate" and not policy.needs_true_state


@pytest.mark.parametrize("tolerance", [-0.1, 1.5])
def test_a_tolerance_out_of_range_is_a_config_error(tolerance: float) -> None:
    with pytest.raises(ConfigError, match="tolerance"):
        NearBest(Fixed(SCORED), tolerance, seed=0)


# admissions (time, router, prefill engine, decode engine), window 0.01 s
HERD_CASES = {
    "alone": ([(0.0, 0, "p0", "d0")], HerdStats(0.01)),
    "two routers, one pair of engines, at once": (
        [(0.0, 0, "p0", "d0"), (0.005, 1, "p0", "d0")],
        HerdStats(0.01, cross_pairs=1, cross_same_decode=1, cross_same_prefill=1),
    ),
    "two routers, two decode engines": (
        [(0.0, 0, "p0", "d0"), (0.005, 1, "p0", "d1")],
        HerdStats(0.01, cross_pairs=1, cross_same_prefill=1),
    ),
    "outside the window": ([(0.0, 0, "p0", "d0"), (0.02, 1, "p0", "d0")], HerdStats(0.01)),
    "one router twice": (
        [(0.0, 0, "p0", "d0"), (0.001, 0, "p1", "d0")],
        HerdStats(0.01, own_pairs=1, own_same_decode=1),
    ),
    "three in a window": (
        [(0.0, 0, "p0", "d0"), (0.002, 1, "p1", "d0"), (0.004, 0, "p1", "d1")],
        HerdStats(0.01, cross_pairs=2, cross_same_decode=1, cross_same_prefill=1, own_pairs=1),
    ),
}


@pytest.mark.parametrize(("admissions", "want"), HERD_CASES.values(), ids=list(HERD_CASES))
def test_the_herd_counts_pairs_within_the_window(
    admissions: list[tuple[float, int, str, str]], want: HerdStats
) -> None:
    counter = HerdCounter(0.01)
    for t, router, prefill, decode in admissions:
        counter.admitted(t, router, prefill, decode)
    assert counter.stats() == want


def test_the_herd_window_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="window"):
        HerdCounter(0.0)
