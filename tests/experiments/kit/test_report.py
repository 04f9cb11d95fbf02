"""Report helpers shared by every experiment: the paired gap to the best variant, and the goodput table."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import pytest

from calroute.costmodel.calibration import SloTargets
from calroute.experiments.kit.cells import CellResult, Run
from calroute.experiments.kit.report import goodput_table, latency_cdfs, paired_gap
from calroute.results.metrics import RunSummary


def _run(label: str, seed: int, goodput: float) -> Run:
    summary = RunSummary(
        100, 100, round(100 * goodput), goodput, 0.1, 0.2, 0.01, 0.02, 10.0, 1.0, {"ok": 100}
    )
    return Run(label, seed, summary)


def _cell(goodputs: dict[str, list[float]]) -> CellResult:
    runs = tuple(_run(label, seed, g) for label, gs in goodputs.items() for seed, g in enumerate(gs))
    return CellResult("2P4D", "emulated", 16.5, runs)


@pytest.mark.parametrize(
    ("goodputs", "label", "expected"),
    [
        # behind on every trace: a loss, its interval inside the paired differences' range
        (
            {"a": [0.80, 0.85, 0.90], "b": [0.78, 0.82, 0.89]},
            "b",
            r"-2\.0 \[-(2\.[5-9]|3\.0), -1\.[0-5]\] n=3 loss",
        ),
        # a tie in disguise: behind on average, ahead on one trace
        (
            {"a": [0.80, 0.85, 0.90], "b": [0.70, 0.86, 0.91]},
            "b",
            # (sd 6.35 points: a 2.7-point gap would need 25 traces for its t interval to exclude zero)
            r"-2\.7 \[-10\.0, \+1\.0\] within noise \(n = 3\); needs n = 25",
        ),
        # the best variant itself
        ({"a": [0.80, 0.85, 0.90], "b": [0.70, 0.86, 0.91]}, "a", "-"),
        # one seed: no interval
        ({"a": [0.80], "b": [0.75]}, "b", r"-5\.0 \(n = 1\)"),
        # only the seeds both variants ran are paired
        ({"a": [0.80, 0.85, 0.90], "b": [0.79]}, "b", r"-1\.0 \(n = 1\)"),
    ],
)
def test_paired_gap(goodputs: dict[str, list[float]], label: str, expected: str) -> None:
    cell = _cell(goodputs)
    best = max(cell.labels(), key=cell.mean_goodput)
    assert re.fullmatch(expected, paired_gap(cell, label, best))


def test_goodput_table_bolds_the_best_and_shows_paired_gaps() -> None:
    table = goodput_table([_cell({"a": [0.80, 0.85, 0.90], "b": [0.78, 0.82, 0.89]})], "cluster")
    head, _, row_a, row_b = table.splitlines()
    assert "vs best, paired (pts)" in head
    assert "**0.850**" in row_a and row_a.count(" - |") >= 1
    assert "-2.0 [" in row_b and "n=3 loss" in row_b and "**" not in row_b


def test_latency_cdfs_without_records_keep_the_plots_already_drawn(tmp_path: Path) -> None:
    cell = _cell({"a": [0.8], "b": [0.7]})
    assert latency_cdfs(cell, tmp_path, SloTargets(0.1, 0.01)) == []  # nothing to draw: no empty plots
    drawn = tmp_path / "2P4D-ttft-cdf.png"
    drawn.write_bytes(b"a plot drawn when the records were there")
    assert latency_cdfs(cell, tmp_path, SloTargets(0.1, 0.01)) == [drawn.name]
    assert drawn.read_bytes() == b"a plot drawn when the records were there"


def test_the_best_mean_is_bold_even_where_fmean_and_sum_over_len_differ() -> None:
    # statistics.fmean and sum/len round these differently in the last bit
    goodputs = [0.871, 0.832, 0.888]
    assert sum(goodputs) / 3 != statistics.fmean(goodputs)
    table = goodput_table([_cell({"a": goodputs, "b": [0.5, 0.5, 0.5]})], "cluster")
    assert "**0.864**" in table.splitlines()[2]
