"""Workload heterogeneity: which policy wins on each family, each at its own saturation (paper V-C)."""

from __future__ import annotations

from pathlib import Path

from calroute.experiments.kit.cells import Cell, CellResult, baselines_and_product
from calroute.experiments.kit.report import bars_by_cell, goodput_table

PAPER = {
    ("chat", "marginal_cost"): 0.760,
    ("chat", "length_heuristic"): 0.855,
    ("mixed-bursty", "marginal_cost"): 0.864,
    ("mixed-bursty", "length_heuristic"): 0.847,
}


class Heterogeneity:
    name = "heterogeneity"
    title = "Workload heterogeneity: the four families, 2P+4D, each at saturation (paper V-C, Fig. 3)"

    def cells(self, quick: bool) -> list[Cell]:
        return [
            Cell(family, 2, 4, family, baselines_and_product(), tags={"workload": family})
            for family in ("chat", "document", "reasoning", "mixed-bursty")
        ]

    def report(self, results: list[CellResult], exp_dir: Path) -> str:
        png = bars_by_cell(results, exp_dir, "goodput", self.title)
        winners = ", ".join(f"{c.cell_key}: {max(c.labels(), key=c.mean_goodput)}" for c in results)
        return (
            f"## {self.title}\n\nWinner per family: {winners}.\n\n"
            + goodput_table(results, "workload", PAPER)
            + f"\n![{png}]({self.name}/{png})\n"
        )
