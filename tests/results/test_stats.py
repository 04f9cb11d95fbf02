"""Paired differences and the rule for calling them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from calroute.results.stats import (
    bootstrap_clustered_quantile_diff,
    bootstrap_quantile_diff,
    paired_difference,
    t_quantile_975,
    traces_to_resolve,
)


@pytest.mark.parametrize(
    ("a", "b", "verdict"),
    [
        ([0.90, 0.91, 0.92, 0.93], [0.80, 0.82, 0.81, 0.83], "win"),
        ([0.80, 0.82, 0.81, 0.83], [0.90, 0.91, 0.92, 0.93], "loss"),
        # one big gain among losses: the mean is positive, the interval is not
        ([0.99, 0.80, 0.80, 0.80], [0.80, 0.81, 0.81, 0.81], "within noise (n = 4)"),
        ([0.9], [0.1], "within noise (n = 1)"),
    ],
)
def test_verdict_only_where_the_interval_excludes_zero(a: list[float], b: list[float], verdict: str) -> None:
    d = paired_difference(a, b)
    assert d.verdict == verdict
    assert d.low <= d.mean <= d.high
    assert d.n == len(a)


def test_pairing_removes_what_the_pairs_share() -> None:
    # the seeds differ wildly, the policies by a steady 0.01: paired, that is a resolved win
    base = [0.2, 0.9, 0.5, 0.7, 0.3, 0.8]
    d = paired_difference([x + 0.01 for x in base], base)
    assert d.mean == pytest.approx(0.01) and d.low == pytest.approx(0.01) and d.verdict == "win"
    assert "+0.010 [+0.010, +0.010] n=6 win" == d.describe()


def test_intervals_are_reproducible_and_pairs_must_match() -> None:
    a, b = [0.5, 0.7, 0.6, 0.9], [0.6, 0.6, 0.5, 0.8]
    assert paired_difference(a, b) == paired_difference(a, b)
    with pytest.raises(ValueError, match="equal length"):
        paired_difference([0.1], [0.1, 0.2])


def test_one_pair_is_described_without_an_interval() -> None:
    assert paired_difference([0.9], [0.85]).describe() == "+0.050 (n = 1, no interval)"


@pytest.mark.parametrize(
    ("df", "t"),
    # Student's t 0.975 quantiles from published tables, on both sides of the table's end at 30
    [(1, 12.706), (2, 4.303), (10, 2.228), (30, 2.042), (31, 2.0395), (40, 2.0211), (120, 1.9799)],
)
def test_t_quantile(df: int, t: float) -> None:
    assert t_quantile_975(df) == pytest.approx(t, abs=2e-4)


def test_t_quantile_needs_a_degree_of_freedom() -> None:
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_quantile_975(0)


@pytest.mark.parametrize(
    ("mean", "sd", "n"),
    [
        # n = 15: t(14) 2.145 x 2.8 / sqrt(15) = 1.551 < 1.6; at 14, 2.160 x 2.8 / sqrt(14) = 1.616 does not
        (-1.6, 2.8, 15),
        (1.6, 2.8, 15),  # the sign does not matter
        (0.1, 2.0, 1540),  # about (1.96 x 2 / 0.1)^2 = 1537, plus t's extra width
        (1.0, 0.0, 2),  # no spread: the smallest n with an interval
        (0.0, 1.0, None),  # nothing to resolve
        (-1e-16, 0.8, None),  # nor in a zero that float arithmetic left
        (0.001, 2.0, 15_365_838),  # (1.96 x 2 / 0.001)^2 = 15,365,835.5, plus t's (z^2 + 1) / 2
        (1.0, None, None),  # one pair: no spread to plan from
    ],
)
def test_traces_to_resolve(mean: float, sd: float | None, n: int | None) -> None:
    assert traces_to_resolve(mean, sd) == n


def test_the_planned_n_is_the_first_whose_interval_is_narrower_than_the_gap() -> None:
    mean, sd = 0.7, 1.9
    n = traces_to_resolve(mean, sd)
    assert n is not None
    assert t_quantile_975(n - 1) * sd / n**0.5 < mean <= t_quantile_975(n - 2) * sd / (n - 1) ** 0.5


def test_a_paired_difference_knows_its_spread_and_what_would_resolve_it() -> None:
    # marginal_cost minus least_loaded on the three traces of the live 800-request run: -4.3, +1.0, -1.7
    d = paired_difference([-4.3, 1.0, -1.7], [0.0, 0.0, 0.0])
    assert d.verdict == "within noise (n = 3)"
    assert d.sd == pytest.approx(2.65, abs=0.01)
    assert d.to_resolve == traces_to_resolve(d.mean, d.sd) == 13
    assert paired_difference([0.9], [0.85]).to_resolve is None


def test_counting_up_and_the_closed_form_agree_where_they_meet() -> None:
    sd = 2.0
    below = traces_to_resolve(1.959964 * sd / 99_000**0.5, sd)  # counted up from the normal figure
    above = traces_to_resolve(1.959964 * sd / 101_000**0.5, sd)  # the closed form
    assert below is not None and above is not None
    assert below - 99_000 == above - 101_000 == 3


# ---- differences of percentiles -----------------------------------------------------------------------


def offset_clusters(offsets: list[float], n: int, seed: int) -> list[tuple[list[float], list[float]]]:
    """Clusters of n pairs: ``b`` drawn per cluster (each at its own level), ``a`` the same plus the
    cluster's offset."""
    rng = np.random.default_rng(seed)
    out = []
    for k, off in enumerate(offsets):
        b = (0.09 + 0.005 * k + rng.exponential(0.01, n)).tolist()
        out.append(([x + off for x in b], b))
    return out


