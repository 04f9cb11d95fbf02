"""The paper router's known failure regions, before and after our change to it (docs/policies.md):
marginal_cost as the paper prices it (decode backlog weighted like prefill's) against ours (no decode
backlog), beside the baselines, on each family and on the narrow and scarce clusters. The aim: never clearly
worse than the best baseline, without giving back the lead on mixed traffic."""

from __future__ import annotations

from pathlib import Path

from calroute.experiments.base import bars_by_cell, fmt, goodput_table
from calroute.experiments.cells import Cell, CellResult, Variant, baselines_and_product

PAPER_POLICY = Variant("marginal_cost-paper", "marginal_cost", {"w_b_dec": 1.0})
BASELINES = ("round_robin", "least_loaded", "length_heuristic")


class FailureRegions:
    name = "failure-regions"
    title = "Failure regions of the paper's router, before and after (no decode backlog)"

    def cells(self, quick: bool) -> list[Cell]:
        variants = (*baselines_and_product(), PAPER_POLICY)
        families = [Cell(f, 2, 4, f, variants) for f in ("chat", "document", "reasoning", "mixed-bursty")]
        return [
            *families,
            Cell("narrow-2P3D", 2, 3, "mixed-bursty", variants, saturate_like=(2, 4)),
            Cell("scarce-1P2D", 1, 2, "mixed-bursty", variants),
        ]

    def report(self, results: list[CellResult], exp_dir: Path) -> str:
        png = bars_by_cell(results, exp_dir, "goodput", self.title)
        lines = [
            "| cell | best baseline | goodput | marginal_cost-paper | marginal_cost | ours - best baseline |",
            "|---|---|---|---|---|---|",
        ]
        for c in results:
            best = max(BASELINES, key=c.mean_goodput)
            ours = c.mean_goodput("marginal_cost")
            lines.append(
                f"| {c.cell_key} | {best} | {fmt(c.mean_goodput(best))} | "
                f"{fmt(c.mean_goodput(PAPER_POLICY.label))} | {fmt(ours)} | "
                f"{100 * (ours - c.mean_goodput(best)):+.1f} pts |"
            )
        return (
            f"## {self.title}\n\nmarginal_cost-paper weights the decode backlog like the prefill backlog "
            "(`w_b_dec=1`, the paper's formula); marginal_cost is ours (`w_b_dec=0`, docs/policies.md). "
            "Chat, document, reasoning and mixed bursty on 2P+4D at their own saturation; the narrow pool "
            "(2P+3D) at the 2P+4D rate; scarcity (1P+2D) at its own.\n\n"
            + "\n".join(lines)
            + "\n\n"
            + goodput_table(results, "cell")
            + f"\n![{png}]({self.name}/{png})\n"
        )
