"""The live check of tuned weights (issue 26): marginal_cost with the weights `calroute tune` found on
shared-prefix, against its hand-set weights, least_loaded and llm-d's scorer mix, 2P+4D at the rate where the
hand-set marginal_cost's goodput crosses 0.85.

shared-prefix is the family where tuning moved something on the simulator (docs/tuning.md); the weights tuned
on mixed-bursty are within noise of the hand-set ones there, so a live run of them could only say the same at
greater cost. The report pairs every variant with the hand-set marginal_cost by seed (the same arrival trace).
Run it on seeds the study did not train on: ``calroute experiment tuned --backend emulated --first-seed 4``.
"""

from __future__ import annotations

from pathlib import Path

from calroute.experiments.base import bars_by_cell, goodput_table, paired_gap
from calroute.experiments.cells import Cell, CellResult
from calroute.experiments.tuned_params import TUNING_DIR, Tuned, trained_on, tuned_variant
from calroute.routing.variant import Variant

FAMILY = "shared-prefix"
OURS = "marginal_cost"


def _tuned() -> list[Tuned]:
    t = tuned_variant("marginal_cost-tuned", "marginal_cost", TUNING_DIR / f"{FAMILY}.json")
    return [] if t is None else [t]


class TunedCheck:
    name = "tuned"
    title = "Tuned weights, live: marginal_cost tuned on shared-prefix against hand-set, 2P+4D at saturation"

    def cells(self, quick: bool) -> list[Cell]:
        return [
            Cell(
                FAMILY,
                2,
                4,
                FAMILY,
                (
                    Variant("least_loaded", "least_loaded"),
                    Variant("prefix_scorer_mix", "prefix_scorer_mix"),
                    Variant("marginal_cost", "marginal_cost"),
                    *(t.variant for t in _tuned()),
                ),
                saturate_on=("marginal_cost",),
                tags={"family": FAMILY},
            )
        ]

    def report(self, results: list[CellResult], exp_dir: Path) -> str:
        seeds = sorted({s for c in results for s in c.seeds()})
        overlap = trained_on(_tuned(), seeds)
        parts = [f"## {self.title}\n"]
        if overlap:
            parts.append("**Not a validation:** " + "; ".join(overlap) + ".\n")
        if not _tuned():
            parts.append(f"No params file {TUNING_DIR / (FAMILY + '.json')}: the tuned variant is missing.\n")
        parts.append(goodput_table(results, "family"))
        for c in results:
            parts.append(
                f"\nMinus the hand-set marginal_cost, paired by seed, in points ({c.rate_rps:.2f} req/s):\n"
            )
            parts += [f"- {x}: {paired_gap(c, x, OURS)}" for x in c.labels() if x != OURS]
        png = bars_by_cell(results, exp_dir, "goodput", self.title)
        parts.append(f"\n![{png}]({self.name}/{png})\n")
        return "\n".join(parts) + "\n"
