"""Percentiles and the added TTFT of a mode over ``direct`` (its intervals: calroute.results.stats); the
verdict on a target."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from benchmarks.overhead.client import Outcome
from benchmarks.overhead.method import BOOTSTRAP_SAMPLES
from calroute.results.stats import bootstrap_clustered_quantile_diff, bootstrap_quantile_diff


def pct(values: list[float] | np.ndarray[Any, Any], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else math.nan


def ok_ttfts(outs: list[Outcome]) -> list[float]:
    return [o.ttft_s for o in outs if o.error is None]


def errors_of(outs: list[Outcome]) -> list[str]:
    return [o.error for o in outs if o.error is not None]


def paired_ttfts(
    rounds_a: list[list[Outcome]], rounds_b: list[list[Outcome]]
) -> tuple[list[float], list[float]]:
    """TTFTs of the arrivals both modes served without error, aligned pair by pair, round by round."""
    a, b = [], []
    for ra, rb in zip(rounds_a, rounds_b, strict=True):
        for oa, ob in zip(ra, rb, strict=True):
            if oa.error is None and ob.error is None:
                a.append(oa.ttft_s)
                b.append(ob.ttft_s)
    return a, b


def added_ttft(
    mine: list[list[Outcome]],
    my_rounds: list[dict[str, Any]],
    base: list[list[Outcome]],
    base_rounds: list[dict[str, Any]],
    rng: np.random.Generator,
) -> dict[str, Any]:
    """A mode's added TTFT over ``direct``, from the rounds neither ran disturbed; every round's own added
    p50/p99 is written into its entry of ``my_rounds``."""
    by_round: list[tuple[list[float], list[float]]] = []
    for stats, base_stats, got, got_base in zip(my_rounds, base_rounds, mine, base, strict=True):
        ra, rb = paired_ttfts([got], [got_base])
        if ra:
            stats["added_p50_ms"] = (pct(ra, 50) - pct(rb, 50)) * 1e3
            stats["added_p99_ms"] = (pct(ra, 99) - pct(rb, 99)) * 1e3
        if not (stats["disturbed"] or base_stats["disturbed"]):
            by_round.append((ra, rb))
    row: dict[str, Any] = {"rounds_compared": len(by_round)}
    a = [x for ra, _ in by_round for x in ra]
    b = [x for _, rb in by_round for x in rb]
    if not a:
        return row
    row["pairs"] = len(a)
    row["pair_correlation"] = float(np.corrcoef(a, b)[0, 1])
    for q in (50, 99):
        row[f"added_p{q}_ms"] = (pct(a, q) - pct(b, q)) * 1e3
        lo, hi = bootstrap_clustered_quantile_diff(by_round, q, rng, samples=BOOTSTRAP_SAMPLES)
        row[f"added_p{q}_ci95_ms"] = [lo * 1e3, hi * 1e3]
        # the interval of runs 5 - 8 (pairs resampled as if independent), for comparison with them
        lo, hi = bootstrap_quantile_diff(a, b, q, rng, paired=True, samples=BOOTSTRAP_SAMPLES)
        row[f"added_p{q}_ci95_pairs_ms"] = [lo * 1e3, hi * 1e3]
        # what the interval would be with the pairing ignored, for comparison with earlier runs
        lo, hi = bootstrap_quantile_diff(a, b, q, rng, samples=BOOTSTRAP_SAMPLES)
        row[f"added_p{q}_ci95_unpaired_ms"] = [lo * 1e3, hi * 1e3]
        row[f"ratio_p{q}"] = pct(a, q) / pct(b, q)
    return row


def verdict(added_ms: float, ci_ms: list[float], limit_ms: float) -> str:
    """Met only when the whole 95 % interval is under the limit; missed when all of it is at or over."""
    where = f"{added_ms:+.2f} ms (95 % CI {ci_ms[0]:+.2f} .. {ci_ms[1]:+.2f}) vs < {limit_ms:g} ms"
    if ci_ms[1] < limit_ms:
        return f"met: {where}"
    if ci_ms[0] >= limit_ms:
        return f"missed: {where}"
    return f"not resolved: {where}"
