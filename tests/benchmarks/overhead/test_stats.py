"""The added-TTFT intervals of benchmarks/proxy_overhead.py: what they widen for, what they leave out."""

from __future__ import annotations

import math

import numpy as np
from benchmarks.overhead.client import Outcome
from benchmarks.overhead.stats import added_ttft, bootstrap_paired_diff, bootstrap_rounds_diff


def _rounds(offsets_s: list[float], n: int, seed: int) -> list[tuple[list[float], list[float]]]:
    """Rounds of n pairs: ``direct`` TTFTs drawn per round (each round at its own level), the mode's the same
    plus that round's offset."""
    rng = np.random.default_rng(seed)
    out = []
    for k, off in enumerate(offsets_s):
        b = (0.09 + 0.005 * k + rng.exponential(0.01, n)).tolist()
        out.append(([x + off for x in b], b))
    return out


def test_a_constant_offset_is_the_whole_interval() -> None:
    rounds = _rounds([0.001] * 8, 300, seed=1)
    for q in (50, 99):
        lo, hi = bootstrap_rounds_diff(rounds, q, np.random.default_rng(0))
        assert math.isclose(lo, 0.001, abs_tol=1e-12) and math.isclose(hi, 0.001, abs_tol=1e-12)


def test_drift_between_rounds_widens_the_interval_that_pairs_do_not_see() -> None:
    offsets = [0.0, 0.002, -0.001, 0.003, 0.0005, -0.002, 0.001, 0.0025]
    rounds = _rounds(offsets, 300, seed=2)
    a = [x for r in rounds for x in r[0]]
    b = [x for r in rounds for x in r[1]]
    estimate = float(np.percentile(a, 50) - np.percentile(b, 50))
    lo_r, hi_r = bootstrap_rounds_diff(rounds, 50, np.random.default_rng(0))
    lo_p, hi_p = bootstrap_paired_diff(a, b, 50, np.random.default_rng(0))
    assert lo_r <= estimate <= hi_r
    assert hi_r - lo_r > 3 * (hi_p - lo_p)
    # the rounds' spread of offsets is 5 ms; the interval of their mean is well inside it
    assert hi_r - lo_r < 0.005


def test_one_round_gives_no_interval() -> None:
    lo, hi = bootstrap_rounds_diff(_rounds([0.001], 100, seed=3), 50, np.random.default_rng(0))
    assert math.isnan(lo) and math.isnan(hi)
    lo, hi = bootstrap_rounds_diff(_rounds([0.001], 100, seed=3) + [([], [])], 50, np.random.default_rng(0))
    assert math.isnan(lo) and math.isnan(hi)


def _outcomes(ttfts_s: list[float]) -> list[Outcome]:
    return [Outcome(scheduled_s=float(i), sent_s=float(i), ttft_s=t) for i, t in enumerate(ttfts_s)]


def test_a_round_disturbed_in_either_mode_is_left_out_of_the_added_ttft() -> None:
    """A round where other jobs slowed ``direct`` would flatter the proxy by their delay: left out, the
    added TTFT is the proxy's own (1 ms), with every round's own figure still reported."""
    rounds = _rounds([0.001] * 6, 200, seed=4)
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
