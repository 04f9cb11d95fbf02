"""Saturation search: the arrival rate at which a reference policy (round-robin) is mid-collapse.

Routing policies only separate under contention, so comparisons run where the reference policy's goodput
crosses a target (0.85 by default): probe rates by doubling or halving until the target is bracketed,
then bisect on a log scale.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from calroute.errors import ConfigError


@dataclass(frozen=True)
class Probe:
    rate_rps: float
    goodput: float


@dataclass(frozen=True)
class SaturationResult:
    rate_rps: float
    target: float
    probes: tuple[Probe, ...]


def find_saturation(
    measure: Callable[[float], float],
    target: float = 0.85,
    start_rps: float = 1.0,
    rel_tol: float = 0.03,
    max_probes: int = 30,
    on_probe: Callable[[Probe], None] | None = None,
) -> SaturationResult:
    """Highest-resolution estimate of the rate where ``measure(rate)`` (goodput) crosses ``target``.

    Assumes goodput falls as the rate rises (noise is tolerated: bisection keeps the bracket's ends on
    the right sides of the target). Stops when the bracket is narrower than ``rel_tol`` relative.
    """
    if not 0 < target < 1:
        raise ConfigError(f"saturation target must be in (0, 1), got {target}")
    if start_rps <= 0:
        raise ConfigError(f"saturation start rate must be > 0, got {start_rps}")
    probes: list[Probe] = []

    def probe(rate: float) -> float:
        if len(probes) >= max_probes:
            raise ConfigError(f"saturation search did not converge in {max_probes} probes: {probes}")
        g = measure(rate)
        p = Probe(rate, g)
        probes.append(p)
        if on_probe is not None:
            on_probe(p)
        return g

    lo = hi = start_rps
    if probe(start_rps) >= target:
        while True:
            hi *= 2
            if probe(hi) < target:
                break
            lo = hi
    else:
        while True:
            lo /= 2
            if probe(lo) >= target:
                break
            hi = lo
            if lo < 1e-4:
                raise ConfigError("goodput stays below the saturation target even at 1e-4 req/s")
    while hi / lo > 1 + rel_tol:
        mid = math.sqrt(lo * hi)
        if probe(mid) >= target:
            lo = mid
        else:
            hi = mid
    return SaturationResult(rate_rps=math.sqrt(lo * hi), target=target, probes=tuple(probes))
