"""The live backend's saturation search: seeded by the calibrated simulator, probing through the live runner.

The runner is replaced by a goodput curve so the search's wiring is tested without engines; the live runs
themselves are covered by tests/test_cli_run.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from calroute.cluster import ClusterFile
from calroute.costmodel.profiles import DEFAULT_PROFILE, get_profile
from calroute.experiments.backends import SimBackend
from calroute.experiments.cells import Run, Variant
from calroute.experiments.live import LiveBackend
from calroute.harness.live import LiveSetup
from calroute.metrics import RunSummary

CAL = get_profile(DEFAULT_PROFILE).calibration


def _summary(goodput: float) -> RunSummary:
    good = round(100 * goodput)
    return RunSummary(100, 100, good, goodput, 0.1, 0.2, 0.01, 0.02, 10.0, good / 10.0, {"ok": 100})


@pytest.mark.parametrize(
    ("mode", "collapse_at_sim_fraction"),
    [("live", 0.7), ("live", 1.4), ("sim", 0.7)],
)
def test_live_search_starts_at_half_the_calibrated_simulators_rate(
    tmp_path: Path, mode: str, collapse_at_sim_fraction: float
) -> None:
    sim_rps = SimBackend(get_profile(DEFAULT_PROFILE)).saturation_rate(2, 4, "mixed-bursty", 300)
    collapse_rps = collapse_at_sim_fraction * sim_rps
    probed: list[float] = []

    def fake_run(
        setup: LiveSetup,
        variant: Variant,
        workload: str,
        requests: int,
        rate: float,
        seed: int,
        run_dir: Path,
    ) -> Run:
        assert variant.policy == "round_robin" and workload == "mixed-bursty" and requests == 300
        probed.append(rate)
        return Run(variant.label, seed, _summary(0.95 if rate < collapse_rps else 0.5))

    engines = [("prefill-0", "prefill"), ("prefill-1", "prefill")] + [
        (f"decode-{i}", "decode") for i in range(4)
    ]
    cluster = ClusterFile.from_dict(
        {
            "kind": "emulated",
            "model": "emulated",
            "max_model_len": 32768,
            "engines": [
                {"id": e, "role": r, "url": f"http://127.0.0.1:{9 + i}", "kv_capacity_tokens": 60000}
                for i, (e, r) in enumerate(engines)
            ],
        }
    )
    backend = LiveBackend(
        "emulated", tmp_path, fixed=LiveSetup(cluster, tmp_path / "c.yaml", CAL), saturation=mode
    )
    backend._run = fake_run  # type: ignore[method-assign]

    rate = backend.saturation_rate(2, 4, "mixed-bursty", 300)
    if mode == "sim":
        assert probed == [] and rate == pytest.approx(sim_rps)
        return
    assert probed[0] == pytest.approx(sim_rps / 2)
    assert rate == pytest.approx(collapse_rps, rel=0.03)
