"""The fidelity experiment's simulator half is configured as the live half ran: its calibration, its engines'
limits, its traces, its SLO spec, and on prefix families its router's source of KV events and their delay."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from calroute.cluster.file import ClusterEngine, ClusterFile
from calroute.costmodel.profiles import get_profile
from calroute.experiments.fidelity import Fidelity
from calroute.experiments.kit.beside import cluster_limits, paired_residual
from calroute.experiments.kit.cells import CellResult
from calroute.experiments.kit.sim_backend import SimBackend
from calroute.types import Role

PROFILE = get_profile("a40-qwen2.5-3b")


def fake_live(cell_key: str, delay_s: float, tmp_path: Path) -> CellResult:
    """A 'live' cell: the simulator's own runs, labelled as live and stamped with a KV-event delay."""
    cell = next(c for c in Fidelity().cells(True) if c.key == cell_key)
    runs = SimBackend(PROFILE).run_cell(cell, 6.0, (0, 1), 120, tmp_path / "live-records", lambda r: None)
    return CellResult(
        cell.key, "emulated", 6.0, tuple(replace(r, kv_event_delay_s=delay_s) for r in runs), dict(cell.tags)
    )


def experiment_dir(tmp_path: Path, slo: str) -> Path:
    """A fidelity experiment's folder as a live run leaves it: its manifest's SLO spec, the cluster's
    calibration (the profile's)."""
    exp_dir = tmp_path / "fidelity"
    exp_dir.mkdir()
    (exp_dir / "manifest.json").write_text(json.dumps({"slo": {"name": slo}}))
    shape = tmp_path / "_clusters" / "2P4D"
    shape.mkdir(parents=True)
    PROFILE.calibration.save(shape / "calibration.json")
    return exp_dir


def test_the_simulator_half_routes_as_the_live_proxy_did(tmp_path: Path) -> None:
    exp_dir = experiment_dir(tmp_path, "long-context")
    live = fake_live("2P4D-shared-prefix", 0.02, tmp_path)
    report = Fidelity().report([live], exp_dir)
    sim = CellResult.from_dict(json.loads((exp_dir / "sim-2P4D-shared-prefix.json").read_text()))
    assert sim.tags["prefix_source"] == "precise" and sim.tags["kv_event_delay_s"] == 0.02
    assert sim.seeds() == [0, 1] and all(r.summary.requests == 120 for r in sim.runs)
    assert {r.label for r in sim.runs} == {r.label for r in live.runs}
    assert "KV events heard 20.0 ms late" in report and "n = 2 traces of 120 requests" in report
    for label in live.labels():
        assert 0.0 <= paired_residual(live, sim, label) <= 1.0


def test_the_mixed_bursty_cell_keeps_the_routers_placements(tmp_path: Path) -> None:
    exp_dir = experiment_dir(tmp_path, "paper")
    live = fake_live("2P4D", 0.0, tmp_path)
    live = replace(live, runs=tuple(replace(r, kv_event_delay_s=None) for r in live.runs))
    report = Fidelity().report([live], exp_dir)
    assert "own placements" in report
    # the simulator against its own runs on the same traces: the residuals are nil
    sim = CellResult.from_dict(json.loads((exp_dir / "sim-2P4D.json").read_text()))
    assert all(paired_residual(live, sim, lb) == 0.0 for lb in live.labels())


def test_the_engines_limits_come_from_the_cluster_file(tmp_path: Path) -> None:
    assert cluster_limits(tmp_path / "missing.yaml").kv_capacity_tokens == 60_000
    engines = tuple(
        ClusterEngine(f"e{i}", role, f"http://127.0.0.1:{9000 + i}", capacity)
        for i, (role, capacity) in enumerate(((Role.PREFILL, 50_000), (Role.DECODE, 40_000)))
    )
    ClusterFile("emulated", "m", 8192, engines).save(tmp_path / "cluster.yaml")
    limits = cluster_limits(tmp_path / "cluster.yaml")
    assert (limits.kv_capacity_tokens, limits.max_model_len) == (40_000, 8192)


def test_prefix_cells_run_where_the_best_peer_holds_on_the_runs_own_traces() -> None:
    cells = {c.key: c for c in Fidelity().cells(False)}
    assert set(cells) == {"2P4D", "2P4D-shared-prefix", "2P4D-multi-turn", "2P4D-agentic"}
    for key, cell in cells.items():
        prefix = key != "2P4D"
        assert (cell.saturation_target, cell.saturate_on_run_seeds) == (
            (0.90, True) if prefix else (0.85, False)
        )
