"""The paper router's known failure regions, before and after our two changes to it (docs/policies.md):
marginal_cost as the paper prices it (decode backlog weighted like prefill's, a prefill priced by its own
wait only), ours before the second change (no decode backlog), and ours (also pricing the delay a prompt
adds to the requests batched with it), beside the baselines, on each family and on the narrow and scarce
clusters. The aim: never clearly worse than the best baseline, without giving back the lead on mixed
traffic."""

from __future__ import annotations

from pathlib import Path

from calroute.experiments.kit.cells import Cell, CellResult, baselines_and_product
from calroute.experiments.kit.report import bars_by_cell, fmt, goodput_table, paired_gap
from calroute.routing.variant import Variant

PAPER_POLICY = Variant("marginal_cost-paper", "marginal_cost", {"w_b_dec": 1.0, "w_cobatch": 0.0})
OWN_WAIT = Variant("marginal_cost-own-wait", "marginal_cost", {"w_cobatch": 0.0})
BASELINES = ("round_robin", "least_loaded", "length_heuristic")


class FailureRegions:
    name = "failure-regions"
    title = "Failure regions of the paper's router, before and after (no decode backlog, co-batch delay)"

    def cells(self, quick: bool) -> list[Cell]:
        variants = (*baselines_and_product(), PAPER_POLICY, OWN_WAIT)
        families = [Cell(f, 2, 4, f, variants) for f in ("chat", "document", "reasoning", "mixed-bursty")]
        return [
            *families,
            Cell("narrow-2P3D", 2, 3, "mixed-bursty", variants, saturate_like=(2, 4)),
            Cell("scarce-1P2D", 1, 2, "mixed-bursty", variants),
        ]

    def report(self, results: list[CellResult], exp_dir: Path) -> str:
        png = bars_by_cell(results, exp_dir, "goodput", self.title)
        lines = [
            "| cell | best baseline | goodput | marginal_cost-paper | marginal_cost-own-wait | marginal_cost "
            "| ours - best baseline, paired (pts) |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in results:
            best = max(BASELINES, key=c.mean_goodput)
            ours = c.mean_goodput("marginal_cost")
            lines.append(
                f"| {c.cell_key} | {best} | {fmt(c.mean_goodput(best))} | "
                f"{fmt(c.mean_goodput(PAPER_POLICY.label))} | {fmt(c.mean_goodput(OWN_WAIT.label))} | "
                f"{fmt(ours)} | "
                f"{paired_gap(c, 'marginal_cost', best)} |"
            )
        return (
            f"## {self.title}\n\nmarginal_cost-paper is the paper's formula (`w_b_dec=1`: the decode backlog "
            "weighted like the prefill backlog; `w_cobatch=0`: a prefill priced by its own wait only); "
            "marginal_cost-own-wait drops the decode backlog (`w_cobatch=0`); marginal_cost is ours, which "
            "also prices the delay a prompt adds to the requests it is batched with (docs/policies.md). "
            "Chat, document, reasoning and mixed bursty on 2P+4D at their own saturation; the narrow pool "
            "(2P+3D) at the 2P+4D rate; scarcity (1P+2D) at its own.\n\n"
            + "\n".join(lines)
            + "\n\n"
            + goodput_table(results, "cell")
            + f"\n![{png}]({self.name}/{png})\n"
        )
