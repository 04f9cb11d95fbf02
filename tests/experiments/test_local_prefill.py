"""The local-prefill experiment: its cells (every workload on two pools, the aggregated cluster beside each at
the same rate) and a quick run's report."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from calroute.costmodel.profiles import get_profile
from calroute.experiments.kit.beside import paired_residual
from calroute.experiments.kit.cells import CellResult
from calroute.experiments.kit.runner import Scale, run_experiment
from calroute.experiments.kit.sim_backend import SimBackend
from calroute.experiments.local_prefill import AGGREGATED, DECIDERS, OURS, LocalPrefill


def test_each_cell_has_its_aggregated_twin_searched_on_the_disaggregated_shape() -> None:
    cells = {c.key: c for c in LocalPrefill().cells(False)}
    main = [c for c in cells.values() if not c.tags.get("aggregated")]
    assert {c.tags["shape"] for c in main} == {"2P4D", "1P2D"}
    assert {c.tags["workload"] for c in main} >= {"multi-turn", "agentic", "shared-prefix", "conversation"}
    for c in main:
        twin = cells[f"{c.key}-aggregated"]
        assert (twin.prefill, twin.decode) == (0, c.prefill + c.decode)
        assert twin.variants == (AGGREGATED,)
        assert twin.saturation_shape == c.saturation_shape == (c.prefill, c.decode)
        assert twin.saturate_on == c.saturate_on == DECIDERS and c.saturate_on_run_seeds


def test_a_quick_run_reports_ours_against_the_deciders_and_the_aggregated_cluster(tmp_path: Path) -> None:
    exp = LocalPrefill()
    results = run_experiment(
        exp, SimBackend(get_profile("a40-qwen2.5-3b")), True, tmp_path, scale=Scale(300, (0, 1))
    )
    main, agg = results
    assert agg.rate_rps == main.rate_rps and agg.seeds() == main.seeds()
    assert all(r.summary.local_share == 1.0 for r in agg.runs)
    assert all(r.summary.local_share == 0.0 for r in main.runs if r.label == "marginal_cost")
    report = (tmp_path / "local-prefill" / "report.md").read_text()
    assert f"{OURS} - best decider" in report and "| aggregated |" in report


def test_a_live_cell_is_reported_beside_its_simulated_twin(tmp_path: Path) -> None:
    # a 'live' cell: the simulator's own runs labelled as live, with the KV-event delay the proxy measured
    exp = LocalPrefill()
    cell = next(c for c in exp.cells(True) if c.key == "multi-turn-2P4D")
    profile = get_profile("a40-qwen2.5-3b")
    runs = SimBackend(profile, prefix_source="precise", kv_event_delay_s=0.006).run_cell(
        cell, 2.0, (0, 1), 150, tmp_path / "live-records", lambda r: None
    )
    live = CellResult(
        cell.key, "emulated", 2.0, tuple(replace(r, kv_event_delay_s=0.006) for r in runs), dict(cell.tags)
    )
    exp_dir = tmp_path / "local-prefill"
    exp_dir.mkdir()
    (exp_dir / "manifest.json").write_text(json.dumps({"slo": {"name": "paper"}}))
    (tmp_path / "_clusters" / "2P4D").mkdir(parents=True)
    profile.calibration.save(tmp_path / "_clusters" / "2P4D" / "calibration.json")
    report = exp.report([live], exp_dir)
    twin = CellResult.from_dict(json.loads((exp_dir / "sim-multi-turn-2P4D.json").read_text()))
    assert twin.backend == "sim" and twin.seeds() == [0, 1] and twin.labels() == live.labels()
    assert twin.tags["prefix_source"] == "precise" and twin.tags["kv_event_delay_s"] == 0.006
    assert "KV events heard 6.0 ms late" in report
    # the same traces, the same source and delay: the twin is the 'live' cell itself, residual nil
    for label in live.labels():
        assert paired_residual(live, twin, label) == 0.0
        assert f"| {label} | " in report.split("Beside the simulator")[1]
    assert f"- live: {OURS} - " in report and f"- simulator: {OURS} - " in report
    # on the simulator, no twin
    assert "Beside the simulator" not in exp.report([replace(live, backend="sim")], exp_dir)
