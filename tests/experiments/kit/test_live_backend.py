"""The live backend's saturation search: seeded by the calibrated simulator, probing through the live runner.

Only the live run itself is replaced, by a goodput curve, so the search's wiring is tested without engines;
the live runs themselves are covered by tests/cli/test_run.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from calroute.costmodel.profiles import DEFAULT_PROFILE, EngineLimits, get_profile, profile_from_calibration
from calroute.experiments.kit import live_backend as live
from calroute.experiments.kit.cells import SaturationQuery
from calroute.experiments.kit.live_backend import LiveBackend
from calroute.experiments.kit.sim_backend import SimBackend
from calroute.harness.live import LiveRun, LiveSetup
from calroute.results.metrics import RunSummary
from calroute.routing.variant import Variant
from calroute.types import RequestSpec
from tests.conftest import unreachable_cluster

CAL = get_profile(DEFAULT_PROFILE).calibration
REQUESTS = 300


def _summary(goodput: float) -> RunSummary:
    good = round(100 * goodput)
    return RunSummary(100, 100, good, goodput, 0.1, 0.2, 0.01, 0.02, 10.0, good / 10.0, {"ok": 100})


def _backend(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    mode: str,
    goodput_at: Callable[[float], float],
    probed: list[float],
) -> LiveBackend:
    def fake_run_variant(
        setup: LiveSetup, variant: Variant, requests: Sequence[RequestSpec], run_dir: Path, seed: int
    ) -> LiveRun:
        # The backend's own runner builds the schedule and names the probe's directory by its rate.
        assert variant.policy == "round_robin" and len(requests) == REQUESTS
        rate = float(run_dir.name.removeprefix("rate-"))
        probed.append(rate)
        return LiveRun(_summary(goodput_at(rate)), True, 0.0)

    monkeypatch.setattr(live, "run_variant", fake_run_variant)
    cluster = unreachable_cluster(2, 4)
    backend = LiveBackend(
        "emulated", tmp_path, fixed=LiveSetup(cluster, tmp_path / "c.yaml", CAL), saturation=mode
    )
    return backend


@pytest.mark.parametrize(
    ("mode", "collapse_at_sim_fraction"),
    [("live", 0.7), ("live", 1.4), ("sim", 0.7)],
)
def test_live_search_starts_at_half_the_calibrated_simulators_rate(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mode: str, collapse_at_sim_fraction: float
) -> None:
    sim_rps = SimBackend(get_profile(DEFAULT_PROFILE)).saturation_rate(
        SaturationQuery(2, 4, "mixed-bursty", REQUESTS)
    )
    collapse_rps = collapse_at_sim_fraction * sim_rps
    probed: list[float] = []
    backend = _backend(monkeypatch, tmp_path, mode, lambda rate: 0.95 if rate < collapse_rps else 0.5, probed)

    rate = backend.saturation_rate(SaturationQuery(2, 4, "mixed-bursty", REQUESTS))
    if mode == "sim":
        assert probed == [] and rate == pytest.approx(sim_rps)
        return
    assert probed[0] == pytest.approx(sim_rps / 2)
    assert rate == pytest.approx(collapse_rps, rel=0.03)


@pytest.mark.parametrize(
    ("live_unloaded_goodput", "relative_to"),
    # as on the simulator: its relative target is reached live; much worse live: relative to the live best
    [(None, "sim"), (0.5, "live")],
)
def test_a_workload_that_misses_the_target_unloaded_is_not_probed_at_hour_long_rates(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, live_unloaded_goodput: float | None, relative_to: str
) -> None:
    sim = SimBackend(get_profile(DEFAULT_PROFILE)).saturation(SaturationQuery(2, 4, "document", REQUESTS))
    assert sim.relative and sim.target < 0.85  # long tight-SLO prompts miss TTFT even unloaded
    unloaded = sim.target / 0.85 if live_unloaded_goodput is None else live_unloaded_goodput
    collapse_rps = 0.8 * sim.rate_rps
    probed: list[float] = []

    def goodput_at(rate: float) -> float:
        return unloaded if rate < collapse_rps else 0.5 * unloaded

    rate = _backend(monkeypatch, tmp_path, "live", goodput_at, probed).saturation_rate(
        SaturationQuery(2, 4, "document", REQUESTS)
    )
    start_rps = sim.rate_rps / 2
    assert min(probed) >= start_rps / 8 * 0.999  # the live floor, not the simulator's 1/64
    if relative_to == "sim":
        assert rate == pytest.approx(collapse_rps, rel=0.03)
    else:  # 0.85 x the best live probe is 0.425, crossed at the same collapse
        assert len(probed) > 4 and rate == pytest.approx(collapse_rps, rel=0.03)


def test_the_simulated_search_runs_as_the_live_router_does(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """--saturation sim on a prefix family: the simulator with the cluster's engine limits (here a third of
    the profile's KV capacity) and the proxy's source, KV events, not the router's own placements."""
    small = unreachable_cluster(2, 4)
    small = replace(small, engines=tuple(replace(e, kv_capacity_tokens=20_000) for e in small.engines))
    backend = LiveBackend(
        "emulated", tmp_path, fixed=LiveSetup(small, tmp_path / "c.yaml", CAL), saturation="sim"
    )
    query = SaturationQuery(2, 4, "shared-prefix", REQUESTS, "cache_aware")
    expected = SimBackend(
        profile_from_calibration(CAL, EngineLimits(kv_capacity_tokens=20_000, max_model_len=32768)),
        prefix_source="precise",
        kv_event_delay_s=live.LIVE_KV_EVENT_DELAY_S,
    ).saturation_rate(query)
    default = SimBackend(get_profile(DEFAULT_PROFILE)).saturation_rate(query)
    assert backend.saturation_rate(query) == pytest.approx(expected)
    assert expected != pytest.approx(default)