def test_pairing_removes_what_a_pair_shares_from_a_percentile_difference() -> None:
    ((a, b),) = offset_clusters([0.001], 400, seed=1)
    lo, hi = bootstrap_quantile_diff(a, b, 50, paired=True)
    assert math.isclose(lo, 0.001, abs_tol=1e-12) and math.isclose(hi, 0.001, abs_tol=1e-12)
    lo_u, hi_u = bootstrap_quantile_diff(a, b, 50)
    assert lo_u < 0.001 < hi_u and hi_u - lo_u > 1e-3  # the spread of b, which pairing cancels


def test_a_percentile_difference_interval_is_reproducible_and_pairs_must_match() -> None:
    ((a, b),) = offset_clusters([0.002], 100, seed=2)
    assert bootstrap_quantile_diff(a, b, 99) == bootstrap_quantile_diff(a, b, 99)
    # the caller's stream, when given, is what the resamples draw from
    one = bootstrap_quantile_diff(a, b, 99, np.random.default_rng(7), samples=500)
    assert one == bootstrap_quantile_diff(a, b, 99, np.random.default_rng(7), samples=500)
    with pytest.raises(ValueError):
        bootstrap_quantile_diff(a, b[:-1], 50, paired=True)
    with pytest.raises(ValueError):
        bootstrap_quantile_diff([], b, 50)


def test_a_constant_offset_is_the_whole_clustered_interval() -> None:
    clusters = offset_clusters([0.001] * 8, 300, seed=1)
    for q in (50, 99):
        lo, hi = bootstrap_clustered_quantile_diff(clusters, q, np.random.default_rng(0))
        assert math.isclose(lo, 0.001, abs_tol=1e-12) and math.isclose(hi, 0.001, abs_tol=1e-12)


def test_drift_between_clusters_widens_the_interval_that_pairs_do_not_see() -> None:
    offsets = [0.0, 0.002, -0.001, 0.003, 0.0005, -0.002, 0.001, 0.0025]
    clusters = offset_clusters(offsets, 300, seed=2)
    a = [x for c in clusters for x in c[0]]
    b = [x for c in clusters for x in c[1]]
    estimate = float(np.percentile(a, 50) - np.percentile(b, 50))
    lo_c, hi_c = bootstrap_clustered_quantile_diff(clusters, 50, np.random.default_rng(0), samples=2000)
    lo_p, hi_p = bootstrap_quantile_diff(a, b, 50, np.random.default_rng(0), paired=True, samples=2000)
    assert lo_c <= estimate <= hi_c
    assert hi_c - lo_c > 3 * (hi_p - lo_p)
    # the clusters' spread of offsets is 5 ms; the interval of their mean is well inside it
    assert hi_c - lo_c < 0.005


def test_one_cluster_gives_no_interval() -> None:
    one = offset_clusters([0.001], 100, seed=3)
    for clusters in (one, [*one, ([], [])]):
        lo, hi = bootstrap_clustered_quantile_diff(clusters, 50)
        assert math.isnan(lo) and math.isnan(hi)
