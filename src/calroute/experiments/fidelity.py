"""Simulator fidelity: each comparison live and on the simulator configured as the live router was.

Does the simulator pick the live winner, and how far apart are the goodputs? (The paper's simulator, with
the router handed the true backlog, predicted the wrong winner on every workload; section VI.) Cells:
mixed-bursty with the paper's four policies, and the three prefix families with the prefix-aware peers, all
on 2P+4D. Run it on a live backend; the simulator half is run when the report is made, from what the live
half measured (experiments/kit/beside.py).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from calroute.experiments.kit.beside import hit_ratio, paired_residual, simulated_twin
from calroute.experiments.kit.cells import Cell, CellResult, baselines_and_product
from calroute.experiments.kit.report import fmt
from calroute.experiments.prefix import HOLD_TARGET, PEERS
from calroute.report import plots
from calroute.routing.variant import Variant

SHAPE = "2P4D"
PREFIX_FAMILIES = ("shared-prefix", "multi-turn", "agentic")
PREFIX_VARIANTS = tuple(Variant(p, p) for p in ("round_robin", "least_loaded", *PEERS, "marginal_cost"))


class Fidelity:
    name = "fidelity"
    title = "Simulator fidelity: 2P+4D, live vs the simulator configured as the live router (paper VI)"

    def cells(self, quick: bool) -> list[Cell]:
        families = PREFIX_FAMILIES[:1] if quick else PREFIX_FAMILIES
        return [
            Cell(SHAPE, 2, 4, "mixed-bursty", baselines_and_product(), tags={"workload": "mixed-bursty"}),
            *(
                Cell(
                    f"{SHAPE}-{family}",
                    2,
                    4,
                    family,
                    PREFIX_VARIANTS,
                    saturate_on=PEERS,
                    # where the best peer holds 0.90 on the run's own traces: past saturation a few
                    # collapsed traces decide the residual (docs/prefix.md, operating points)
                    saturation_target=HOLD_TARGET,
                    saturate_on_run_seeds=True,
                    tags={"workload": family},
                )
                for family in families
            ),
        ]

    def _sim(self, live: CellResult, exp_dir: Path) -> CellResult | None:
        cell = next((c for c in self.cells(False) if c.key == live.cell_key), None)
        if cell is None:
            return None
        return simulated_twin(live, cell, exp_dir, SHAPE, precise=cell.variants == PREFIX_VARIANTS)

    def report(self, results: list[CellResult], exp_dir: Path) -> str:
        head = f"## {self.title}\n\n"
        parts = [head]
        for live in results:
            sim = self._sim(live, exp_dir)
            if sim is None:
                return head + "Needs a live backend: `calroute experiment fidelity --backend emulated`.\n"
            parts.append(self._cell_report(live, sim, exp_dir))
        return "\n".join(parts)

    def _cell_report(self, live: CellResult, sim: CellResult, exp_dir: Path) -> str:
        labels = live.labels()
        pairs = {lb: (sim.mean_goodput(lb), live.mean_goodput(lb)) for lb in labels}
        png = plots.scatter(
            exp_dir / f"fidelity-{live.cell_key}.png",
            pairs,
            "simulator goodput",
            "live goodput",
            f"{live.cell_key}: live against the simulator",
        )
        sim_winner = max(labels, key=sim.mean_goodput)
        live_winner = max(labels, key=live.mean_goodput)
        per_trace = {lb: paired_residual(live, sim, lb) for lb in labels}
        worst = max(per_trace.values())
        source = sim.tags.get("prefix_source", "approximate")
        delay = sim.tags.get("kv_event_delay_s")
        how = (
            f"the simulated router on KV events heard {1e3 * delay:.1f} ms late (the live proxy's mean)"
            if source == "precise" and delay is not None
            else "the simulated router on its own placements (no prefixes to share)"
        )
        rows = [
            "| policy | live goodput (median) | simulator goodput (median) | mean abs residual per trace "
            "| live / simulator prefix-hit ratio |",
            "|---|---|---|---|---|",
        ]
        for lb in labels:
            rows.append(
                f"| {lb} | {fmt(live.mean_goodput(lb))} ({fmt(statistics.median(live.goodputs(lb)))}) "
                f"| {fmt(sim.mean_goodput(lb))} ({fmt(statistics.median(sim.goodputs(lb)))}) "
                f"| {fmt(per_trace[lb])} | {fmt(hit_ratio(live, lb))} / {fmt(hit_ratio(sim, lb))} |"
            )
        return (
            f"### {live.cell_key}: {live.tags.get('workload', '')} at {live.rate_rps:.2f} req/s, "
            f"n = {len(live.seeds())} traces of {live.runs[0].summary.requests} requests\n\n"
            f"Simulator: {how}. Winner: simulator {sim_winner}, live {live_winner} "
            f"({'the same' if sim_winner == live_winner else 'different'}); the largest mean absolute "
            f"residual of a policy {fmt(worst)} (paper: 0.068 overall, and its simulator never picked the "
            "live winner).\n\n" + "\n".join(rows) + f"\n\n![{png}]({self.name}/{png})\n"
        )
