"""Predictor noise: relative error 0..150 % injected into the output-length prediction (paper V-H)."""

from __future__ import annotations

from pathlib import Path

from calroute.experiments.kit.cells import Cell, CellResult
from calroute.experiments.kit.report import goodput_table
from calroute.report import plots
from calroute.routing.variant import Variant

LEVELS = (0.0, 0.25, 0.5, 1.0, 1.5)


class Noise:
    name = "noise"
    title = "Predictor noise 0..150 %, 2P+4D mixed bursty at saturation (paper V-H)"

    def cells(self, quick: bool) -> list[Cell]:
        levels = (0.0, 0.5, 1.5) if quick else LEVELS
        return [
            Cell(
                f"noise{int(100 * e)}",
                2,
                4,
                "mixed-bursty",
                (
                    Variant("marginal_cost", "marginal_cost", predictor="oracle", predictor_noise=e),
                    Variant("length_heuristic", "length_heuristic", predictor="oracle", predictor_noise=e),
                    Variant("round_robin", "round_robin"),
                ),
                tags={"noise": e},
            )
            for e in levels
        ]

    def report(self, results: list[CellResult], exp_dir: Path) -> str:
        x = [100 * float(c.tags["noise"]) for c in results]
        labels = results[0].labels()
        png = plots.lines(
            exp_dir / "noise.png",
            x,
            {lb: [c.mean_goodput(lb) for c in results] for lb in labels},
            "relative error injected (%)",
            "goodput",
            self.title,
        )
        return (
            f"## {self.title}\n\nThe predictions are the true length times (1 + e), e uniform in [-E, E]. "
            "Paper: goodput stays within 0.838-0.880 across noise levels, ahead of the heuristic.\n\n"
            + goodput_table(results, "noise")
            + f"\n![{png}]({self.name}/{png})\n"
        )
