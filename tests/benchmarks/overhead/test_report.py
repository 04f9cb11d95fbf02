"""The verdicts on the latency targets (benchmarks/overhead/report.py)."""

from __future__ import annotations

from typing import Any

import pytest
from benchmarks.overhead.report import targets


def _row(compared: int, rounds: int, added_ms: float, ci_ms: list[float]) -> dict[str, Any]:
    return {
        "rounds": [{"round": k + 1} for k in range(rounds)],
        "rounds_compared": compared,
        "added_p50_ms": added_ms,
        "added_p50_ci95_ms": ci_ms,
        "added_p99_ms": added_ms,
        "added_p99_ci95_ms": ci_ms,
    }


@pytest.mark.parametrize(
    ("row", "p50", "p99"),
    [
        (_row(16, 16, 0.4, [0.2, 0.7]), "met: +0.40 ms (95 % CI +0.20 .. +0.70) vs < 1 ms", "met: +0.40"),
        (_row(16, 16, 0.9, [0.5, 1.3]), "not resolved: +0.90 ms (95 % CI +0.50 .. +1.30) vs < 1 ms", "met"),
        (_row(8, 16, 1.0, [1.0, 1.0]), "missed: +1.00 ms (95 % CI +1.00 .. +1.00) vs < 1 ms", "met"),
        (
            _row(9, 16, 6.0, [5.5, 7.0]),
            "missed: +6.00",
            "missed: +6.00 ms (95 % CI +5.50 .. +7.00) vs < 5 ms",
        ),
        (_row(7, 16, 0.1, [0.0, 0.2]), "not judged: only 7 of 16 rounds", "not judged: only 7 of 16 rounds"),
    ],
)
def test_a_target_is_met_only_under_its_whole_interval_and_judged_on_half_the_rounds(
    row: dict[str, Any], p50: str, p99: str
) -> None:
    verdicts = targets({"at_rate": [{"rate": 220.0, "modes": {"calroute": row}}]})
    assert set(verdicts) == {"added p50 < 1 ms at 220.0 req/s", "added p99 < 5 ms at 220.0 req/s"}
    assert verdicts["added p50 < 1 ms at 220.0 req/s"].startswith(p50)
    assert verdicts["added p99 < 5 ms at 220.0 req/s"].startswith(p99)


def test_the_sustainable_rate_is_compared_with_vllm_routers() -> None:
    ramp = {"calroute": {"sustained_rps": 384.4}, "vllm-router": {"sustained_rps": 440.1}}
    assert targets({"ramp": ramp})["sustainable rate >= vllm-router's"].startswith(
        "missed: calroute 384.4 vs vllm-router 440.1 req/s (-1.0 fine steps"
    )
    ramp["calroute"]["sustained_rps"] = 440.1
    assert targets({"ramp": ramp})["sustainable rate >= vllm-router's"].startswith("met")
    assert targets({"ramp": {"calroute": {"sustained_rps": 384.4}}}) == {
        "sustainable rate >= vllm-router's": "not measured: vllm-router unavailable"
    }
