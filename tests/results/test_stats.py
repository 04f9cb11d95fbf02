"""Paired differences and the rule for calling them."""

from __future__ import annotations

import pytest

from calroute.results.stats import paired_difference


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
