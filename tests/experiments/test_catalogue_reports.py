"""The catalogue's report sections from saved results alone: `calroute report DIR` refreshes each
experiment's own section with the combined report, and both read the paired column by the statistics rule."""

from __future__ import annotations

import json
from pathlib import Path

from calroute.experiments import EXPERIMENTS
from calroute.experiments.kit.cells import CellResult, Run
from calroute.experiments.kit.report import PAIRED_NOTE, write_report
from calroute.results.metrics import RunSummary


def _summary(goodput: float) -> RunSummary:
    return RunSummary(400, 400, round(400 * goodput), goodput, 0.1, 0.3, 0.01, 0.011, 30.0, 10.0, {"ok": 400})


def _save(directory: Path, goodputs: dict[str, list[float]]) -> Path:
    exp_dir = directory / "scarcity"
    exp_dir.mkdir(parents=True)
    runs = tuple(Run(label, s, _summary(g)) for label, gs in goodputs.items() for s, g in enumerate(gs))
    (exp_dir / "results.json").write_text(json.dumps([CellResult("1P2D", "emulated", 6.65, runs).to_dict()]))
    manifest = {"backend": "emulated", "quick": False, "scale": {"requests": 400, "seeds": [0, 1, 2]}}
    (exp_dir / "manifest.json").write_text(json.dumps(manifest))
    (exp_dir / "report.md").write_text("## an old section, with [min, max] ranges\n")
    return exp_dir


def test_the_report_refreshes_each_section_with_intervals_and_what_would_resolve_them(tmp_path: Path) -> None:
    exp_dir = _save(
        tmp_path,
        {
            "round_robin": [0.848, 0.856, 0.810],
            "least_loaded": [0.845, 0.853, 0.809],  # behind on every trace: a loss
            "marginal_cost": [0.846, 0.849, 0.816],  # behind on two, ahead on one: within noise
        },
    )
    combined = write_report(tmp_path, EXPERIMENTS).read_text()
    section = (exp_dir / "report.md").read_text()
    assert "an old section" not in section
    assert section in combined and PAIRED_NOTE in combined
    rows = {line.split(" | ")[1]: line for line in section.splitlines() if line.startswith("| 1P2D")}
    assert "-0.2 [-0.3, -0.1] n=3 loss |" in rows["least_loaded"]
    # -0.2, -0.7, +0.6 points: mean -0.1, sd 0.66: 168 traces for an interval narrower than 0.1 point
    assert "-0.1 [-0.7, +0.6] within noise (n = 3); needs n = 168 |" in rows["marginal_cost"]
    assert "| - |" in rows["round_robin"]


def _cell(key: str, goodputs: dict[str, list[float]]) -> CellResult:
    runs = tuple(Run(label, s, _summary(g)) for label, gs in goodputs.items() for s, g in enumerate(gs))
    return CellResult(key, "emulated", 16.35, runs)


def test_the_ablation_summary_gives_each_change_its_interval(tmp_path: Path) -> None:
    cell = _cell(
        "saturated",
        {
            "full": [0.858, 0.890, 0.825],
            "no-slo": [0.877, 0.873, 0.853],  # +1.9, -1.7, +2.8: within noise
            "no-prompt-length": [0.848, 0.880, 0.815],  # -1.0 on every trace: a loss
        },
    )
    summary = EXPERIMENTS["ablation"].report([cell], tmp_path).split("\n\n")[1]
    assert "no-slo +1.0 [-1.7, +2.8] within noise (n = 3); needs n = " in summary
    assert "no-prompt-length -1.0 [-1.0, -1.0] n=3 loss" in summary


def test_the_failure_regions_summary_pairs_ours_with_the_best_baseline(tmp_path: Path) -> None:
    cell = _cell(
        "mixed-bursty",
        {
            "round_robin": [0.860, 0.8125, 0.805],
            "least_loaded": [0.875, 0.8375, 0.825],
            "length_heuristic": [0.850, 0.870, 0.7975],
            "marginal_cost": [0.8675, 0.905, 0.8525],
            "marginal_cost-paper": [0.895, 0.900, 0.850],
            "marginal_cost-own-wait": [0.880, 0.8975, 0.8475],
        },
    )
    report = EXPERIMENTS["failure-regions"].report([cell], tmp_path)
    # the summary table comes first; the goodput table's rows start with the cell and a variant
    row = next(line for line in report.splitlines() if line.startswith("| mixed-bursty | least_loaded |"))
    # the live cell: a 2.9-point mean lead that trails on one trace is within noise, not a win
    assert row.endswith("| +2.9 [-0.7, +6.8] within noise (n = 3); needs n = 9 |")
