"""Paired differences and the rule for calling them."""

from __future__ import annotations

import pytest

from calroute.results.stats import paired_difference, t_quantile_975, traces_to_resolve


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
