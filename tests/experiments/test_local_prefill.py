"""The local-prefill experiment: its cells (every workload on two pools, the aggregated cluster beside each at
the same rate) and a quick run's report."""

from __future__ import annotations

from pathlib import Path

from calroute.costmodel.profiles import get_profile
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
