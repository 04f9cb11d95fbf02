"""The value of calibration: marginal_cost priced with the hardware's constants, with the paper's simulator
constants (7.4x too cheap), and with online recalibration starting from the wrong ones (paper V-B)."""

from __future__ import annotations

from pathlib import Path

from calroute.experiments.kit.cells import Cell, CellResult
from calroute.experiments.kit.report import bars_by_cell, goodput_table
from calroute.routing.variant import Variant

PAPER = {("2P4D", "calibrated"): 0.864, ("2P4D", "mismatched"): 0.819}


class CalibrationValue:
    name = "calibration"
    title = "Value of calibration: calibrated vs mismatched vs online constants (paper V-B)"

    def cells(self, quick: bool) -> list[Cell]:
        variants = (
            Variant("calibrated", "marginal_cost", router="calibrated"),
            Variant("mismatched", "marginal_cost", router="mismatched"),
            Variant("online", "marginal_cost", router="online"),
            Variant("round_robin", "round_robin"),
        )
        return [Cell("2P4D", 2, 4, "mixed-bursty", variants)]

    def report(self, results: list[CellResult], exp_dir: Path) -> str:
        png = bars_by_cell(results, exp_dir, "goodput", self.title)
        return (
            f"## {self.title}\n\nMismatched: tau_pre and tau_dec divided by 7.4, the factor by which the "
            "paper's simulator under-priced decode on the A40s. Online: starts mismatched and refits from "
            "completed requests.\n\n"
            + goodput_table(results, "cluster", PAPER)
            + f"\n![{png}]({self.name}/{png})\n"
        )
