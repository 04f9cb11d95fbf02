"""`calroute report DIR` from saved results alone: each experiment's own section is refreshed with the
combined report, and both read the paired column by the statistics rule."""

from __future__ import annotations

import json
from pathlib import Path

from calroute.experiments.cells import CellResult, Run
from calroute.experiments.report import PAIRED_NOTE, write_report
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
    combined = write_report(tmp_path).read_text()
    section = (exp_dir / "report.md").read_text()
    assert "an old section" not in section
    assert section in combined and PAIRED_NOTE in combined
    rows = {line.split(" | ")[1]: line for line in section.splitlines() if line.startswith("| 1P2D")}
    assert "-0.2 [-0.3, -0.1] n=3 loss |" in rows["least_loaded"]
    # -0.2, -0.7, +0.6 points: mean -0.1, sd 0.66: 168 traces for an interval narrower than 0.1 point
    assert "-0.1 [-0.7, +0.6] n=3 within noise (n = 3); needs n = 168 |" in rows["marginal_cost"]
    assert "| - |" in rows["round_robin"]
