"""The GPU frontier: total GPUs 3..8 at one offered load; how many GPUs each policy needs (paper V-F)."""

from __future__ import annotations

from pathlib import Path

from calroute.experiments.kit.cells import Cell, CellResult, baselines_and_product
from calroute.experiments.kit.report import goodput_table
from calroute.report import plots

TARGET_GOODPUT = 0.85


def split(gpus: int) -> tuple[int, int]:
    """Prefill/decode split for a GPU budget: a third prefill (at least one), as the paper's 2P+4D."""
    prefill = max(1, round(gpus / 3))
    return prefill, gpus - prefill


class Frontier:
    name = "frontier"
    title = "GPU frontier: 3..8 GPUs, mixed bursty at the 2P+4D saturation rate (paper V-F, Fig. 4)"

    def cells(self, quick: bool) -> list[Cell]:
        sizes = (3, 5, 6, 7) if quick else (3, 4, 5, 6, 7, 8)
        return [
            Cell(
                f"{n}gpu",
                *split(n),
                "mixed-bursty",
                baselines_and_product(),
                saturate_like=(2, 4),
                tags={"gpus": n},
            )
            for n in sizes
        ]

    def report(self, results: list[CellResult], exp_dir: Path) -> str:
        x = [float(c.tags["gpus"]) for c in results]
        labels = results[0].labels()
        series = {lb: [c.mean_goodput(lb) for c in results] for lb in labels}
        png = plots.lines(
            exp_dir / "frontier.png",
            x,
            series,
            "GPUs (prefill + decode)",
            "goodput",
            self.title,
            hline=TARGET_GOODPUT,
        )
        need = []
        for lb, g in series.items():
            first = next((int(n) for n, v in zip(x, g, strict=True) if v >= TARGET_GOODPUT), None)
            need.append(f"{lb}: {first if first is not None else 'more than ' + str(int(max(x)))}")
        return (
            f"## {self.title}\n\nGPUs needed for goodput >= {TARGET_GOODPUT}: "
            + "; ".join(need)
            + ". Paper: "
            "marginal_cost at 6 GPUs (0.870) matched round-robin at 7.\n\n"
            + goodput_table(results, "GPUs")
            + f"\n![{png}]({self.name}/{png})\n"
        )
