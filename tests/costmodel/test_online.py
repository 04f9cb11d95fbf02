"""Online recalibration: a router started with wrong constants converges to the hardware's."""

from __future__ import annotations

import random

import pytest

from calroute.costmodel.calibration import mismatched
from calroute.costmodel.online import OnlineCalibrator
from calroute.costmodel.predictors import make_predictor
from calroute.costmodel.profiles import get_profile
from calroute.errors import CalibrationError
from calroute.policies import make_policy
from calroute.routing.ledger import Ledger
from calroute.routing.router import OnlineRecalibration, Router
from calroute.sim.simulator import ClusterShape, ClusterSim
from calroute.workload.families import generate_family

PROFILE = get_profile("a40-qwen2.5-3b")
TRUE = PROFILE.calibration


def test_refits_from_observations_of_the_true_curves() -> None:
    oc = OnlineCalibrator(mismatched(TRUE), window=200, refit_every=40, min_samples=20)
    rng = random.Random(0)
    for i in range(120):
        p = rng.randint(32, 4000)
        oc.observe_prefill(p, TRUE.prefill.single_s(p) * rng.uniform(0.98, 1.02))
        b = rng.randint(1, 64)
        c = b * rng.randint(200, 3000)
        oc.observe_decode(b, c, TRUE.decode.step_s(b, c) * rng.uniform(0.98, 1.02))
        new = oc.maybe_refit()
        assert (new is not None) == ((i + 1) % 40 == 0)
    assert oc.refits == 3
    assert oc.current.tau_pre_s == pytest.approx(TRUE.tau_pre_s, rel=0.05)
    assert oc.current.tau_dec_s == pytest.approx(TRUE.tau_dec_s, rel=0.05)
    assert oc.current.slo == TRUE.slo  # the service promised does not move
    assert oc.current.provenance["source"] == "online"


def test_too_few_or_degenerate_samples_keep_the_constants() -> None:
    start = mismatched(TRUE)
    oc = OnlineCalibrator(start, window=50, refit_every=5, min_samples=10)
    for _ in range(5):
        oc.observe_decode(4, 4000.0, 0.02)
    assert oc.maybe_refit() is None  # not enough samples yet
    for _ in range(20):
        oc.observe_prefill(100, 0.01)  # one prompt length only: the prefill fit cannot work
        oc.observe_decode(4, 4000.0, 0.02)  # one batch size only: neither can the decode fit
    assert oc.maybe_refit() is None and oc.current is start
    with pytest.raises(CalibrationError):
        OnlineCalibrator(start, window=5, min_samples=10)


def test_a_simulated_router_started_mismatched_converges() -> None:
    wrong = mismatched(TRUE)
    shape = ClusterShape(2, 4)
    oc = OnlineCalibrator(wrong)
    router = Router(
        make_policy("marginal_cost", {}, wrong),
        make_predictor("bucket"),
        Ledger(shape.instances(PROFILE.limits.kv_capacity_tokens), wrong),
        online=OnlineRecalibration(oc, lambda cal: make_policy("marginal_cost", {}, cal)),
    )
    ClusterSim(PROFILE, shape, router, "marginal_cost").run(
        generate_family("mixed-bursty", 11.0, 1500, 0), lambda rec: None
    )
    assert oc.refits > 5
    assert router.constants is oc.current
    assert oc.current.tau_pre_s == pytest.approx(TRUE.tau_pre_s, rel=0.05)
    assert oc.current.tau_dec_s == pytest.approx(TRUE.tau_dec_s, rel=0.05)
    assert router.policy.tau_dec_s == oc.current.tau_dec_s  # type: ignore[attr-defined]
