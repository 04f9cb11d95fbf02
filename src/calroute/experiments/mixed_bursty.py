"""Table II: the four policies on mixed bursty traffic, 2P+4D, three arrival traces (seeds), at saturation."""

from __future__ import annotations

from pathlib import Path

from calroute.experiments.kit.cells import Cell, CellResult, baselines_and_product
from calroute.experiments.kit.report import bars_by_cell, goodput_table, judged_slo, latency_cdfs

PAPER = {
    ("2P4D", "round_robin"): 0.836,
    ("2P4D", "least_loaded"): 0.835,
    ("2P4D", "length_heuristic"): 0.847,
    ("2P4D", "marginal_cost"): 0.864,
}


class MixedBursty:
    name = "mixed-bursty"
    title = "Mixed bursty traffic, 2P+4D at saturation (paper Table II)"

    def cells(self, quick: bool) -> list[Cell]:
        return [Cell("2P4D", 2, 4, "mixed-bursty", baselines_and_product(), tags={"decode": 4})]

    def report(self, results: list[CellResult], exp_dir: Path) -> str:
        slo = judged_slo(exp_dir, results[0].cell_key)
        pngs = [bars_by_cell(results, exp_dir, "goodput", self.title)]
        pngs += latency_cdfs(results[0], exp_dir, slo)
        return (
            f"## {self.title}\n\nSeeds are the three arrival traces. Paper: A40 hardware, vLLM 0.12.\n\n"
            + goodput_table(results, "cluster", PAPER)
            + "\n"
            + "".join(f"![{p}]({self.name}/{p})\n" for p in pngs)
        )
