"""Output-length predictors: oracle only in simulation, history buckets, seeded noise."""

from __future__ import annotations

import bisect
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from calroute.costmodel.predictors import (
    BucketQuantilePredictor,
    ConstantPredictor,
    NoisyPredictor,
    OraclePredictor,
    _bisect_left_written,
    _SortedWindow,
    make_predictor,
)
from calroute.errors import ConfigError


def test_oracle_refuses_without_the_truth() -> None:
    assert OraclePredictor().predict(10, 77) == 77
    with pytest.raises(ConfigError, match="needs the true output length"):
        OraclePredictor().predict(10)


def test_constant() -> None:
    assert ConstantPredictor(100).predict(5) == 100
    with pytest.raises(ConfigError):
        ConstantPredictor(0)


def test_bucket_learns_per_prompt_length_and_falls_back() -> None:
    p = BucketQuantilePredictor(quantile=0.5, window=16, min_samples=4, default_tokens=99)
    assert p.predict(100) == 99  # nothing seen
    for out in (10, 20, 30, 40):
        p.observe(100, out)  # bucket of 100 tokens
    assert p.predict(120) == 30  # same power-of-two bucket: median of its history (upper median)
    assert p.predict(5000) == 30  # unseen bucket: pooled history
    for out in (1000, 1100, 1200, 1300):
        p.observe(5000, out)
    assert p.predict(5000) == 1200
    assert p.predict(100) == 30


def test_bucket_window_forgets_old_outputs() -> None:
    p = BucketQuantilePredictor(window=4, min_samples=1)
    for out in (1, 1, 1, 1, 500, 500, 500, 500):
        p.observe(64, out)
    assert p.predict(64) == 500


@given(
    size=st.integers(1, 12),
    values=st.lists(st.integers(1, 20), max_size=80),
    q=st.floats(0.0, 1.0),
)
def test_sorted_window_matches_sorting_the_last_values(size: int, values: list[int], q: float) -> None:
    w = _SortedWindow(size)
    for i, v in enumerate(values):
        w.add(v)
        last = sorted(values[max(0, i + 1 - size) : i + 1])
        assert len(w) == len(last)
        assert w.quantile(q) == last[min(len(last) - 1, int(q * len(last)))]


@given(st.lists(st.integers(1, 30), max_size=40), st.integers(0, 31))
def test_the_written_bisect_is_bisect_left(values: list[int], x: int) -> None:
    ordered = sorted(values)
    assert _bisect_left_written(ordered, x) == bisect.bisect_left(ordered, x)


def test_noise_is_seeded_bounded_and_unbiased() -> None:
    a = NoisyPredictor(ConstantPredictor(1000), 0.5, seed=1)
    b = NoisyPredictor(ConstantPredictor(1000), 0.5, seed=1)
    xs = [a.predict(10) for _ in range(2000)]
    assert xs == [b.predict(10) for _ in range(2000)]
    assert min(xs) >= 500 and max(xs) <= 1500
    assert statistics.fmean(xs) == pytest.approx(1000, rel=0.03)
    big = NoisyPredictor(ConstantPredictor(10), 1.5, seed=2)
    assert min(big.predict(1) for _ in range(500)) == 1  # clamped to one token


@pytest.mark.parametrize(
    ("name", "noise", "kind"), [("bucket", 0, "bucket"), ("oracle", 0.3, "noisy(oracle,0.3)")]
)
def test_make_predictor(name: str, noise: float, kind: str) -> None:
    assert make_predictor(name, noise=noise).name == kind


def test_make_predictor_errors() -> None:
    with pytest.raises(ConfigError, match="bucket"):
        make_predictor("gpt")
    with pytest.raises(ConfigError, match="noise"):
        make_predictor("constant", noise=-1)
