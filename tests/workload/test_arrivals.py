"""Arrival processes: exact counts, order, mean rate, variability, determinism and argument checks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from calroute.errors import ConfigError
from calroute.workload import arrivals
from calroute.workload.arrivals import (
    bursty_arrivals,
    gamma_arrivals,
    poisson_arrivals,
    poisson_arrivals_within,
)

Process = Callable[[float, int, np.random.Generator], npt.NDArray[np.float64]]

PROCESSES: dict[str, Process] = {
    "poisson": poisson_arrivals,
    "gamma-cv0.5": lambda rate, n, rng: gamma_arrivals(rate, n, rng, cv=0.5),
    "gamma-cv2": lambda rate, n, rng: gamma_arrivals(rate, n, rng, cv=2.0),
    "bursty": bursty_arrivals,
}


def _gaps_cv(times_s: npt.NDArray[np.float64]) -> float:
    gaps_s = np.diff(np.concatenate(([0.0], times_s)))
    return float(gaps_s.std() / gaps_s.mean())


@pytest.mark.parametrize("name", PROCESSES)
@pytest.mark.parametrize("n", [0, 1, 2, 7, 1000])
def test_exact_count_positive_and_non_decreasing(name: str, n: int) -> None:
    times_s = PROCESSES[name](3.0, n, np.random.default_rng(5))
    assert times_s.shape == (n,)
    assert times_s.dtype == np.float64
    assert np.all(times_s > 0)
    assert np.all(np.diff(times_s) >= 0)


# Bursty needs many burst cycles to average out, hence the low rate (20,000 s, ~800 cycles) and wider band.
@pytest.mark.parametrize(
    ("name", "rate_rps", "rel_tol"),
    [("poisson", 10.0, 0.03), ("gamma-cv0.5", 10.0, 0.03), ("gamma-cv2", 10.0, 0.04), ("bursty", 1.0, 0.05)],
)
def test_mean_rate_matches(name: str, rate_rps: float, rel_tol: float) -> None:
    n = 20_000
    times_s = PROCESSES[name](rate_rps, n, np.random.default_rng(11))
    assert n / times_s[-1] == pytest.approx(rate_rps, rel=rel_tol)


@pytest.mark.parametrize("cv", [0.25, 0.5, 1.0, 2.0])
def test_gamma_gap_cv(cv: float) -> None:
    times_s = gamma_arrivals(5.0, 20_000, np.random.default_rng(3), cv=cv)
    assert _gaps_cv(times_s) == pytest.approx(cv, rel=0.06)


def test_poisson_gap_cv_is_one() -> None:
    assert _gaps_cv(poisson_arrivals(5.0, 20_000, np.random.default_rng(3))) == pytest.approx(1.0, abs=0.03)


# min_cv sits a little under the slow-modulation limit sqrt(2 * rate * sum(p_i / rate_i) - 1) of each case
# (1.31, 1.45, 1.12): shorter states average the bursts out a little.
@pytest.mark.parametrize(
    ("burst_factor", "burst_time_fraction", "mean_burst_s", "min_cv"),
    [(4.0, 0.2, 5.0, 1.2), (8.0, 0.1, 2.0, 1.2), (2.0, 0.5, 10.0, 1.05)],
)
def test_bursty_long_run_rate_and_burstiness(
    burst_factor: float, burst_time_fraction: float, mean_burst_s: float, min_cv: float
) -> None:
    times_s = bursty_arrivals(
        1.0, 30_000, np.random.default_rng(17), burst_factor, burst_time_fraction, mean_burst_s
    )
    assert 30_000 / times_s[-1] == pytest.approx(1.0, rel=0.06)
    assert _gaps_cv(times_s) > min_cv


def test_bursty_without_bursts_is_poisson() -> None:
    times_s = bursty_arrivals(2.0, 20_000, np.random.default_rng(2), burst_factor=1.0)
    assert _gaps_cv(times_s) == pytest.approx(1.0, abs=0.03)
    assert 20_000 / times_s[-1] == pytest.approx(2.0, rel=0.03)


def test_bursty_is_clearly_burstier_than_poisson() -> None:
    cvs = [_gaps_cv(bursty_arrivals(10.0, 20_000, np.random.default_rng(seed))) for seed in range(5)]
    assert min(cvs) > 1.15


def test_bursty_is_fast() -> None:
    start = time.perf_counter()
    times_s = bursty_arrivals(50.0, 50_000, np.random.default_rng(0))
    assert time.perf_counter() - start < 0.5
    assert len(times_s) == 50_000


@pytest.mark.parametrize("name", PROCESSES)
def test_deterministic_per_seed(name: str) -> None:
    process = PROCESSES[name]
    first = process(4.0, 500, np.random.default_rng([42, 1]))
    again = process(4.0, 500, np.random.default_rng([42, 1]))
    other = process(4.0, 500, np.random.default_rng([43, 1]))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


@pytest.mark.parametrize(
    ("call", "kwargs", "param"),
    [
        (poisson_arrivals, {"rate_rps": 0.0}, "rate_rps"),
        (poisson_arrivals, {"rate_rps": -1.0}, "rate_rps"),
        (poisson_arrivals, {"rate_rps": float("inf")}, "rate_rps"),
        (poisson_arrivals, {"n": -1}, "n"),
        (gamma_arrivals, {"cv": 0.0}, "cv"),
        (gamma_arrivals, {"rate_rps": 0.0}, "rate_rps"),
        (bursty_arrivals, {"burst_factor": 0.5}, "burst_factor"),
        (bursty_arrivals, {"burst_time_fraction": 0.0}, "burst_time_fraction"),
        (bursty_arrivals, {"burst_time_fraction": 1.0}, "burst_time_fraction"),
        (bursty_arrivals, {"mean_burst_s": 0.0}, "mean_burst_s"),
        (bursty_arrivals, {"n": -3}, "n"),
    ],
)
def test_bad_parameters_name_the_parameter(
    call: Callable[..., Any], kwargs: dict[str, Any], param: str
) -> None:
    args: dict[str, Any] = {"rate_rps": 1.0, "n": 10, "rng": np.random.default_rng(0)}
    if call is gamma_arrivals:
        args["cv"] = 1.0
    args.update(kwargs)
    with pytest.raises(ConfigError, match=rf"\b{param}\b"):
        call(**args)


@pytest.mark.parametrize(("rate_rps", "duration_s"), [(5.0, 60.0), (100.0, 0.5), (0.01, 1.0), (3.0, 0.0)])
def test_arrivals_within_a_duration_are_the_n_process_cut_there(rate_rps: float, duration_s: float) -> None:
    """The same gaps as poisson_arrivals from the same seed, every arrival before the end and none after:
    one schedule whether a caller asks for a count or a length."""
    within = poisson_arrivals_within(rate_rps, duration_s, np.random.default_rng(4))
    longer = poisson_arrivals(rate_rps, len(within) + 1, np.random.default_rng(4))
    assert np.allclose(within, longer[:-1], rtol=0, atol=1e-9)
    assert longer[-1] >= duration_s and np.all(within < duration_s)


def test_arrivals_within_run_past_one_draw(monkeypatch: pytest.MonkeyPatch) -> None:
    # one draw covers about 1.1x the mean count; a count past it (rare) takes more draws, seamlessly
    whole = poisson_arrivals_within(50.0, 2.0, np.random.default_rng(3))
    monkeypatch.setattr(arrivals, "_draw_size", lambda rate_rps, duration_s: 7)
    drawn_in_sevens = poisson_arrivals_within(50.0, 2.0, np.random.default_rng(3))
    assert len(whole) > 7 * 3
    assert np.allclose(drawn_in_sevens, whole, rtol=0, atol=1e-9)


def test_arrivals_within_check_the_duration() -> None:
    with pytest.raises(ConfigError, match="duration_s"):
        poisson_arrivals_within(1.0, -1.0, np.random.default_rng(0))
    with pytest.raises(ConfigError, match="rate_rps"):
        poisson_arrivals_within(0.0, 1.0, np.random.default_rng(0))
