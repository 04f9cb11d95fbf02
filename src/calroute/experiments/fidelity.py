"""Simulator fidelity: each comparison live and on the simulator configured as the live router was.

Does the simulator pick the live winner, and how far apart are the goodputs? (The paper's simulator, with
the router handed the true backlog, predicted the wrong winner on every workload; section VI.) Cells:
mixed-bursty with the paper's four policies, and the three prefix families with the prefix-aware peers, all
on 2P+4D. Run it on a live backend; the simulator half is run when the report is made, from what the live
half measured: the cluster's calibration, its engines' KV capacity and model length, the same traces (seeds
and requests), the same SLO spec, and, where the proxy routed on the engines' KV events, the same source
for the simulated router with the KV-event delay the live proxy measured (its mean over the cell's runs).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from calroute.cluster.file import ClusterFile
from calroute.costmodel.calibration import Calibration
from calroute.costmodel.profiles import EngineLimits, profile_from_calibration
from calroute.costmodel.slo import SloSpec
from calroute.experiments.kit.cells import Cell, CellResult, baselines_and_product
from calroute.experiments.kit.live_backend import LIVE_KV_EVENT_DELAY_S, engine_limits
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
        cached = exp_dir / f"sim-{live.cell_key}.json"
        if cached.exists():
            return CellResult.from_dict(json.loads(cached.read_text()))
        shape_dir = exp_dir.parent / "_clusters" / SHAPE
        cal_path = shape_dir / "calibration.json"
        if live.backend == "sim" or not cal_path.exists():
            return None
        from calroute.experiments.kit.sim_backend import SimBackend

        cell = next((c for c in self.cells(False) if c.key == live.cell_key), None)
        if cell is None:
            return None
        manifest = json.loads((exp_dir / "manifest.json").read_text())
        # judged as the live half was: by the experiment's SLO spec on the same calibration
        slo = SloSpec.from_definition(manifest.get("slo") or {"name": "paper"})
        backend = SimBackend(
            profile_from_calibration(Calibration.load(cal_path), cluster_limits(shape_dir / "cluster.yaml")),
            slo,
            prefix_source="precise" if cell.variants == PREFIX_VARIANTS else "approximate",
            kv_event_delay_s=measured_delay_s(live) or LIVE_KV_EVENT_DELAY_S,
        )
        seeds = live.seeds()
        requests = live.runs[0].summary.requests
        runs = backend.run_cell(
            cell, live.rate_rps, seeds, requests, exp_dir / "sim-records" / cell.key, lambda r: None
        )
        result = CellResult(
            cell.key,
            "sim",
            live.rate_rps,
            tuple(runs),
            {
                **cell.tags,
                "prefix_source": backend.prefix_source,
                "kv_event_delay_s": backend.kv_event_delay_s,
                "requests": requests,
            },
        )
        cached.write_text(json.dumps(result.to_dict(), indent=2))
        return result

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


def paired_residual(live: CellResult, sim: CellResult, label: str) -> float:
    """Mean over the traces both ran of |simulated - live goodput|."""
    lv = {r.seed: r.summary.goodput for r in live.runs if r.label == label}
    sv = {r.seed: r.summary.goodput for r in sim.runs if r.label == label}
    both = sorted(set(lv) & set(sv))
    return statistics.fmean(abs(sv[s] - lv[s]) for s in both) if both else float("nan")


def hit_ratio(cell: CellResult, label: str) -> float:
    runs = [r for r in cell.runs if r.label == label]
    return statistics.fmean(r.summary.prefix_hit_ratio for r in runs) if runs else float("nan")


def measured_delay_s(live: CellResult) -> float | None:
    delays = [r.kv_event_delay_s for r in live.runs if r.kv_event_delay_s is not None]
    return statistics.fmean(delays) if delays else None


def cluster_limits(cluster_path: Path) -> EngineLimits:
    """The live engines' KV capacity and model length, where their cluster file is (else the defaults)."""
    return engine_limits(ClusterFile.load(cluster_path)) if cluster_path.exists() else EngineLimits()
