"""Paired comparisons: the mean difference over matched runs (same seed or trace window), with a 95 %
percentile-bootstrap interval, and the project's rule for calling it (docs/experiments.md): a win or a loss
only where the interval excludes zero, otherwise "within noise", always with its n; and, for a difference
within noise, how many pairs would resolve it if the observed mean and spread held. Beside them, bootstrap
intervals of a difference of percentiles (unpaired, paired, or resampling whole clusters such as a
benchmark's rounds): what the proxy-overhead benchmark's added TTFT needs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Fixed: the interval is a property of the data, not of a caller's seed.
_BOOTSTRAP_SEED = 20_261_202
_BOOTSTRAP_SAMPLES = 10_000

# Student's t, two-sided 95 % (the 0.975 quantile), for 1..30 degrees of freedom; past 30 the Cornish-Fisher
# expansion around the normal quantile is within 1e-4 of it (numpy has no t quantile; scipy is not needed).
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
_Z975 = 1.959964
_COUNT_UP_TO = 100_000  # past this many pairs, traces_to_resolve uses the closed form


@dataclass(frozen=True)
class PairedDiff:
    mean: float  # mean of (a - b) over the pairs
    low: float  # 95 % interval
    high: float
    n: int
    sd: float | None = None  # sample standard deviation of the pairs' differences (None for one pair)

    @property
    def verdict(self) -> str:
        if self.n >= 2 and self.low > 0:
            return "win"
        if self.n >= 2 and self.high < 0:
            return "loss"
        return f"within noise (n = {self.n})"

    @property
    def to_resolve(self) -> int | None:
        """How many pairs would resolve this difference (traces_to_resolve); None without a spread to
        plan from."""
        return traces_to_resolve(self.mean, self.sd)

    def describe(self, digits: int = 3) -> str:
        f = f"{{:+.{digits}f}}"
        if self.n < 2:
            return f"{f.format(self.mean)} (n = {self.n}, no interval)"
        # a within-noise verdict names its n already
        n = f" n={self.n}" if self.verdict in ("win", "loss") else ""
        return f"{f.format(self.mean)} [{f.format(self.low)}, {f.format(self.high)}]{n} {self.verdict}"


def paired_difference(a: Sequence[float], b: Sequence[float]) -> PairedDiff:
    """a - b over matched pairs; a single pair has no interval (its bounds are infinite)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired samples must be non-empty and of equal length, got {len(a)} and {len(b)}")
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    mean = float(d.mean())
    if len(d) < 2:
        return PairedDiff(mean, float("-inf"), float("inf"), len(d))
    rng = np.random.default_rng(_BOOTSTRAP_SEED)
    idx = rng.integers(0, len(d), size=(_BOOTSTRAP_SAMPLES, len(d)))
    means = d[idx].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return PairedDiff(mean, float(low), float(high), len(d), float(d.std(ddof=1)))


def bootstrap_quantile_diff(
    a: Sequence[float],
    b: Sequence[float],
    q: float,
    rng: np.random.Generator | None = None,
    *,
    paired: bool = False,
    samples: int = _BOOTSTRAP_SAMPLES,
) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of the q-th percentile of ``a`` minus that of ``b``.

    Unpaired, each sample is resampled on its own. ``paired``: ``a[i]`` and ``b[i]`` are one pair (e.g. the
    same scheduled arrival measured two ways) and pairs are resampled whole, so what moves both members of
    a pair alike does not widen the interval. ``rng`` None: the fixed seed (the interval a property of the
    data); a caller running several intervals from one stream passes its own."""
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if not len(xa) or not len(xb) or (paired and len(xa) != len(xb)):
        raise ValueError(f"samples must be non-empty (and of equal length if paired): {len(xa)}, {len(xb)}")
    rng = np.random.default_rng(_BOOTSTRAP_SEED) if rng is None else rng
    if paired:
        idx = rng.integers(0, len(xa), (samples, len(xa)))
        d = np.percentile(xa[idx], q, axis=1) - np.percentile(xb[idx], q, axis=1)
    else:
        da = np.percentile(xa[rng.integers(0, len(xa), (samples, len(xa)))], q, axis=1)
        db = np.percentile(xb[rng.integers(0, len(xb), (samples, len(xb)))], q, axis=1)
        d = da - db
    low, high = np.percentile(d, [2.5, 97.5])
    return float(low), float(high)


def bootstrap_clustered_quantile_diff(
    clusters: Sequence[tuple[Sequence[float], Sequence[float]]],
    q: float,
    rng: np.random.Generator | None = None,
    *,
    samples: int = _BOOTSTRAP_SAMPLES,
) -> tuple[float, float]:
    """95 % bootstrap interval of the q-th percentile of every cluster's ``a`` pooled minus that of every
    ``b`` pooled, resampling whole clusters (e.g. a benchmark's rounds, each its ``a`` and ``b``).

    What drifts between clusters moves a cluster's values together; resampling values as if independent
    gives an interval narrower than the clusters' spread. (nan, nan) with fewer than two non-empty clusters:
    one cluster has no spread to resample."""
    arrays = [(np.asarray(a, dtype=float), np.asarray(b, dtype=float)) for a, b in clusters if len(a)]
    if len(arrays) < 2:
        return (math.nan, math.nan)
    rng = np.random.default_rng(_BOOTSTRAP_SEED) if rng is None else rng
    d = np.empty(samples)
    for i, pick in enumerate(rng.integers(0, len(arrays), (samples, len(arrays)))):
        xa = np.concatenate([arrays[k][0] for k in pick])
        xb = np.concatenate([arrays[k][1] for k in pick])
        d[i] = np.percentile(xa, q) - np.percentile(xb, q)
    low, high = np.percentile(d, [2.5, 97.5])
    return float(low), float(high)


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (a 95 % two-sided interval)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


def traces_to_resolve(mean: float, sd: float | None) -> int | None:
    """The smallest number of pairs n (at least 2) whose 95 % t interval, mean +- t(n-1) sd / sqrt(n), is
    narrower than |mean|: how many traces or seeds it would take to call a difference of this size and
    spread a win or a loss.

    A planning figure, read from the observed paired mean and sample sd: if those are the truth, an
    interval from that many pairs excludes zero about half the time (more pairs for more certainty). The
    bootstrap's percentile interval is a little narrower than the t interval at small n, so this errs
    high. None where nothing can be planned: a zero mean, or no spread measured (one pair).
    """
    # a mean a billionth of the spread is a zero that float arithmetic left (it would need 1e18 pairs)
    if sd is None or math.isnan(sd) or math.isnan(mean) or abs(mean) <= 1e-9 * sd:
        return None
    if sd == 0:
        return 2
    # t(n-1) > z, so no n below (z sd / mean)^2 can do: start there rather than count up from 2
    normal = (_Z975 * sd / abs(mean)) ** 2
    if normal > _COUNT_UP_TO:
        # t(n-1) = z (1 + (z^2 + 1) / 4n + ...) adds (z^2 + 1) / 2 pairs to the normal figure, and counting
        # up one by one would take as many steps as there are pairs
        return math.ceil(normal + (_Z975**2 + 1) / 2)
    n = max(2, math.floor(normal))
    while t_quantile_975(n - 1) * sd / math.sqrt(n) >= abs(mean):
        n += 1
    return n
