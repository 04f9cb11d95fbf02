"""`calroute demo` compares like with like: the simulator runs the live traces (and ten for intervals, in a
table of their own), and its report says in so many words what the comparison shows, calling no difference
of one trace a win. The cluster, gates, calibration and live runs are faked here (tests/harness and
tests/experiments test them); the simulator is real."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from calroute.cli import demo
from calroute.costmodel.profiles import DEFAULT_PROFILE, get_profile
from calroute.experiments.kit.cells import Cell, CellResult, Run
from calroute.results.metrics import RunSummary


class _Launched:
    class file:  # noqa: N801 (stands in for the cluster file the launcher writes)
        @staticmethod
        def save(path: Path) -> None:
            path.write_text("fake cluster\n")

    def stop(self) -> None:
        pass


class _Live:
    """The live backend: records the traces it was asked to run and scores each the same."""

    asked: list[tuple[int, ...]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def run_cell(
        self,
        cell: Cell,
        rate_rps: float,
        seeds: tuple[int, ...],
        requests: int,
        records_dir: Path,
        on_run: Callable[[Run], None],
    ) -> list[Run]:
        _Live.asked.append(seeds)
        summary = RunSummary(requests, requests, requests - 30, 0.9, 0.1, 0.3, 0.01, 0.011, 20.0, 13.0, {})
        return [Run(v.label, s, summary) for v in cell.variants for s in seeds]


@pytest.fixture
def faked(monkeypatch: pytest.MonkeyPatch) -> None:
    cal = get_profile(DEFAULT_PROFILE).calibration
    monkeypatch.setattr(demo, "up_emulated", lambda *a, **k: _Launched())
    monkeypatch.setattr(demo, "require_gates", lambda cluster: [])
    measured = {"constants": {"tau_pre_s": cal.tau_pre_s}}
    monkeypatch.setattr(demo, "calibrate_cluster", lambda *a: (cal, measured))
    monkeypatch.setattr(demo, "LiveBackend", _Live)
    monkeypatch.setattr(demo, "LIVE_REQUESTS", 120)  # the comparison's shape, not its figures, is tested
    _Live.asked.clear()


def _table_seeds(report: str, heading: str) -> list[str]:
    table = report.split(heading, 1)[1].split("\n\n", 2)[1]
    return [c.strip() for c in table.splitlines()[0].split("|") if c.strip().startswith("seed ")]


@pytest.mark.parametrize("live_seeds", [1, 2])
def test_the_simulator_runs_the_live_traces(faked: None, tmp_path: Path, live_seeds: int) -> None:
    report = demo.run_demo(tmp_path, live_seeds).read_text()
    expected = [f"seed {s}" for s in range(live_seeds)]
    assert _Live.asked == [tuple(range(live_seeds))]
    assert _table_seeds(report, "## Live") == expected
    assert _table_seeds(report, "## Calibrated simulator (the same seeds") == expected
    assert _table_seeds(report, "## Calibrated simulator, 10 traces") == [f"seed {s}" for s in range(10)]
    assert (tmp_path / "goodput.png").stat().st_size > 1000
    finding = report.split("\n\n")[1]
    assert finding.startswith(
        f"Live, {'one trace (seed 0)' if live_seeds == 1 else '2 traces (seeds [0, 1])'} of shared-prefix"
    )
    assert "On the calibrated simulator, 10 traces at the same rate: marginal_cost" in finding
    one_trace = "(one trace: no interval, so neither difference is called a win)"
    assert (one_trace in finding) == (live_seeds == 1)
    assert ("(n = 1)" in finding) == (live_seeds == 1)  # the live differences, as paired_gap gives them


def test_a_report_of_unmatched_traces_is_refused(tmp_path: Path) -> None:
    summary = RunSummary(100, 100, 90, 0.9, 0.1, 0.3, 0.01, 0.011, 10.0, 9.0, {})
    live = CellResult("sp", "emulated", 15.0, tuple(Run("marginal_cost", s, summary) for s in (0, 1)))
    sim = CellResult("sp", "sim", 15.0, (Run("marginal_cost", 0, summary),))
    slo = get_profile(DEFAULT_PROFILE).calibration.slo
    with pytest.raises(ValueError, match=r"live seeds \[0, 1\] are not all among the simulated seeds \[0\]"):
        demo._write_report(tmp_path, {}, live, sim, slo, "")
