"""Local prefill: marginal_cost keeping a prefill on its decode engine where that is cheaper, against the
peers' deciders (issue 37, docs/local-prefill.md).

Every workload runs on two pools, 2P+4D and 1P+2D, at the rate where the best of the deciders (llm-d's
prefix-based decider, Dynamo's conditional disaggregation, vllm-router's uncached threshold, each with its
published defaults) crosses 0.85 goodput, searched on the run's own seeds. Variants: marginal_cost always
disaggregating, marginal_cost with ``local_prefill``, the deciders (Dynamo's in its three modes), and, on a
cluster of as many engines none of which is set apart for prefill, the plain aggregated cluster (every
request prefilled where it is decoded: ``aggregated``), at the same rate and on the same traces.

The report gives, per cell: each variant's goodput (mean, per-seed median and values, collapsed runs), the
share of its requests kept local, its P99 TTFT and TPOT and the share of its requests that missed their TPOT
target (the streams a local prefill delays are among them); marginal_cost with local prefill against the best
decider and against itself always disaggregating, each a paired difference with its interval, n and the median
of the per-seed differences, and the verdict (a win only where the interval excludes zero and the median
agrees).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from calroute.experiments.kit.beside import paired_residual, simulated_twin
from calroute.experiments.kit.cells import Cell, CellResult
from calroute.experiments.kit.report import fmt
from calroute.experiments.prefix import COLLAPSED, CONVERSATION, TRACE_WINDOWS, verdict
from calroute.report import plots
from calroute.routing.variant import Variant

DECIDERS = ("pd_llmd", "pd_dynamo", "pd_vllm_router")
WORKLOADS = (
    ("multi-turn", "multi-turn"),
    ("agentic", "agentic"),
    ("shared-prefix", "shared-prefix"),
    ("conversation", CONVERSATION),
    ("mixed-bursty", "mixed-bursty"),
    ("chat", "chat"),
)
SHAPES = ((2, 4), (1, 2))
OURS = "marginal_cost-local"
ALWAYS = "marginal_cost"
VARIANTS = (
    Variant(ALWAYS, "marginal_cost"),
    Variant(OURS, "marginal_cost", {"local_prefill": True}),
    Variant("pd_llmd", "pd_llmd"),
    Variant("pd_dynamo", "pd_dynamo"),
    Variant("pd_dynamo-prefill_load", "pd_dynamo", {"mode": "prefill_load"}),
    Variant("pd_dynamo-isl_or_load", "pd_dynamo", {"mode": "isl_or_load"}),
    Variant("pd_vllm_router", "pd_vllm_router"),
)
AGGREGATED = Variant("aggregated", "aggregated")
DECIDER_LABELS = tuple(v.label for v in VARIANTS if v.policy in DECIDERS)


class LocalPrefill:
    name = "local-prefill"
    title = "Local prefill: marginal_cost's priced choice against the peers' deciders, at their saturation"

    def cells(self, quick: bool) -> list[Cell]:
        workloads = WORKLOADS[:1] if quick else WORKLOADS
        shapes = SHAPES[:1] if quick else SHAPES
        cells = []
        for key, workload in workloads:
            windows = TRACE_WINDOWS if workload == CONVERSATION else 1
            for p, d in shapes:
                tags = {"workload": key, "shape": f"{p}P{d}D"}
                # the aggregated cluster: the same engines, none set apart for prefill, at the same rate (the
                # same search, on the disaggregated shape) and on the same traces
                for suffix, prefill, decode, variants, extra in (
                    ("", p, d, VARIANTS, {}),
                    ("-aggregated", 0, p + d, (AGGREGATED,), {"aggregated": True}),
                ):
                    cells.append(
                        Cell(
                            f"{key}-{p}P{d}D{suffix}",
                            prefill,
                            decode,
                            workload,
                            variants,
                            saturate_like=(p, d),
                            saturate_on=DECIDERS,
                            trace_windows=windows,
                            tags={**tags, **extra},
                            saturate_on_run_seeds=True,
                        )
                    )
        return cells

    def report(self, results: list[CellResult], exp_dir: Path) -> str:
        by_key = {c.cell_key: c for c in results}
        main = [c for c in results if not c.tags.get("aggregated")]
        merged = [_with_aggregated(c, by_key.get(f"{c.cell_key}-aggregated")) for c in main]
        parts = [f"## {self.title}\n", _summary(merged), ""]
        for c in merged:
            parts.append(f"\n### {c.tags['workload']}, {c.tags['shape']} ({c.rate_rps:.2f} req/s)\n")
            parts.append(_table(c, exp_dir))
            twin = self._twin(by_key[c.cell_key], exp_dir)
            if twin is not None:
                parts.append(_beside(c, twin))
        return "\n".join(parts) + "\n"

    def _twin(self, live: CellResult, exp_dir: Path) -> CellResult | None:
        """A live cell's twin on the simulator configured as the live router was (None on the simulator)."""
        if live.backend == "sim":
            return None
        cell = next((c for c in self.cells(False) if c.key == live.cell_key), None)
        if cell is None:
            return None
        return simulated_twin(live, cell, exp_dir, f"{cell.prefill}P{cell.decode}D", precise=True)


def _with_aggregated(c: CellResult, agg: CellResult | None) -> CellResult:
    """The cell with the aggregated cluster's runs beside its own (same rate and traces)."""
    if agg is None or agg.rate_rps != c.rate_rps:
        return c
    return CellResult(c.cell_key, c.backend, c.rate_rps, c.runs + agg.runs, c.tags)


