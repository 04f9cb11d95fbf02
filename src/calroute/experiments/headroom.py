"""Headroom: how far routing could go beyond marginal_cost, family by family (issue 26, issue 36).

Each cell is one workload family on 2P+4D at the rate where the hand-set marginal_cost's goodput crosses 0.85:
the rate its `calroute tune` study found on the training seeds and validated at (training.saturation in the
params file), or a fresh search where the family has no file. The prefix families hold or collapse seed by
seed near saturation, so a search on other seeds can land far from the study's rate (shared-prefix: 8.45
req/s on the experiment's saturation seeds against the study's 5.24); the study's rate keeps the table beside
the tuning's validation. Its variants: the baselines (the paper's for the paper's families, least_loaded and
the prefix-aware peers for the prefix families), marginal_cost hand-set, tuned on that family and tuned on
every family at once (``all.json``), and the clairvoyant marginal_cost (policies/clairvoyant.py: its prices on
the true output lengths and engine state) hand-set and tuned. The tuned parameters come from
docs/results/tuning (params_files.py): the clairvoyant's own study where one was run
(``clairvoyant-W.json``), else the clairvoyant with marginal_cost's tuned weights.

The clairvoyant marginal_cost is perfect inputs to one cost function, not a bound: it can score below
marginal_cost. The bound is the idle perfect-cache ceiling (kit/ceiling.py), computed when the report is made
on the same traces (workload, rate, seeds, requests) under the same SLO targets and engine limits, and each
variant's distance to it is given in goodput points.

Run it on seeds the tuning never saw:
``calroute experiment headroom --seeds 10 --first-seed 4 --requests 3000`` (the studies trained on seeds
0-3). The report names any run seed a tuned variant was trained on.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from calroute.costmodel.profiles import DEFAULT_PROFILE, get_profile
from calroute.costmodel.slo import SloSpec
from calroute.experiments.kit.ceiling import MODEL as CEILING_MODEL
from calroute.experiments.kit.ceiling import Ceiling, run_ceiling
from calroute.experiments.kit.cells import Cell, CellResult
from calroute.experiments.kit.params_files import TUNING_DIR, Tuned, trained_on, tuned_variant
from calroute.experiments.kit.report import bars_by_cell, fmt, goodput_table, paired_gap
from calroute.experiments.kit.sim_backend import judged_profile
from calroute.routing.variant import Variant

PAPER_FAMILIES = ("chat", "document", "reasoning", "mixed-bursty")
PREFIX_FAMILIES = ("shared-prefix", "multi-turn", "agentic")
PAPER_BASELINES = ("round_robin", "least_loaded", "length_heuristic")
PREFIX_BASELINES = ("least_loaded", "prefix_scorer_mix", "kv_overlap_cost", "cache_aware")
OURS = ("marginal_cost", "marginal_cost-tuned", "marginal_cost-all")
CLAIRVOYANT = ("clairvoyant", "clairvoyant-tuned", "clairvoyant-mc-tuned")
CLAIRVOYANT_WORDS = "clairvoyant marginal_cost (perfect inputs, not a bound)"
CEILING_FILE = "ceiling.json"  # the ceilings computed for the report, beside the results


def _tuned(family: str) -> list[Tuned]:
    mc = tuned_variant("marginal_cost-tuned", "marginal_cost", TUNING_DIR / f"{family}.json")
    # one set of weights for every family (`calroute tune --workload all`): a candidate for the defaults
    every = tuned_variant("marginal_cost-all", "marginal_cost", TUNING_DIR / "all.json")
    own = tuned_variant("clairvoyant-tuned", "clairvoyant", TUNING_DIR / f"clairvoyant-{family}.json")
    borrowed = tuned_variant("clairvoyant-mc-tuned", "clairvoyant", TUNING_DIR / f"{family}.json")
    return [t for t in (mc, every, own, borrowed) if t is not None]


def _baselines(family: str) -> tuple[str, ...]:
    return PREFIX_BASELINES if family in PREFIX_FAMILIES else PAPER_BASELINES


class Headroom:
    name = "headroom"
    title = (
        "Headroom: baselines, marginal_cost hand-set and tuned, the clairvoyant marginal_cost, and the idle "
        "perfect-cache ceiling, 2P+4D at saturation"
    )

    def cells(self, quick: bool) -> list[Cell]:
        families = ("mixed-bursty", "shared-prefix") if quick else PAPER_FAMILIES + PREFIX_FAMILIES
        return [self._cell(family) for family in families]

    def _cell(self, family: str) -> Cell:
        tuned = _tuned(family)
        rate = next((t.saturation_rps for t in tuned if t.variant.policy == "marginal_cost"), None)
        return Cell(
            family,
            2,
            4,
            family,
            (
                *(Variant(p, p) for p in _baselines(family)),
                Variant("marginal_cost", "marginal_cost"),
                Variant("clairvoyant", "clairvoyant"),
                *(t.variant for t in tuned),
            ),
            rate_rps=rate,
            saturate_on=("marginal_cost",),
            tags={"family": family},
        )

    def report(self, results: list[CellResult], exp_dir: Path) -> str:
        seeds = sorted({s for c in results for s in c.seeds()})
        overlap = [line for c in results for line in trained_on(_tuned(c.cell_key), seeds)]
        warning = (
            "**Not a validation:** " + "; ".join(overlap) + ". Run on seeds after the training seeds "
            "(`--first-seed`).\n\n"
            if overlap
            else ""
        )
        ceilings, why_not = ceilings_of(results, exp_dir)
        png = bars_by_cell(results, exp_dir, "goodput", self.title)
        parts = [f"## {self.title}\n", warning, _summary(results, ceilings, why_not), "\n"]
        parts.append(goodput_table(results, "family"))
        parts.append(f"\n![{png}]({self.name}/{png})\n")
        for c in results:
            parts.append(f"\n### {c.cell_key} ({c.rate_rps:.2f} req/s)\n")
            if c.cell_key in ceilings:
                parts.append(_to_ceiling(c, ceilings[c.cell_key]))
            parts.append(_versus(c, "marginal_cost"))
            missing = [label for label in (*OURS, *CLAIRVOYANT) if label not in c.labels()]
            if missing:
                parts.append(f"\nNo params file in docs/results/tuning for: {', '.join(missing)}.\n")
        return "\n".join(parts) + "\n"


# ---- the ceiling ----------------------------------------------------------------------------------------


def ceilings_of(results: list[CellResult], exp_dir: Path) -> tuple[dict[str, dict[int, Ceiling]], str]:
    """Each simulated cell's idle perfect-cache ceiling per seed, on the traces its runs replayed (its
    workload, rate, seeds and the manifest's request count) under the manifest's SLO spec and engine limits,
    on the simulator backend's hardware (the default profile); and why there is none, when there is none.
    Computed once and kept in ``exp_dir / CEILING_FILE`` with what it was computed from."""
    manifest_path = exp_dir / "manifest.json"
    if not manifest_path.exists():
        return {}, "no manifest.json beside the results: the traces are unknown"
    manifest = json.loads(manifest_path.read_text())
    limits = dict(manifest.get("engine_limits") or {})
    slo = manifest.get("slo") or {"name": "paper"}
    base = get_profile(DEFAULT_PROFILE)
    profile = judged_profile(
        replace(base, limits=replace(base.limits, **limits)), SloSpec.from_definition(slo)
    )
    requests = int(manifest["scale"]["requests"])
    defined = {c["key"]: c for c in manifest.get("cells", [])}
    path = exp_dir / CEILING_FILE
    saved: list[dict[str, Any]] = json.loads(path.read_text()) if path.exists() else []
    kept = {json.dumps(e["of"], sort_keys=True): e["ceiling"] for e in saved}
    out: dict[str, dict[int, Ceiling]] = {}
    entries = []
    for c in results:
        if c.backend != "sim":
            continue  # the ceiling is the simulator's; a live cluster's hardware is its own
        cell = defined.get(c.cell_key, {})
        per_seed = {}
        for seed in c.seeds():
            of = {
                "model": CEILING_MODEL,
                "profile": DEFAULT_PROFILE,
                "engine_limits": limits,
                "slo": slo,
                "workload": cell.get("workload", c.cell_key),
                "trace_windows": cell.get("trace_windows", 1),
                "requests": requests,
                "rate_rps": c.rate_rps,
                "seed": seed,
            }
            key = json.dumps(of, sort_keys=True)
            if key in kept:
                ceiling = Ceiling(**kept[key])
            else:
                ceiling = run_ceiling(
                    profile, of["workload"], requests, c.rate_rps, seed, of["trace_windows"]
                )
            per_seed[seed] = ceiling
            entries.append({"of": of, "ceiling": asdict(ceiling)})
        out[c.cell_key] = per_seed
    if entries:
        path.write_text(json.dumps(entries, indent=1) + "\n")
    return out, "" if out else "no cell ran on the simulator"


def _gaps(c: CellResult, label: str, ceiling: dict[int, Ceiling]) -> list[float]:
    """The ceiling minus ``label``'s goodput, in points, per seed both have."""
    mine = {r.seed: r.summary.goodput for r in c.runs if r.label == label}
    return [100 * (ceiling[s].goodput - mine[s]) for s in sorted(mine.keys() & ceiling.keys())]


