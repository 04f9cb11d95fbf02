"""`calibrate_cluster`'s budget split, with the sweeps replaced by synthetic samples and a fake clock."""

from __future__ import annotations

from typing import Any

import pytest

from calroute.calibrate import run
from calroute.calibrate.measure import DecodeMeasurement, HandoffMeasurement, PrefillMeasurement
from calroute.cluster.file import ClusterFile
from calroute.costmodel.profiles import get_profile
from tests.conftest import unreachable_cluster

PROFILE = get_profile("a40-qwen2.5-3b").calibration


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def perf_counter(self) -> float:
        return self.now_s


def _calibrate_with(
    monkeypatch: pytest.MonkeyPatch, budget_s: float, prefill_phase_s: float
) -> tuple[float, list[str]]:
    """Run a calibration whose prefill sweep takes ``prefill_phase_s``; the decode sweep's budget and the
    progress lines."""
    clock = FakeClock()
    monkeypatch.setattr(run, "time", clock)  # run reads only time.perf_counter
    decode_budgets: list[float] = []

    async def kv_bytes(client: Any, cluster: ClusterFile) -> tuple[int, str]:
        return PROFILE.kv_bytes_per_token, "test"

    async def warm_up(client: Any, cluster: ClusterFile, progress: Any) -> None:
        clock.now_s += 1.0

    async def prefill_sweep(
        client: Any, cluster: ClusterFile, budget_s: float, progress: Any
    ) -> tuple[list[PrefillMeasurement], list[HandoffMeasurement]]:
        clock.now_s += prefill_phase_s
        lengths = [64, 128, 256, 512, 1024, 2048, 4096] * 2
        prefills = [PrefillMeasurement("prefill-0", p, PROFILE.prefill.single_s(p)) for p in lengths]
        handoffs = [
            HandoffMeasurement(
                "prefill-0", "decode-0", p, PROFILE.transfer_s(p) + PROFILE.decode.step_s(1, p)
            )
            for p in lengths
        ]
        return prefills, handoffs

    async def decode_sweep(
        client: Any, cluster: ClusterFile, prefill: Any, budget_s: float, progress: Any
    ) -> list[DecodeMeasurement]:
        decode_budgets.append(budget_s)
        items = [(b, p) for b in (1, 2, 4, 8, 16, 32, 64) for p in (128, 1024)]
        return [
            DecodeMeasurement("decode-0", b, p, 40, b * (p + 20), PROFILE.decode.step_s(b, b * (p + 20)), 32)
            for b, p in items
        ]

    monkeypatch.setattr(run, "resolve_kv_bytes_per_token", kv_bytes)
    monkeypatch.setattr(run, "warm_up", warm_up)
    monkeypatch.setattr(run, "prefill_sweep", prefill_sweep)
    monkeypatch.setattr(run, "decode_sweep", decode_sweep)
    lines: list[str] = []
    cal, _ = run.calibrate_cluster(unreachable_cluster(1, 1), budget_s, lines.append, seed=1)
    assert cal.tau_dec_s == pytest.approx(PROFILE.tau_dec_s, rel=0.01)
    return decode_budgets[0], lines


@pytest.mark.parametrize(
    ("budget_s", "prefill_phase_s", "decode_budget_s", "overrun"),
    [
        (61.0, 10.0, 0.9 * 60.0 - 10.0, False),  # the usual split: decode gets what prefill left
        (61.0, 50.0, run.MIN_DECODE_S, True),  # a slow prefill sweep: decode still gets its minimum
        (5.0, 2.0, 0.9 * run.MIN_SWEEP_S - 2.0, False),  # a tiny budget: the sweeps' minimum applies first
    ],
)
def test_the_decode_sweep_gets_its_share_and_never_less_than_its_minimum(
    monkeypatch: pytest.MonkeyPatch,
    budget_s: float,
    prefill_phase_s: float,
    decode_budget_s: float,
    overrun: bool,
) -> None:
    got_s, lines = _calibrate_with(monkeypatch, budget_s, prefill_phase_s)
    assert got_s == pytest.approx(decode_budget_s)
    assert any("measuring decode for" in line and "overrun" in line for line in lines) == overrun
