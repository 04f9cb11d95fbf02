"""Feature ablation: marginal_cost without each admission-time feature, steady and saturated (paper V-G)."""

from __future__ import annotations

from pathlib import Path

from calroute.experiments.kit.cells import Cell, CellResult
from calroute.experiments.kit.report import bars_by_cell, goodput_table, paired_gap
from calroute.routing.variant import Variant

VARIANTS = (
    Variant("full", "marginal_cost"),
    Variant("no-output-length", "marginal_cost", {"use_output_length": False}),
    Variant("no-kv-pressure", "marginal_cost", {"use_kv_pressure": False}),
    Variant("no-slo", "marginal_cost", {"use_slo": False}),
    Variant("no-prompt-length", "marginal_cost", {"use_prompt_length": False}),
)


class Ablation:
    name = "ablation"
    title = "Feature ablation of marginal_cost, 2P+4D mixed bursty, steady (0.7x) and saturated (paper V-G)"

    def cells(self, quick: bool) -> list[Cell]:
        return [
            Cell("steady", 2, 4, "mixed-bursty", VARIANTS, rate_factor=0.7, tags={"load": "steady"}),
            Cell("saturated", 2, 4, "mixed-bursty", VARIANTS, tags={"load": "saturated"}),
        ]

    def report(self, results: list[CellResult], exp_dir: Path) -> str:
        png = bars_by_cell(results, exp_dir, "goodput", self.title)
        deltas = []
        for c in results:
            deltas.append(
                f"{c.cell_key}: " + ", ".join(f"{lb} {paired_gap(c, lb, 'full')}" for lb in c.labels()[1:])
            )
        return (
            f"## {self.title}\n\nGoodput change in points against the full policy, paired by seed: "
            + "; ".join(deltas)
            + ". "
            "Paper: without predicted output length -3.2 (steady) and -4.7 (saturated); without KV pressure "
            "no change; without the SLO term +3.7 under deep saturation.\n\n"
            + goodput_table(results, "load")
            + f"\n![{png}]({self.name}/{png})\n"
        )
