"""Paired comparisons: the mean difference over matched runs (same seed or trace window), with a 95 %
percentile-bootstrap interval, and the project's rule for calling it (docs/experiments.md): a win or a loss
only where the interval excludes zero, otherwise "within noise", always with its n.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Fixed: the interval is a property of the data, not of a caller's seed.
_BOOTSTRAP_SEED = 20_261_202
_BOOTSTRAP_SAMPLES = 10_000


@dataclass(frozen=True)
class PairedDiff:
    mean: float  # mean of (a - b) over the pairs
    low: float  # 95 % interval
    high: float
    n: int

    @property
    def verdict(self) -> str:
        if self.n >= 2 and self.low > 0:
            return "win"
        if self.n >= 2 and self.high < 0:
            return "loss"
        return f"within noise (n = {self.n})"

    def describe(self, digits: int = 3) -> str:
        f = f"{{:+.{digits}f}}"
        if self.n < 2:
            return f"{f.format(self.mean)} (n = {self.n}, no interval)"
        return (
            f"{f.format(self.mean)} [{f.format(self.low)}, {f.format(self.high)}] n={self.n} {self.verdict}"
        )


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
    return PairedDiff(mean, float(low), float(high), len(d))
