"""Prefix reuse: marginal_cost against the prefix-aware peers, on traffic that repeats prompt prefixes.

Each cell is one workload on 2P+4D at the rate where the best prefix-aware peer's goodput crosses 0.85
(the highest of their crossing rates), so the comparison sits where the strongest of them starts to fail.
The report gives, per workload: every policy's goodput with its paired difference to marginal_cost; the
highest rate each policy serves at 0.85, as a ratio to least_loaded's and to the best peer's; the prefix-hit
ratio against the bound of one engine with an unbounded cache; and a plot of hit ratio against goodput.
mixed-bursty, which shares no prefix, is the control: there the prefix feature must move nothing.
Run it with enough seeds to resolve a two-point difference: ``calroute experiment prefix --seeds 10``.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from calroute.experiments.kit.cells import Cell, CellResult
from calroute.experiments.kit.paths import portable_workload
from calroute.experiments.kit.report import fmt, goodput_table
from calroute.report import plots
from calroute.results.stats import paired_difference
from calroute.routing.variant import Variant
from calroute.workload.reuse import unbounded_hit_ratio
from calroute.workload.source import workload_source

PEERS = ("prefix_scorer_mix", "kv_overlap_cost", "cache_aware")
TRACE_WINDOWS = 10
# relative to the repository (kit/paths.py finds it), as the results record it
MOONCAKE = "data/traces/mooncake_fast25/synthetic_trace.jsonl"
WORKLOADS = (
    ("mooncake", MOONCAKE),
    ("shared-prefix", "shared-prefix"),
    ("multi-turn", "multi-turn"),
    ("agentic", "agentic"),
    ("no-reuse", "mixed-bursty"),
)
VARIANTS = (
    Variant("round_robin", "round_robin"),
    Variant("least_loaded", "least_loaded"),
    *(Variant(p, p) for p in PEERS),
    Variant("marginal_cost", "marginal_cost"),
    Variant("marginal_cost-no-prefix", "marginal_cost", {"use_prefix_cache": False}),
    Variant("marginal_cost-no-evict", "marginal_cost", {"w_evict": 0.0}),
)
# Every variant whose policy runs with its defaults: their crossing rates go in the report.
RATED = tuple(v.policy for v in VARIANTS if not v.params)


class PrefixReuse:
    name = "prefix"
    title = "Prefix reuse: marginal_cost against the prefix-aware peers, 2P+4D, where the best peer saturates"

    def cells(self, quick: bool) -> list[Cell]:
        workloads = WORKLOADS[:2] if quick else WORKLOADS
        return [
            Cell(
                key,
                2,
                4,
                workload,
                VARIANTS,
                saturate_on=PEERS,
                measure_saturation_of=() if quick else RATED,
                # the trace in ten windows, seed s replaying window s (seeds would only redraw SLO classes)
                trace_windows=TRACE_WINDOWS if workload == MOONCAKE else 1,
                tags={"workload": key, "source": workload},
            )
            for key, workload in workloads
        ]

    def report(self, results: list[CellResult], exp_dir: Path) -> str:
        parts = [f"## {self.title}\n", goodput_table(results, "workload")]
        for c in results:
            parts.append(f"\n### {c.cell_key} ({c.rate_rps:.2f} req/s)\n")
            parts.append(_versus_marginal_cost(c))
            parts.append(_hit_ratios(c, exp_dir))
            rates = c.tags.get("saturation_rps")
            if rates:
                parts.append(_rates(rates))
        return "\n".join(parts) + "\n"


def _versus_marginal_cost(c: CellResult) -> str:
    ours = c.goodputs("marginal_cost")
    lines = ["Goodput minus marginal_cost's, paired by seed, in points (95 % bootstrap interval):\n"]
    for label in c.labels():
        theirs = c.goodputs(label)
        if label == "marginal_cost" or len(theirs) != len(ours):
            continue
        d = paired_difference([100 * x for x in theirs], [100 * x for x in ours])
        lines.append(f"- {label}: {d.describe(digits=1)}")
    return "\n".join(lines) + "\n"


def _hit_ratios(c: CellResult, exp_dir: Path) -> str:
    points = {}
    rows = ["| policy | prefix-hit ratio | goodput |", "|---|---|---|"]
    for label in c.labels():
        runs = [r for r in c.runs if r.label == label]
        hit = statistics.fmean(r.summary.prefix_hit_ratio for r in runs)
        good = c.mean_goodput(label)
        points[label] = (hit, good)
        rows.append(f"| {label} | {fmt(hit)} | {fmt(good)} |")
    requests = c.runs[0].summary.requests
    # results saved before the trace was named relative to the repository name it by its absolute path
    windows = TRACE_WINDOWS if c.tags["source"].endswith(MOONCAKE) else 1
    bound_ratio = statistics.fmean(
        unbounded_bound(c.tags["source"], requests, c.rate_rps, s, windows) for s in c.seeds()
    )
    bound = f"\nOne engine with an unbounded cache would serve {fmt(bound_ratio)} of the prompt tokens.\n"
    png = plots.scatter(
        exp_dir / f"{c.cell_key}-hits.png",
        points,
        "prefix-hit ratio (share of prompt tokens served from cache)",
        "goodput",
        f"{c.cell_key}: hit ratio against goodput",
        diagonal=False,
    )
    return "\n".join(rows) + f"\n{bound}\n![{png}](prefix/{png})\n"


def _rates(rates: dict[str, float]) -> str:
    best_peer = max(PEERS, key=lambda p: rates.get(p, 0.0))
    base = rates.get("least_loaded")
    peer = rates.get(best_peer)
    rows = [
        f"| policy | rate at 0.85 goodput (req/s) | / least_loaded | / {best_peer} |",
        "|---|---|---|---|",
    ]
    for policy, rate in sorted(rates.items(), key=lambda kv: -kv[1]):
        rows.append(
            f"| {policy} | {rate:.2f} | {fmt(rate / base if base else None, 2)} | "
            f"{fmt(rate / peer if peer else None, 2)} |"
        )
    return "\n".join(rows) + "\n"


def unbounded_bound(workload: str, requests: int, rate_rps: float, seed: int = 0, windows: int = 1) -> float:
    """The hit ratio one engine with an unbounded cache would reach on this workload."""
    source = workload_source(portable_workload(workload), requests, trace_windows=windows)
    return unbounded_hit_ratio(source.requests(rate_rps, seed))