def best_decider(c: CellResult) -> str:
    present = [label for label in DECIDER_LABELS if label in c.labels()]
    return max(present, key=c.mean_goodput)


def _beside(live: CellResult, sim: CellResult) -> str:
    """The live cell beside its simulated twin: each variant's goodput and kept-local share on both, the
    residual, and the comparisons the summary makes, on both."""
    rows = [
        "| variant | live goodput (median) | simulator goodput (median) | mean abs residual per trace "
        "| kept local: live / simulator |",
        "|---|---|---|---|---|",
    ]
    for label in sim.labels():
        local = [
            statistics.fmean(r.summary.local_share for r in c.runs if r.label == label) for c in (live, sim)
        ]
        rows.append(
            f"| {label} | {fmt(live.mean_goodput(label))} ({fmt(statistics.median(live.goodputs(label)))}) "
            f"| {fmt(sim.mean_goodput(label))} ({fmt(statistics.median(sim.goodputs(label)))}) "
            f"| {fmt(paired_residual(live, sim, label))} | {100 * local[0]:.0f} % / {100 * local[1]:.0f} % |"
        )
    delay = sim.tags.get("kv_event_delay_s")
    lines = []
    for name, c in (("live", live), ("simulator", sim)):
        best = best_decider(c)
        vs_best, vs_always = _versus(c, best), _versus(c, ALWAYS)
        lines.append(
            f"- {name}: {OURS} - {best} (the best decider) {vs_best[0]} {vs_best[1]}; "
            f"- {ALWAYS} {vs_always[0]} {vs_always[1]}"
        )
    return (
        "\nBeside the simulator configured as the live router was (the cluster's calibration and engine "
        "limits, the same traces and SLO, KV events heard "
        f"{1e3 * (delay or 0):.1f} ms late):\n\n" + "\n".join(rows) + "\n\n" + "\n".join(lines) + "\n"
    )


def _local_share(c: CellResult, label: str) -> float:
    return statistics.fmean(r.summary.local_share for r in c.runs if r.label == label)


def _collapsed(c: CellResult, label: str) -> int:
    return sum(g < COLLAPSED for g in c.goodputs(label))


def _versus(c: CellResult, other: str) -> tuple[str, str]:
    ours, theirs = c.goodputs(OURS), c.goodputs(other)
    if not ours or len(ours) != len(theirs):
        return "-", ""
    word, _, median, d = verdict(ours, theirs)
    return f"{d.mean:+.1f} [{d.low:+.1f}, {d.high:+.1f}] ({median:+.1f}) n={d.n}", word


def _summary(results: list[CellResult]) -> str:
    rows = [
        f"| workload | pool (req/s) | best decider | {OURS} - best decider: mean [95 %] (median) | verdict "
        f"| {OURS} - {ALWAYS} | verdict | - aggregated | verdict | kept local | collapsed: ours / decider |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in results:
        if OURS not in c.labels():
            continue
        best = best_decider(c)
        vs_best, vs_always, vs_agg = _versus(c, best), _versus(c, ALWAYS), _versus(c, AGGREGATED.label)
        local = statistics.fmean(r.summary.local_share for r in c.runs if r.label == OURS)
        rows.append(
            f"| {c.tags['workload']} | {c.tags['shape']} ({c.rate_rps:.2f}) | {best} | {vs_best[0]} "
            f"| {vs_best[1]} | {vs_always[0]} | {vs_always[1]} | {vs_agg[0]} | {vs_agg[1]} "
            f"| {100 * local:.0f} % | {_collapsed(c, OURS)} / {_collapsed(c, best)} |"
        )
    return (
        "Goodput differences in points, paired by seed (one arrival trace, or one window of a trace); a win "
        "only where the interval excludes zero and the median of the per-seed differences agrees. Kept "
        f"local: the share of {OURS}'s requests its decode engine prefilled.\n\n" + "\n".join(rows) + "\n"
    )


def _table(c: CellResult, exp_dir: Path) -> str:
    rows = [
        "| variant | goodput mean (median) | per seed | collapsed | kept local | P99 TTFT (s) | P99 TPOT (s) "
        f"| TPOT misses | {OURS} - it: mean [95 %] (median) | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    points = {}
    for label in c.labels():
        runs = sorted((r for r in c.runs if r.label == label), key=lambda r: r.seed)
        g = [r.summary.goodput for r in runs]
        local = statistics.fmean(r.summary.local_share for r in runs)
        points[label] = (local, statistics.fmean(g))
        ttft = [r.summary.ttft_p99_s for r in runs if r.summary.ttft_p99_s is not None]
        tpot = [r.summary.tpot_p99_s for r in runs if r.summary.tpot_p99_s is not None]
        misses = statistics.fmean(r.summary.tpot_miss_ratio for r in runs)
        versus = ("-", "") if label == OURS else _versus(c, label)
        rows.append(
            f"| {label} | {fmt(statistics.fmean(g))} ({fmt(statistics.median(g))}) "
            f"| {' '.join(f'{x:.2f}' for x in g)} | {_collapsed(c, label)} | {100 * local:.0f} % "
            f"| {fmt(statistics.fmean(ttft) if ttft else None, 2)} "
            f"| {fmt(statistics.fmean(tpot) if tpot else None, 4)} | {100 * misses:.1f} % "
            f"| {versus[0]} | {versus[1]} |"
        )
    png = plots.scatter(
        exp_dir / f"{c.cell_key}-local.png",
        points,
        "share of requests prefilled on their decode engine",
        "goodput",
        f"{c.cell_key}: kept local against goodput",
        diagonal=False,
    )
    return "\n".join(rows) + f"\n\n![{png}](local-prefill/{png})\n"
