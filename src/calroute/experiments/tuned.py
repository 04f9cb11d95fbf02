"""The live check of the defaults and of tuned weights: marginal_cost with its current defaults against the
weights it had before them (w_b = w_evict = 1), the weights `calroute tune` found on shared-prefix,
least_loaded and llm-d's scorer mix; 2P+4D at the rate where the default marginal_cost's goodput crosses 0.85.

Two cells. shared-prefix is the family where tuning moved something on the simulator (docs/tuning.md);
mixed-bursty is the paper family where the current defaults won on the simulator, so it is the one a live run
can confirm or refute. The weights tuned on mixed-bursty alone are within noise of the defaults there, so a
live run of them could only say the same at greater cost. The report pairs every variant with the default
marginal_cost by seed (the same arrival trace). Run it on seeds the studies did not train on:
``calroute experiment tuned --backend emulated --first-seed 4``.
"""

from __future__ import annotations

from pathlib import Path

from calroute.experiments.kit.cells import Cell, CellResult
from calroute.experiments.kit.params_files import TUNING_DIR, Tuned, trained_on, tuned_variant
from calroute.experiments.kit.report import bars_by_cell, goodput_table, paired_gap
from calroute.routing.variant import Variant

FAMILY = "shared-prefix"
CONTROL = "mixed-bursty"
OURS = "marginal_cost"
# The weights marginal_cost had until `calroute tune --workload all` set w_b 0.26 and w_evict 1.16.
BEFORE = Variant("marginal_cost-w1", "marginal_cost", {"w_b": 1.0, "w_evict": 1.0})


def _tuned() -> list[Tuned]:
    t = tuned_variant("marginal_cost-tuned", "marginal_cost", TUNING_DIR / f"{FAMILY}.json")
    return [] if t is None else [t]


class TunedCheck:
    name = "tuned"
    title = (
        "The defaults and tuned weights, live: marginal_cost against its earlier weights, 2P+4D, saturated"
    )

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
                    Variant(OURS, OURS),
                    BEFORE,
                    *(t.variant for t in _tuned()),
                ),
                saturate_on=(OURS,),
                tags={"family": FAMILY},
            ),
            Cell(
                CONTROL,
                2,
                4,
                CONTROL,
                (Variant("least_loaded", "least_loaded"), Variant(OURS, OURS), BEFORE),
                saturate_on=(OURS,),
                tags={"family": CONTROL},
            ),
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
            head = f"{c.cell_key}, minus the default marginal_cost, paired by seed, in points"
            parts.append(f"\n{head} ({c.rate_rps:.2f} req/s):\n")
            parts += [f"- {x}: {paired_gap(c, x, OURS)}" for x in c.labels() if x != OURS]
        png = bars_by_cell(results, exp_dir, "goodput", self.title)
        parts.append(f"\n![{png}]({self.name}/{png})\n")
        return "\n".join(parts) + "\n"
