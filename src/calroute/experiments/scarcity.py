"""Extreme scarcity: 1 prefill + 2 decode, mixed bursty at its own saturation (paper V-E)."""

from __future__ import annotations

from pathlib import Path

from calroute.experiments.kit.cells import Cell, CellResult, baselines_and_product
from calroute.experiments.kit.report import bars_by_cell, goodput_table

PAPER = {("1P2D", "marginal_cost"): 0.292, ("1P2D", "round_robin"): 0.680}


class Scarcity:
    name = "scarcity"
    title = "Extreme scarcity: 1P+2D, mixed bursty at saturation (paper V-E)"

    def cells(self, quick: bool) -> list[Cell]:
        return [Cell("1P2D", 1, 2, "mixed-bursty", baselines_and_product())]

    def report(self, results: list[CellResult], exp_dir: Path) -> str:
        png = bars_by_cell(results, exp_dir, "goodput", self.title)
        return (
            f"## {self.title}\n\n"
            + goodput_table(results, "cluster", PAPER)
            + f"\n![{png}]({self.name}/{png})\n"
        )
