"""Percentiles, bootstrap intervals and the added TTFT of a mode over ``direct``; the verdict on a target."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from benchmarks.overhead.client import Outcome


def pct(values: list[float] | np.ndarray[Any, Any], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else math.nan


def ok_ttfts(outs: list[Outcome]) -> list[float]:
    return [o.ttft_s for o in outs if o.error is None]


def errors_of(outs: list[Outcome]) -> list[str]:
    return [o.error for o in outs if o.error is not None]


def bootstrap_diff(a: list[float], b: list[float], q: float, rng: np.random.Generator) -> tuple[float, float]:
    """95 % bootstrap interval of percentile q of ``a`` minus that of ``b`` (independent resamples)."""
    xa, xb = np.asarray(a), np.asarray(b)
    reps = 2000
    da = np.percentile(xa[rng.integers(0, len(xa), (reps, len(xa)))], q, axis=1)
    db = np.percentile(xb[rng.integers(0, len(xb), (reps, len(xb)))], q, axis=1)
    lo, hi = np.percentile(da - db, [2.5, 97.5])
    return float(lo), float(hi)


def bootstrap_paired_diff(
    a: list[float], b: list[float], q: float, rng: np.random.Generator
) -> tuple[float, float]:
    """95 % bootstrap interval of percentile q of ``a`` minus that of ``b``, where ``a[i]`` and ``b[i]`` are
    one pair (the same scheduled arrival in both modes): pairs are resampled whole, so what the arrival
    pattern does to both (a burst queues both modes' requests alike) does not widen the interval."""
    xa, xb = np.asarray(a), np.asarray(b)
    idx = rng.integers(0, len(xa), (2000, len(xa)))
    d = np.percentile(xa[idx], q, axis=1) - np.percentile(xb[idx], q, axis=1)
    lo, hi = np.percentile(d, [2.5, 97.5])
    return float(lo), float(hi)


def bootstrap_rounds_diff(
    rounds: list[tuple[list[float], list[float]]], q: float, rng: np.random.Generator
) -> tuple[float, float]:
    """95 % bootstrap interval of percentile q of the pooled ``a`` minus that of the pooled ``b``, resampling
    whole rounds (each round: its aligned pairs ``a``, ``b``). The machine's state drifts between rounds
    (other jobs, cache and scheduler state), moving a round's pairs together; resampling pairs treats them
    as independent and gives an interval narrower than the rounds' spread, so the verdict uses this one."""
    arrays = [(np.asarray(a), np.asarray(b)) for a, b in rounds if a]
    if len(arrays) < 2:
        return (math.nan, math.nan)
    d = np.empty(2000)
    for i, pick in enumerate(rng.integers(0, len(arrays), (len(d), len(arrays)))):
        xa = np.concatenate([arrays[k][0] for k in pick])
        xb = np.concatenate([arrays[k][1] for k in pick])
        d[i] = np.percentile(xa, q) - np.percentile(xb, q)
    lo, hi = np.percentile(d, [2.5, 97.5])
    return float(lo), float(hi)


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
        lo, hi = bootstrap_rounds_diff(by_round, q, rng)
        row[f"added_p{q}_ci95_ms"] = [lo * 1e3, hi * 1e3]
        # the interval of runs 5 - 8 (pairs resampled as if independent), for comparison with them
        lo, hi = bootstrap_paired_diff(a, b, q, rng)
        row[f"added_p{q}_ci95_pairs_ms"] = [lo * 1e3, hi * 1e3]
        # what the interval would be with the pairing ignored, for comparison with earlier runs
        lo, hi = bootstrap_diff(a, b, q, rng)
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
