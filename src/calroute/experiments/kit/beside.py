"""A live cell's simulated twin: the same cell on the simulator configured as the live router was.

Made from what the live half measured: the cluster's calibration and its engines' KV capacity and model
length (the cluster file), the same traces (seeds and requests), the same SLO spec, and, where the proxy
routed on the engines' KV events, the same source for the simulated router with the KV-event delay the
live proxy measured (its mean over the cell's runs). Used by ``fidelity`` and by the experiments whose
live report sets the simulator's figures beside the live ones (``local-prefill``). The twin is saved
beside the live results (``sim-<cell>.json``) and reused."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from calroute.cluster.file import ClusterFile
from calroute.costmodel.calibration import Calibration
from calroute.costmodel.profiles import EngineLimits, profile_from_calibration
from calroute.costmodel.slo import SloSpec
from calroute.experiments.kit.cells import Cell, CellResult
from calroute.experiments.kit.live_backend import LIVE_KV_EVENT_DELAY_S, engine_limits


def simulated_twin(
    live: CellResult, cell: Cell, exp_dir: Path, shape: str, precise: bool
) -> CellResult | None:
    """``cell`` as the simulator runs it beside ``live`` (None: ``live`` is itself simulated, or the live
    cluster's calibration is not where the live backend keeps it, ``_clusters/<shape>``). ``precise``: the
    simulated router on KV events with the live proxy's measured delay, else on its own placements."""
    cached = exp_dir / f"sim-{live.cell_key}.json"
    if cached.exists():
        return CellResult.from_dict(json.loads(cached.read_text()))
    shape_dir = exp_dir.parent / "_clusters" / shape
    cal_path = shape_dir / "calibration.json"
    if live.backend == "sim" or not cal_path.exists():
        return None
    from calroute.experiments.kit.sim_backend import SimBackend

    manifest = json.loads((exp_dir / "manifest.json").read_text())
    # judged as the live half was: by the experiment's SLO spec on the same calibration
    slo = SloSpec.from_definition(manifest.get("slo") or {"name": "paper"})
    backend = SimBackend(
        profile_from_calibration(Calibration.load(cal_path), cluster_limits(shape_dir / "cluster.yaml")),
        slo,
        prefix_source="precise" if precise else "approximate",
        kv_event_delay_s=measured_delay_s(live) or LIVE_KV_EVENT_DELAY_S,
    )
    requests = live.runs[0].summary.requests
    runs = backend.run_cell(
        cell, live.rate_rps, live.seeds(), requests, exp_dir / "sim-records" / cell.key, lambda r: None
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
