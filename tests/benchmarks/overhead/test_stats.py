"""The added TTFT of benchmarks/proxy_overhead.py: which rounds it leaves out (its intervals are
calroute.results.stats's, tested in tests/results/test_stats.py)."""

from __future__ import annotations

import math

import numpy as np
from benchmarks.overhead.client import Outcome
from benchmarks.overhead.stats import added_ttft

from tests.results.test_stats import offset_clusters


def _outcomes(ttfts_s: list[float]) -> list[Outcome]:
    return [Outcome(scheduled_s=float(i), sent_s=float(i), ttft_s=t) for i, t in enumerate(ttfts_s)]


def test_a_round_disturbed_in_either_mode_is_left_out_of_the_added_ttft() -> None:
    """A round where other jobs slowed ``direct`` would flatter the proxy by their delay: left out, the
    added TTFT is the proxy's own (1 ms), with every round's own figure still reported."""
    rounds = offset_clusters([0.001] * 6, 200, seed=4)
    base = [_outcomes(b) for _, b in rounds]
    mine = [_outcomes(a) for a, _ in rounds]
    base[2] = _outcomes([x + 0.5 for _, b in rounds[2:3] for x in b])  # direct, beside other jobs
    mine[4] = _outcomes([x + 0.2 for a, _ in rounds[4:5] for x in a])  # the proxy, beside other jobs
    base_rounds = [{"round": k + 1, "disturbed": k == 2} for k in range(6)]
    my_rounds = [{"round": k + 1, "disturbed": k == 4} for k in range(6)]
    row = added_ttft(mine, my_rounds, base, base_rounds, np.random.default_rng(0))
    assert row["rounds_compared"] == 4 and row["pairs"] == 800
    for q in (50, 99):
        assert math.isclose(row[f"added_p{q}_ms"], 1.0, abs_tol=1e-9)
        assert math.isclose(row[f"added_p{q}_ci95_ms"][0], 1.0, abs_tol=1e-9)
    assert math.isclose(my_rounds[2]["added_p50_ms"], -499.0, abs_tol=1e-6)
    assert math.isclose(my_rounds[4]["added_p50_ms"], 201.0, abs_tol=1e-6)