def _gap_text(gaps: list[float]) -> str:
    if not gaps:
        return "-"
    return f"{statistics.fmean(gaps):.1f} (median {statistics.median(gaps):.1f})"


def _ceiling_mean(ceiling: dict[int, Ceiling]) -> float:
    return statistics.fmean(x.goodput for x in ceiling.values())


def _to_ceiling(c: CellResult, ceiling: dict[int, Ceiling]) -> str:
    inadmissible = sum(x.inadmissible for x in ceiling.values())
    lines = [
        f"Idle perfect-cache ceiling {fmt(_ceiling_mean(ceiling))} (mean over {len(ceiling)} seeds; "
        f"{inadmissible} requests past the engines' length limit, counted as not good). Goodput points "
        "below it, mean over seeds (median of the per-seed values):\n"
    ]
    lines += [f"- {label}: {_gap_text(_gaps(c, label, ceiling))}" for label in c.labels()]
    return "\n".join(lines) + "\n\n"


# ---- the summary ----------------------------------------------------------------------------------------


def _best(c: CellResult, labels: tuple[str, ...] | list[str]) -> str | None:
    present = [label for label in labels if label in c.labels()]
    return max(present, key=c.mean_goodput) if present else None


def _summary(results: list[CellResult], ceilings: dict[str, dict[int, Ceiling]], why_not: str) -> str:
    """Per family: the best baseline, marginal_cost's lead over it, tuning's gain, the clairvoyant
    marginal_cost, the ceiling and how far the best variant is below it."""
    rows = [
        "| family | req/s | best baseline | marginal_cost - it | tuned - hand-set marginal_cost "
        "| tuned on all - hand-set | best clairvoyant | it - best marginal_cost | ceiling "
        "| best variant, points below the ceiling |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in results:
        base = _best(c, _baselines(c.cell_key))
        ours = _best(c, OURS)
        clairvoyant = _best(c, CLAIRVOYANT)
        best = _best(c, c.labels())
        ceiling = ceilings.get(c.cell_key)
        tuned = "marginal_cost-tuned" in c.labels()
        rows.append(
            "| "
            + " | ".join(
                [
                    c.cell_key,
                    fmt(c.rate_rps, 2),
                    f"{base} {fmt(c.mean_goodput(base))}" if base else "",
                    paired_gap(c, "marginal_cost", base) if base else "",
                    paired_gap(c, "marginal_cost-tuned", "marginal_cost") if tuned else "no params file",
                    paired_gap(c, "marginal_cost-all", "marginal_cost")
                    if "marginal_cost-all" in c.labels()
                    else "no params file",
                    f"{clairvoyant} {fmt(c.mean_goodput(clairvoyant))}" if clairvoyant else "",
                    f"{paired_gap(c, clairvoyant, ours)} (vs {ours})" if clairvoyant and ours else "",
                    fmt(_ceiling_mean(ceiling)) if ceiling else "-",
                    f"{best} {_gap_text(_gaps(c, best, ceiling))}" if ceiling and best else "-",
                ]
            )
            + " |"
        )
    ceiling_note = (
        "The ceiling is the idle perfect-cache ceiling (src/calroute/experiments/kit/ceiling.py): the "
        "goodput of the same requests, each alone on an idle engine pair with every prefix block an earlier "
        "request named already cached; no routing of these requests on these engines beats it in the "
        "simulator's model, and it is loose. Its distance is the ceiling minus the goodput, in points, mean "
        "over seeds (median of the per-seed values)."
        if ceilings
        else f"No ceiling: {why_not}."
    )
    return (
        "Paired differences in goodput points, mean [95 % bootstrap interval], by seed; the best baseline, "
        f"the best variant and the best {CLAIRVOYANT_WORDS} are chosen after the fact, by mean. The "
        "clairvoyant prices as marginal_cost on the true output lengths and engine state: what perfect "
        "inputs give this cost function, which can be less than marginal_cost's. "
        + ceiling_note
        + "\n\n"
        + "\n".join(rows)
        + "\n"
    )


def _versus(c: CellResult, ref: str) -> str:
    lines = [f"Goodput minus {ref}'s, paired by seed, in points:\n"]
    lines += [f"- {label}: {paired_gap(c, label, ref)}" for label in c.labels() if label != ref]
    return "\n".join(lines) + "\n"
