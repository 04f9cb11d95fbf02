"""Saturation search: the arrival rate at which a reference policy (round-robin) is mid-collapse.

Routing policies only separate under contention, so comparisons run where the reference policy's goodput
crosses a target (0.85 by default): probe rates by doubling or halving until the target is bracketed,
then bisect on a log scale. Some workloads cannot reach the target even unloaded (long prompts with tight
TTFT targets miss them by physics): when goodput stays below it down to 1/64 of the starting rate (or the
caller's ``lowest_fraction``: a live probe at a low rate lasts long), the
target becomes relative, ``target x`` the best goodput seen at low load, and the result says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from calroute.errors import ConfigError

_LOWEST_FRACTION = 1 / 64


@dataclass(frozen=True)
class Probe:
    rate_rps: float
    goodput: float


@dataclass(frozen=True)
class SaturationResult:
    rate_rps: float
    target: float  # the goodput the rate was bisected on (relative targets already multiplied out)
    probes: tuple[Probe, ...]
    relative: bool = False


def find_saturation(
    measure: Callable[[float], float],
    target: float = 0.85,
    start_rps: float = 1.0,
    rel_tol: float = 0.03,
    max_probes: int = 30,
    on_probe: Callable[[Probe], None] | None = None,
    lowest_fraction: float = _LOWEST_FRACTION,
) -> SaturationResult:
    """The rate where ``measure(rate)`` (goodput) crosses ``target``, to ``rel_tol`` relative.

    Assumes goodput falls as the rate rises; noise is tolerated (bisection keeps the bracket's ends on the
    right sides of the target).
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

    relative = False
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
            g = probe(lo)
            if g >= target:
                break
            hi = lo
            if lo <= start_rps * lowest_fraction:
                best = max(p.goodput for p in probes)
                if best <= 0:
                    raise ConfigError("goodput is 0 at every probed rate: no saturation point to find")
                target, relative = target * best, True
                lo = max(p.rate_rps for p in probes if p.goodput >= target)
                above = [p.rate_rps for p in probes if p.rate_rps > lo and p.goodput < target]
                if above:
                    hi = min(above)
                else:  # collapse is above every rate probed so far: look higher
                    hi = lo * 2
                    while probe(hi) >= target:
                        lo, hi = hi, hi * 2
                break
    while hi / lo > 1 + rel_tol:
        mid = math.sqrt(lo * hi)
        if probe(mid) >= target:
            lo = mid
        else:
            hi = mid
    return SaturationResult(math.sqrt(lo * hi), target, tuple(probes), relative)
