"""Simulator fidelity: the mixed-bursty comparison live and on the simulator calibrated to the same cluster.

Does the simulator pick the live winner, and how far apart are the goodputs? (The paper's simulator, with
the router handed the true backlog, predicted the wrong winner on every workload; section VI.) Run it on a
live backend; the simulator half is run from the live cluster's calibration when the report is made.
"""

from __future__ import annotations

import json
from pathlib import Path

from calroute.costmodel.calibration import Calibration
from calroute.costmodel.profiles import profile_from_calibration
from calroute.costmodel.slo import SloSpec
from calroute.experiments.kit.cells import Cell, CellResult, baselines_and_product
from calroute.experiments.kit.report import fmt, goodput_table
from calroute.report import plots

SIM_REQUESTS = 4000


class Fidelity:
    name = "fidelity"
    title = "Simulator fidelity: mixed bursty 2P+4D, live vs the calibrated simulator (paper VI)"

    def cells(self, quick: bool) -> list[Cell]:
        return [Cell("2P4D", 2, 4, "mixed-bursty", baselines_and_product())]

    def _sim(self, live: CellResult, exp_dir: Path) -> CellResult | None:
        cached = exp_dir / "sim-cell.json"
        if cached.exists():
            return CellResult.from_dict(json.loads(cached.read_text()))
        cal_path = exp_dir.parent / "_clusters" / "2P4D" / "calibration.json"
        if live.backend == "sim" or not cal_path.exists():
            return None
        from calroute.experiments.kit.sim_backend import SimBackend

        manifest = json.loads((exp_dir / "manifest.json").read_text())
        # judged as the live half was: by the experiment's SLO spec on the same calibration
        slo = SloSpec.from_definition(manifest.get("slo") or {"name": "paper"})
        backend = SimBackend(profile_from_calibration(Calibration.load(cal_path)), slo)
        cell = self.cells(False)[0]
        seeds = sorted({r.seed for r in live.runs})
        runs = backend.run_cell(
            cell, live.rate_rps, seeds, SIM_REQUESTS, exp_dir / "sim-records", lambda r: None
        )
        result = CellResult(cell.key, "sim", live.rate_rps, tuple(runs))
        cached.write_text(json.dumps(result.to_dict(), indent=2))
        return result

    def report(self, results: list[CellResult], exp_dir: Path) -> str:
        live = results[0]
        sim = self._sim(live, exp_dir)
        head = f"## {self.title}\n\n"
        if sim is None:
            return head + "Needs a live backend: `calroute experiment fidelity --backend emulated`.\n"
        labels = live.labels()
        pairs = {lb: (sim.mean_goodput(lb), live.mean_goodput(lb)) for lb in labels}
        png = plots.scatter(exp_dir / "fidelity.png", pairs, "simulator goodput", "live goodput", self.title)
        sim_winner = max(labels, key=sim.mean_goodput)
        live_winner = max(labels, key=live.mean_goodput)
        residual = sum(abs(s - v) for s, v in pairs.values()) / len(pairs)
        return (
            head + f"Winner: simulator {sim_winner}, live {live_winner} "
            f"({'the same' if sim_winner == live_winner else 'different'}). Mean absolute goodput residual "
            f"{fmt(residual)} (paper: 0.068, and its simulator never picked the live winner).\n\n"
            "Live:\n\n" + goodput_table([live], "cluster") + "\nSimulator (calibrated to the live cluster, "
            f"{SIM_REQUESTS} requests per run):\n\n"
            + goodput_table([sim], "cluster")
            + f"\n![{png}]({self.name}/{png})\n"
        )
