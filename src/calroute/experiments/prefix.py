"""Prefix reuse: marginal_cost against the prefix-aware peers, on traffic that repeats prompt prefixes.

Each workload runs on 2P+4D at two operating points: where the best prefix-aware peer still *holds* 0.90
goodput and where it *crosses* 0.85 (the highest of the peers' rates), each found by a search on the run's own
seeds. The report gives, per cell: every policy's mean goodput, its per-seed median and values, the runs that
collapsed (goodput < 0.5), marginal_cost's paired difference to each with its 95 % interval and the median of
the per-seed differences, and the verdict: a win (or loss) only where the interval excludes zero and the
median agrees; the idle perfect-cache ceiling of the same traces (experiments/kit/ceiling.py: an upper bound
on any routing's goodput) and each policy's distance to it; prefix-hit ratios. Requests past the model length
no engine can take are counted apart (admissible goodput beside goodput).

Workloads: the three seeded families with shared prefixes (a family's structure is the same for every seed,
workload/prefix_families.py), Mooncake's real conversation trace and its synthetic one, each in ten windows
(seed s replays window s), and mixed-bursty, which shares nothing: there the prefix feature must move nothing.
Run it under both SLO specs: ``calroute experiment prefix --seeds 10 --slo long-context`` and ``--slo paper``.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from calroute.costmodel.profiles import DEFAULT_PROFILE, HardwareProfile, get_profile
from calroute.experiments.kit.cells import Cell, CellResult
from calroute.experiments.kit.paths import portable_workload
from calroute.experiments.kit.report import fmt, judged_slo
from calroute.report import plots
from calroute.results.stats import paired_difference
from calroute.routing.variant import Variant
from calroute.workload.source import workload_source

PEERS = ("prefix_scorer_mix", "kv_overlap_cost", "cache_aware")
TRACE_WINDOWS = 10
COLLAPSED = 0.5  # a run below this goodput has collapsed
# relative to the repository (kit/paths.py finds it), as the results record it
MOONCAKE_SYNTHETIC = "data/traces/mooncake_fast25/synthetic_trace.jsonl"
CONVERSATION = "data/traces/mooncake_fast25/conversation_trace_first_half.jsonl"
TRACES = (MOONCAKE_SYNTHETIC, CONVERSATION)
WORKLOADS = (
    ("shared-prefix", "shared-prefix"),
    ("multi-turn", "multi-turn"),
    ("agentic", "agentic"),
    ("conversation", CONVERSATION),
    ("mooncake-synthetic", MOONCAKE_SYNTHETIC),
    ("no-reuse", "mixed-bursty"),
)
# (name, the goodput the best peer is at)
HOLD_TARGET = 0.90
OPERATING_POINTS = (("hold", HOLD_TARGET), ("cross", 0.85))
VARIANTS = (
    Variant("round_robin", "round_robin"),
    Variant("least_loaded", "least_loaded"),
    *(Variant(p, p) for p in PEERS),
    Variant("marginal_cost", "marginal_cost"),
    Variant("marginal_cost-no-prefix", "marginal_cost", {"use_prefix_cache": False}),
    Variant("marginal_cost-no-evict", "marginal_cost", {"w_evict": 0.0}),
)


class PrefixReuse:
    name = "prefix"
    title = "Prefix reuse: marginal_cost against the prefix-aware peers, 2P+4D, at two operating points"

    def cells(self, quick: bool) -> list[Cell]:
        workloads = WORKLOADS[:1] if quick else WORKLOADS
        points = OPERATING_POINTS[1:] if quick else OPERATING_POINTS
        return [
            Cell(
                f"{key}-{point}",
                2,
                4,
                workload,
                VARIANTS,
                saturate_on=PEERS,
                trace_windows=TRACE_WINDOWS if workload in TRACES else 1,
                tags={"workload": key, "source": workload, "point": point, "target": target},
                saturation_target=target,
                saturate_on_run_seeds=True,
            )
            for key, workload in workloads
            for point, target in points
        ]

    def report(self, results: list[CellResult], exp_dir: Path) -> str:
        add_ceilings(results, exp_dir)
        parts = [f"## {self.title}\n", _summary(results), ""]
        for c in results:
            parts.append(
                f"\n### {c.tags.get('workload', c.cell_key)}, where the best peer {_point(c)} "
                f"({c.rate_rps:.2f} req/s)\n"
            )
            parts.append(_table(c, exp_dir))
        return "\n".join(parts) + "\n"


def _point(c: CellResult) -> str:
    target = c.tags.get("target", 0.85)
    return f"holds {target:.2f}" if c.tags.get("point") == "hold" else f"crosses {target:.2f}"


def verdict(ours: list[float], theirs: list[float]) -> tuple[str, float, float, Any]:
    """(verdict, mean and median of ours - theirs in points, the paired difference): a win or a loss only
    where the interval excludes zero and the median of the per-seed differences has the same sign."""
    d = paired_difference([100 * x for x in ours], [100 * x for x in theirs])
    diffs = [100 * (a - b) for a, b in zip(ours, theirs, strict=True)]
    median = statistics.median(diffs) if diffs else float("nan")
    if d.verdict == "win":
        word = "win" if median > 0 else "mean only (median disagrees)"
    elif d.verdict == "loss":
        word = "loss" if median < 0 else "mean only (median disagrees)"
    else:
        word = "within noise"
    return word, d.mean, median, d


def best_peer(c: CellResult) -> str:
    present = [p for p in PEERS if p in c.labels()]
    return max(present, key=c.mean_goodput)


def _summary(results: list[CellResult]) -> str:
    rows = [
        "| workload | point (req/s) | best peer | marginal_cost - best peer: mean [95 %] (median) "
        "| verdict | ceiling | marginal_cost to ceiling | best peer to ceiling "
        "| collapsed runs: marginal_cost / peer |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in results:
        if "marginal_cost" not in c.labels():
            continue
        peer = best_peer(c)
        word, _, median, d = verdict(c.goodputs("marginal_cost"), c.goodputs(peer))
        ceiling = c.tags.get("ceiling")
        to_ceiling = (
            (
                f"{100 * (ceiling - c.mean_goodput('marginal_cost')):.1f} pts",
                f"{100 * (ceiling - c.mean_goodput(peer)):.1f} pts",
            )
            if ceiling is not None
            else ("", "")
        )
        rows.append(
            f"| {c.tags.get('workload', c.cell_key)} | {c.tags.get('point', '')} ({c.rate_rps:.2f}) | {peer} "
            f"| {d.mean:+.1f} [{d.low:+.1f}, {d.high:+.1f}] ({median:+.1f}) n={d.n} | {word} "
            f"| {fmt(ceiling)} | {to_ceiling[0]} | {to_ceiling[1]} "
            f"| {_collapsed(c, 'marginal_cost')} / {_collapsed(c, peer)} |"
        )
    return (
        "Goodput differences in points, paired by seed (a seed is one arrival trace, or one window of a "
        "trace); a win only where the interval excludes zero and the median of the per-seed differences "
        "agrees. Ceiling: the idle perfect-cache ceiling of the same traces, an upper bound on any routing "
        "(experiments/kit/ceiling.py).\n\n" + "\n".join(rows) + "\n"
    )


def _collapsed(c: CellResult, label: str) -> int:
    return sum(g < COLLAPSED for g in c.goodputs(label))


def _table(c: CellResult, exp_dir: Path) -> str:
    ours = c.goodputs("marginal_cost")
    ceiling = c.tags.get("ceiling")
    rows = [
        "| policy | goodput mean (median) | per seed | collapsed | admissible goodput | prefix-hit ratio "
        "| marginal_cost - it: mean [95 %] (median) | verdict | to ceiling |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    points = {}
    for label in c.labels():
        runs = sorted((r for r in c.runs if r.label == label), key=lambda r: r.seed)
        g = [r.summary.goodput for r in runs]
        hit = statistics.fmean(r.summary.prefix_hit_ratio for r in runs)
        adm = statistics.fmean(r.summary.admissible_goodput for r in runs)
        points[label] = (hit, statistics.fmean(g))
        if label == "marginal_cost" or len(g) != len(ours):
            versus = ("-", "")
        else:
            word, _, median, d = verdict(ours, g)
            versus = (f"{d.mean:+.1f} [{d.low:+.1f}, {d.high:+.1f}] ({median:+.1f})", word)
        dist = f"{100 * (ceiling - statistics.fmean(g)):.1f} pts" if ceiling is not None else ""
        rows.append(
            f"| {label} | {fmt(statistics.fmean(g))} ({fmt(statistics.median(g))}) "
            f"| {' '.join(f'{x:.2f}' for x in g)} | {_collapsed(c, label)} | {fmt(adm)} | {fmt(hit)} "
            f"| {versus[0]} | {versus[1]} | {dist} |"
        )
    inadmissible = c.runs[0].summary.inadmissible if c.runs else 0
    notes = []
    if ceiling is not None:
        admissible = fmt(c.tags.get("ceiling_admissible"))
        notes.append(f"Idle perfect-cache ceiling: {fmt(ceiling)} (admissible {admissible}).")
    if inadmissible:
        notes.append(
            f"Requests no engine can take (past the model length), seed {c.runs[0].seed}: {inadmissible}."
        )
    png = plots.scatter(
        exp_dir / f"{c.cell_key}-hits.png",
        points,
        "prefix-hit ratio (share of prompt tokens served from cache)",
        "goodput",
        f"{c.cell_key}: hit ratio against goodput",
        diagonal=False,
    )
    return "\n".join(rows) + "\n\n" + " ".join(notes) + f"\n\n![{png}](prefix/{png})\n"


def add_ceilings(results: list[CellResult], exp_dir: Path) -> None:
    """Tag each cell with the idle perfect-cache ceiling of its traces (mean over its seeds), judged as its
    runs were, on the experiment's engine limits; kept in ``ceilings.json`` by cell, rate and seeds."""
    from calroute.experiments.kit.ceiling import MODEL, perfect_cache_ceiling

    manifest_path = exp_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    base = get_profile(DEFAULT_PROFILE)
    limits = replace(base.limits, **manifest.get("engine_limits", {}))
    profile = HardwareProfile(base.name, replace(base.calibration, slo=judged_slo(exp_dir, "2P4D")), limits)
    store = exp_dir / "ceilings.json"
    saved: dict[str, Any] = json.loads(store.read_text()) if store.exists() else {}
    for c in results:
        if not c.runs or "source" not in c.tags:
            continue
        seeds = ",".join(map(str, c.seeds()))
        key = f"{MODEL}:{c.cell_key}@{c.rate_rps!r}:{seeds}:{c.runs[0].summary.requests}"
        if key not in saved:
            windows = TRACE_WINDOWS if c.tags["source"] in TRACES else 1
            source = workload_source(
                portable_workload(c.tags["source"]), c.runs[0].summary.requests, trace_windows=windows
            )
            ceilings = [perfect_cache_ceiling(profile, source.requests(c.rate_rps, s)) for s in c.seeds()]
            saved[key] = {
                "goodput": statistics.fmean(x.goodput for x in ceilings),
                "admissible": statistics.fmean(x.admissible_goodput for x in ceilings),
            }
            store.write_text(json.dumps(saved, indent=2) + "\n")
        c.tags["ceiling"] = saved[key]["goodput"]
        c.tags["ceiling_admissible"] = saved[key]["admissible"]
