"""Seeded arrival processes: Poisson, gamma renewal and a two-state Markov-modulated Poisson process.

Each returns ``n`` absolute, non-decreasing arrival times in seconds, the first one gap after time 0
(``poisson_arrivals_within``: those before a given time instead).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from calroute.errors import ConfigError

FloatArray = npt.NDArray[np.float64]


def _check_common(rate_rps: float, n: int) -> None:
    if not (np.isfinite(rate_rps) and rate_rps > 0):
        raise ConfigError(f"rate_rps must be a positive finite number, got {rate_rps}")
    if n < 0:
        raise ConfigError(f"n must be >= 0, got {n}")


def poisson_arrivals(rate_rps: float, n: int, rng: np.random.Generator) -> FloatArray:
    """Poisson process: exponential gaps with mean ``1 / rate_rps``."""
    _check_common(rate_rps, n)
    gaps_s = rng.exponential(1.0 / rate_rps, size=n)
    return np.cumsum(gaps_s, dtype=np.float64)


def _draw_size(rate_rps: float, duration_s: float) -> int:
    """Gaps drawn at a time: the mean count and some, so that one draw almost always covers the duration."""
    return int(rate_rps * duration_s * 1.1) + 16


def poisson_arrivals_within(rate_rps: float, duration_s: float, rng: np.random.Generator) -> FloatArray:
    """Poisson process: every arrival before ``duration_s`` (a count that is itself random, as an open-loop
    benchmark step of a fixed length offers). The gaps are the same draws as ``poisson_arrivals``'s, so
    both read the same schedule from the same seed."""
    _check_common(rate_rps, 0)
    if not (np.isfinite(duration_s) and duration_s >= 0):
        raise ConfigError(f"duration_s must be a non-negative finite number, got {duration_s}")
    parts: list[FloatArray] = []
    last_s = 0.0
    chunk = _draw_size(rate_rps, duration_s)
    while True:
        # the running sum starts from the last arrival, as one cumulative sum over all the gaps would
        times_s = np.cumsum(np.concatenate(([last_s], rng.exponential(1.0 / rate_rps, size=chunk))))[1:]
        inside = times_s[times_s < duration_s]
        parts.append(inside)
        if len(inside) < chunk:
            return np.concatenate(parts).astype(np.float64, copy=False)
        last_s = float(times_s[-1])


def gamma_arrivals(rate_rps: float, n: int, rng: np.random.Generator, cv: float) -> FloatArray:
    """Gamma renewal process: gaps with mean ``1 / rate_rps`` and coefficient of variation ``cv``.

    ``cv = 1`` is Poisson, ``cv > 1`` burstier, ``cv < 1`` more regular.
    """
    _check_common(rate_rps, n)
    if not (np.isfinite(cv) and cv > 0):
        raise ConfigError(f"cv must be a positive finite number, got {cv}")
    # A gamma with shape k has CV 1/sqrt(k); the scale then fixes the mean at k * scale = 1 / rate.
    shape = 1.0 / (cv * cv)
    gaps_s = rng.gamma(shape, 1.0 / (rate_rps * shape), size=n)
    return np.cumsum(gaps_s, dtype=np.float64)


def bursty_arrivals(
    rate_rps: float,
    n: int,
    rng: np.random.Generator,
    burst_factor: float = 4.0,
    burst_time_fraction: float = 0.2,
    mean_burst_s: float = 5.0,
) -> FloatArray:
    """A two-state (calm / burst) Markov-modulated Poisson process whose long-run mean rate is ``rate_rps``.

    The burst rate is ``burst_factor`` times the calm rate; the process spends ``burst_time_fraction`` (f) of
    the time in bursts. State durations are exponential, bursts lasting ``mean_burst_s`` on average and calm
    spells ``mean_burst_s * (1 - f) / f``. The initial state is drawn from the stationary distribution.
    """
    _check_common(rate_rps, n)
    if not (np.isfinite(burst_factor) and burst_factor >= 1):
        raise ConfigError(f"burst_factor must be >= 1, got {burst_factor}")
    if not (0 < burst_time_fraction < 1):
        raise ConfigError(f"burst_time_fraction must be in (0, 1), got {burst_time_fraction}")
    if not (np.isfinite(mean_burst_s) and mean_burst_s > 0):
        raise ConfigError(f"mean_burst_s must be a positive finite number, got {mean_burst_s}")
    if n == 0:
        return np.empty(0, dtype=np.float64)

    frac = burst_time_fraction
    calm_rate_rps = rate_rps / (1.0 - frac + frac * burst_factor)
    burst_rate_rps = calm_rate_rps * burst_factor
    mean_calm_s = mean_burst_s * (1.0 - frac) / frac

    # Time change: a Poisson process with piecewise-constant intensity is a unit-rate Poisson process run
    # on the cumulative intensity. Draw the n unit-rate points, then enough state periods to cover them,
    # and invert the (piecewise linear) cumulative intensity with one searchsorted: exact count, no loop
    # per arrival.
    unit_points = np.cumsum(rng.exponential(1.0, size=n))
    target = float(unit_points[-1])
    start_in_burst = bool(rng.random() < frac)

    mean_cycle_intensity = calm_rate_rps * mean_calm_s + burst_rate_rps * mean_burst_s
    durations_parts: list[FloatArray] = []
    rates_parts: list[FloatArray] = []
    covered = 0.0
    while covered <= target:
        # 25 % headroom plus a constant keeps this to one pass almost always, even for tiny n.
        cycles = int(1.25 * (target - covered) / mean_cycle_intensity) + 8
        calm_s = rng.exponential(mean_calm_s, size=cycles)
        burst_s = rng.exponential(mean_burst_s, size=cycles)
        first, second = (burst_s, calm_s) if start_in_burst else (calm_s, burst_s)
        first_rate, second_rate = (
            (burst_rate_rps, calm_rate_rps) if start_in_burst else (calm_rate_rps, burst_rate_rps)
        )
        durations = np.column_stack((first, second)).ravel()
        rates = np.tile(np.array([first_rate, second_rate]), cycles)
        durations_parts.append(durations)
        rates_parts.append(rates)
        covered += float(np.dot(durations, rates))

    durations_s = np.concatenate(durations_parts)
    rates_rps = np.concatenate(rates_parts)
    intensity_at_start = np.concatenate(([0.0], np.cumsum(durations_s * rates_rps)[:-1]))
    time_at_start_s = np.concatenate(([0.0], np.cumsum(durations_s)[:-1]))
    period = np.searchsorted(intensity_at_start, unit_points, side="right") - 1
    times_s = time_at_start_s[period] + (unit_points - intensity_at_start[period]) / rates_rps[period]
    # Float rounding at period boundaries could otherwise produce a tiny decrease.
    return np.maximum.accumulate(times_s).astype(np.float64, copy=False)
