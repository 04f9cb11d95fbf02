"""Decode-pool width 3..6 with 2 prefill instances, mixed bursty at the 2P+4D saturation rate (paper V-D)."""

from __future__ import annotations

from pathlib import Path

from calroute.experiments.kit.cells import Cell, CellResult, baselines_and_product
from calroute.experiments.kit.report import goodput_table
from calroute.report import plots

PAPER = {
    ("2P3D", "marginal_cost"): 0.816,
    ("2P3D", "least_loaded"): 0.822,
    ("2P4D", "marginal_cost"): 0.864,
    ("2P4D", "least_loaded"): 0.835,
    ("2P6D", "marginal_cost"): 0.858,
    ("2P6D", "round_robin"): 0.860,
}


class Width:
    name = "width"
    title = "Decode-pool width: 2 prefill + 3..6 decode, mixed bursty (paper V-D)"

    def cells(self, quick: bool) -> list[Cell]:
        widths = (3, 4, 6) if quick else (3, 4, 5, 6)
        # The paper kept the 2P+4D rate for every width (its width-4 row reproduces Table II exactly).
        return [
            Cell(
                f"2P{d}D",
                2,
                d,
                "mixed-bursty",
                baselines_and_product(),
                saturate_like=(2, 4),
                tags={"decode": d},
            )
            for d in widths
        ]

    def report(self, results: list[CellResult], exp_dir: Path) -> str:
        x = [float(c.tags["decode"]) for c in results]
        labels = results[0].labels()
        png = plots.lines(
            exp_dir / "width.png",
            x,
            {lb: [c.mean_goodput(lb) for c in results] for lb in labels},
            "decode instances (2 prefill)",
            "goodput",
            self.title,
        )
        return (
            f"## {self.title}\n\n"
            + goodput_table(results, "cluster", PAPER)
            + f"\n![{png}]({self.name}/{png})\n"
        )
