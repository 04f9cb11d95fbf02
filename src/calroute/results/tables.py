"""Comparison tables of run results: one row per policy, per-seed and mean goodput, tail latencies."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from calroute.results.metrics import RunSummary
from calroute.results.stats import PairedDiff, paired_difference


@dataclass(frozen=True)
class RunRow:
    policy: str
    seed: int
    summary: RunSummary


@dataclass(frozen=True)
class PolicyRow:
    policy: str
    goodputs: tuple[float, ...]  # per seed, in seed order
    mean_goodput: float
    spread: float  # max - min across seeds
    ttft_p99_s: float | None  # mean over seeds
    tpot_p99_s: float | None
    prefix_hit_ratio: float = 0.0  # mean over seeds
    local_share: float = 0.0  # of its requests, those prefilled on their decode engine; mean over seeds


def _mean(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.fmean(vals) if vals else None


def by_policy(rows: Sequence[RunRow]) -> list[PolicyRow]:
    policies = list(dict.fromkeys(r.policy for r in rows))
    out = []
    for p in policies:
        mine = sorted((r for r in rows if r.policy == p), key=lambda r: r.seed)
        g = tuple(r.summary.goodput for r in mine)
        out.append(
            PolicyRow(
                policy=p,
                goodputs=g,
                mean_goodput=statistics.fmean(g),
                spread=max(g) - min(g),
                ttft_p99_s=_mean([r.summary.ttft_p99_s for r in mine]),
                tpot_p99_s=_mean([r.summary.tpot_p99_s for r in mine]),
                prefix_hit_ratio=statistics.fmean(r.summary.prefix_hit_ratio for r in mine),
                local_share=statistics.fmean(r.summary.local_share for r in mine),
            )
        )
    return out


def reference_policy(policies: Sequence[PolicyRow]) -> PolicyRow:
    """The row the others are compared with: marginal_cost if it ran (our router), else the first."""
    return next((p for p in policies if p.policy == "marginal_cost"), policies[0])


def versus(p: PolicyRow, ref: PolicyRow) -> PairedDiff | None:
    """p's goodput minus the reference's, paired by seed (None for the reference itself, or unpaired runs)."""
    if p is ref or len(p.goodputs) != len(ref.goodputs):
        return None
    return paired_difference(p.goodputs, ref.goodputs)


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def markdown_table(rows: Sequence[RunRow]) -> str:
    policies = by_policy(rows)
    seeds = sorted({r.seed for r in rows})
    best = max(p.mean_goodput for p in policies)
    ref = reference_policy(policies)
    hits = any(p.prefix_hit_ratio > 0 for p in policies)
    head = ["policy", *[f"seed {s}" for s in seeds], "mean goodput", "spread", "P99 TTFT (s)", "P99 TPOT (s)"]
    head.append(f"goodput - {ref.policy}, paired, 95 % CI")
    if hits:
        head.append("prefix hit ratio")
    local = any(p.local_share > 0 for p in policies)
    if local:
        head.append("kept local")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in policies:
        mean = _fmt(p.mean_goodput)
        if p.mean_goodput == best:
            mean = f"**{mean}**"
        cells = [
            p.policy,
            *[_fmt(g) for g in p.goodputs],
            mean,
            _fmt(p.spread),
            _fmt(p.ttft_p99_s),
            _fmt(p.tpot_p99_s, 4),
        ]
        diff = versus(p, ref)
        cells.append("-" if diff is None else diff.describe())
        if hits:
            cells.append(_fmt(p.prefix_hit_ratio))
        if local:
            cells.append(f"{100 * p.local_share:.0f} %")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
