"""Headroom: how far the best router could go beyond marginal_cost, family by family (issue 26).

Each cell is one workload family on 2P+4D at the rate where the hand-set marginal_cost's goodput crosses 0.85:
the rate its `calroute tune` study found on the training seeds and validated at (training.saturation in the
params file), or a fresh search where the family has no file. The prefix families hold or collapse seed by
seed near saturation, so a search on other seeds can land far from the study's rate (shared-prefix: 8.45
req/s on the experiment's saturation seeds against the study's 5.24); the study's rate keeps the table beside
the tuning's validation. Its variants: the baselines (the paper's for the paper's families, least_loaded and
the prefix-aware peers for the prefix families), marginal_cost hand-set, tuned on that family and tuned on
every family at once (``all.json``), and the oracle (marginal_cost's prices on the true output lengths and
engine state) hand-set and tuned. The tuned parameters come from docs/results/tuning (tuned_params.py): the
oracle's own study where one was run, else the oracle with marginal_cost's tuned weights. The bound is the
best oracle variant: taking the best of two after the fact flatters it a little, which a bound may afford.

Run it on seeds the tuning never saw:
``calroute experiment headroom --seeds 10 --first-seed 4 --requests 3000`` (the studies trained on seeds
0-3). The report names any run seed a tuned variant was trained on.
"""

from __future__ import annotations

from pathlib import Path

from calroute.experiments.kit.cells import Cell, CellResult
from calroute.experiments.kit.params_files import TUNING_DIR, Tuned, trained_on, tuned_variant
from calroute.experiments.kit.report import bars_by_cell, fmt, goodput_table, paired_gap
from calroute.routing.variant import Variant

PAPER_FAMILIES = ("chat", "document", "reasoning", "mixed-bursty")
PREFIX_FAMILIES = ("shared-prefix", "multi-turn", "agentic")
PAPER_BASELINES = ("round_robin", "least_loaded", "length_heuristic")
PREFIX_BASELINES = ("least_loaded", "prefix_scorer_mix", "kv_overlap_cost", "cache_aware")
OURS = ("marginal_cost", "marginal_cost-tuned", "marginal_cost-all")
ORACLES = ("oracle", "oracle-tuned", "oracle-mc-tuned")


def _tuned(family: str) -> list[Tuned]:
    mc = tuned_variant("marginal_cost-tuned", "marginal_cost", TUNING_DIR / f"{family}.json")
    # one set of weights for every family (`calroute tune --workload all`): a candidate for the defaults
    every = tuned_variant("marginal_cost-all", "marginal_cost", TUNING_DIR / "all.json")
    own = tuned_variant("oracle-tuned", "oracle", TUNING_DIR / f"oracle-{family}.json")
    borrowed = tuned_variant("oracle-mc-tuned", "oracle", TUNING_DIR / f"{family}.json")
    return [t for t in (mc, every, own, borrowed) if t is not None]


def _baselines(family: str) -> tuple[str, ...]:
    return PREFIX_BASELINES if family in PREFIX_FAMILIES else PAPER_BASELINES


class Headroom:
    name = "headroom"
    title = "Headroom: baselines, marginal_cost hand-set and tuned, and the oracle, 2P+4D at saturation"

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
                Variant("oracle", "oracle"),
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
        png = bars_by_cell(results, exp_dir, "goodput", self.title)
        parts = [f"## {self.title}\n", warning, _summary(results), "\n", goodput_table(results, "family")]
        parts.append(f"\n![{png}]({self.name}/{png})\n")
        for c in results:
            parts.append(f"\n### {c.cell_key} ({c.rate_rps:.2f} req/s)\n")
            parts.append(_versus(c, "marginal_cost"))
            missing = [label for label in (*OURS, *ORACLES) if label not in c.labels()]
            if missing:
                parts.append(f"\nNo params file in docs/results/tuning for: {', '.join(missing)}.\n")
        return "\n".join(parts) + "\n"


def _best(c: CellResult, labels: tuple[str, ...]) -> str | None:
    present = [label for label in labels if label in c.labels()]
    return max(present, key=c.mean_goodput) if present else None


def _summary(results: list[CellResult]) -> str:
    """Per family: the best baseline, marginal_cost's lead over it, tuning's gain, what the bound leaves."""
    rows = [
        "| family | req/s | best baseline | marginal_cost - it | tuned - hand-set marginal_cost "
        "| tuned on all - hand-set | bound (best oracle) | bound - best marginal_cost |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in results:
        base = _best(c, _baselines(c.cell_key))
        ours = _best(c, OURS)
        bound = _best(c, ORACLES)
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
                    f"{bound} {fmt(c.mean_goodput(bound))}" if bound else "",
                    f"{paired_gap(c, bound, ours)} (vs {ours})" if bound and ours else "",
                ]
            )
            + " |"
        )
    return (
        "Paired differences in goodput points, mean [95 % bootstrap interval], by seed; the best baseline "
        "and the best oracle are chosen after the fact, by mean.\n\n" + "\n".join(rows) + "\n"
    )


def _versus(c: CellResult, ref: str) -> str:
    lines = [f"Goodput minus {ref}'s, paired by seed, in points:\n"]
    lines += [f"- {label}: {paired_gap(c, label, ref)}" for label in c.labels() if label != ref]
    return "\n".join(lines) + "\n"
