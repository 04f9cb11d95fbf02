"""The prefix experiment's verdicts (a win needs its interval and its median), its cells and its report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calroute.costmodel.profiles import get_profile
from calroute.experiments.kit.runner import Scale, run_experiment
from calroute.experiments.kit.sim_backend import SimBackend
from calroute.experiments.prefix import CONVERSATION, OPERATING_POINTS, PrefixReuse, verdict


@pytest.mark.parametrize(
    ("ours", "theirs", "word"),
    [
        ([0.9, 0.91, 0.92, 0.93, 0.94], [0.8, 0.82, 0.83, 0.81, 0.84], "win"),
        ([0.8, 0.82, 0.83, 0.81, 0.84], [0.9, 0.91, 0.92, 0.93, 0.94], "loss"),
        # one collapsed seed carries the mean; the typical seed is behind: no win
        ([0.2, 0.79, 0.79, 0.79, 0.79, 0.79, 0.79], [0.0, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8], "within noise"),
        ([0.9, 0.8, 0.85], [0.85, 0.85, 0.85], "within noise"),
    ],
    ids=["win", "loss", "collapsed-seed", "noise"],
)
def test_a_win_needs_its_interval_and_its_median(ours: list[float], theirs: list[float], word: str) -> None:
    assert verdict(ours, theirs)[0] == word


def test_a_mean_carried_by_collapsed_seeds_is_not_called_a_win() -> None:
    # +58, +45 and +25 on three seeds, -1 on the seven others: the interval may clear zero, the median not
    ours = [0.60, 0.50, 0.30] + [0.84] * 7
    theirs = [0.02, 0.05, 0.05] + [0.85] * 7
    word, mean, median, d = verdict(ours, theirs)
    assert mean > 0 and median < 0
    assert word in ("within noise", "mean only (median disagrees)")


def test_every_workload_at_both_operating_points_on_its_own_seeds() -> None:
    cells = PrefixReuse().cells(False)
    assert {c.tags["point"] for c in cells} == {p for p, _ in OPERATING_POINTS}
    assert all(c.saturate_on_run_seeds for c in cells)
    assert {c.saturation_target for c in cells} == {0.90, 0.85}
    assert any(c.workload == CONVERSATION and c.trace_windows == 10 for c in cells)


def test_the_report_carries_the_ceiling_and_it_bounds_every_policy(tmp_path: Path) -> None:
    exp = PrefixReuse()
    results = run_experiment(
        exp, SimBackend(get_profile("a40-qwen2.5-3b")), True, tmp_path, scale=Scale(300, (0, 1))
    )
    report = (tmp_path / "prefix" / "report.md").read_text()
    assert "Idle perfect-cache ceiling" in report
    saved = json.loads((tmp_path / "prefix" / "ceilings.json").read_text())
    assert len(saved) == len(results)
    for c in results:
        ceiling = c.tags["ceiling"]
        for label in c.labels():
            assert c.mean_goodput(label) <= ceiling + 1e-9, (label, c.mean_goodput(label), ceiling)
