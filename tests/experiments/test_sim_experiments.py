"""Every experiment of the paper runs in quick mode on the simulator; runs resume; the report assembles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calroute.costmodel.profiles import get_profile
from calroute.experiments import EXPERIMENTS
from calroute.experiments.kit.report import write_report
from calroute.experiments.kit.runner import Scale, run_experiment
from calroute.experiments.kit.sim_backend import SimBackend


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_each_experiment_runs_quick_on_the_simulator(name: str, tmp_path: Path) -> None:
    exp = EXPERIMENTS[name]
    results = run_experiment(exp, SimBackend(get_profile("a40-qwen2.5-3b")), True, tmp_path)
    cells = exp.cells(True)
    assert [r.cell_key for r in results] == [c.key for c in cells]
    for cell, result in zip(cells, results, strict=True):
        assert result.rate_rps > 0
        assert {r.label for r in result.runs} == {v.label for v in cell.variants}
        assert all(0.0 <= r.summary.goodput <= 1.0 and r.summary.requests == 300 for r in result.runs)
    section = (tmp_path / name / "report.md").read_text()
    if name == "fidelity":  # the simulator against itself is no test of fidelity
        assert "Needs a live backend" in section
        return
    assert section.startswith("## ") and ".png" in section
    for png in (tmp_path / name).glob("*.png"):
        assert png.stat().st_size > 1000


def test_a_killed_experiment_resumes_and_the_report_assembles(tmp_path: Path) -> None:
    backend = SimBackend(get_profile("a40-qwen2.5-3b"))
    exp = EXPERIMENTS["width"]
    messages: list[str] = []
    run_experiment(exp, backend, True, tmp_path)
    # a kill after the first cell: its result survives, the others are gone
    cells_dir = tmp_path / "width" / "cells"
    first, *rest = sorted(cells_dir.iterdir())
    kept = json.loads(first.read_text())
    for p in rest:
        p.unlink()
    results = run_experiment(exp, backend, True, tmp_path, progress=messages.append)
    assert sum("done earlier, skipped" in m for m in messages) == 1
    assert not any("saturation search" in m for m in messages)  # the saturation rate was kept too
    again = next(r for r in results if r.cell_key == kept["cell_key"]).to_dict()
    assert json.loads(json.dumps(again)) == {
        k: v for k, v in kept.items() if k not in ("definition", "git_commit")
    }
    # asked at another scale, no saved cell is reused
    messages.clear()
    run_experiment(exp, backend, True, tmp_path, progress=messages.append, scale=Scale(200, (0,)))
    assert not any("done earlier" in m for m in messages)
    assert sum("running it again" in m for m in messages) == len(rest) + 1
    run_experiment(EXPERIMENTS["scarcity"], backend, True, tmp_path)
    report = write_report(tmp_path, EXPERIMENTS).read_text()
    assert "Decode-pool width" in report and "Extreme scarcity" in report
    assert "calroute experiment width --backend sim --quick" in report


def test_the_command_takes_requests_and_seeds(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from calroute.cli.app import app

    res = CliRunner().invoke(
        app,
        ["experiment", "scarcity", "--quick", "--requests", "150", "--seeds", "2", "--out", str(tmp_path)],
    )
    assert res.exit_code == 0, res.output
    (cell,) = json.loads((tmp_path / "sim" / "scarcity" / "results.json").read_text())
    assert sorted({r["seed"] for r in cell["runs"]}) == [0, 1]
    assert all(r["summary"]["requests"] == 150 for r in cell["runs"])
    # the report names the command that made it; an absolute --out is recorded relative to the results
    # (no machine's path in a manifest), so after the results move it names where they are now
    moved = tmp_path / "copied" / "sim"
    moved.parent.mkdir()
    (tmp_path / "sim").rename(moved)
    report = write_report(moved, EXPERIMENTS).read_text()
    assert (
        f"calroute experiment scarcity --backend sim --quick --requests 150 --seeds 2 --out {moved.parent}`"
        in report
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--time-scale", "0.5"], "live backends only"),
        (["--saturation", "sim"], "live backends only"),
        (["--requests", "0"], "--requests and --seeds must be >= 1"),
        (["--backend", "vllm", "--time-scale", "0.5"], "emulated engines only"),
        (["--backend", "emulated", "--saturation", "guess"], "--saturation must be live or sim"),
        (["--backend", "emulated", "--kv-capacity-tokens", "9000"], "apply to --backend sim only"),
        (["--kv-capacity-tokens", "0"], "--kv-capacity-tokens must be >= 1"),
    ],
)
def test_the_command_names_a_bad_option(args: list[str], message: str, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from calroute.cli.app import app

    res = CliRunner().invoke(app, ["experiment", "scarcity", "--out", str(tmp_path), *args])
    assert res.exit_code == 2 and message in res.output.replace("\n", " "), res.output


def test_results_saved_under_other_slo_targets_are_not_reused(tmp_path: Path) -> None:
    from calroute.costmodel.slo import LONG_CONTEXT, PRESETS

    exp, scale = EXPERIMENTS["mixed-bursty"], Scale(150, (0,))
    profile = get_profile("a40-qwen2.5-3b")
    paper = run_experiment(exp, SimBackend(profile), True, tmp_path, scale=scale)
    messages: list[str] = []
    spec = PRESETS[LONG_CONTEXT]
    long = run_experiment(
        exp, SimBackend(profile, spec), True, tmp_path, progress=messages.append, scale=scale, slo=spec
    )
    # every goodput changes with the targets, and so does the saturation rate they define
    assert sum("running it again" in m for m in messages) == 1
    assert any("saturation search on 2P4D:mixed-bursty:slo=long-context" in m for m in messages)
    assert long[0].rate_rps != paper[0].rate_rps
    assert json.loads((tmp_path / "mixed-bursty" / "manifest.json").read_text())["slo"] == spec.definition()
    messages.clear()
    run_experiment(
        exp, SimBackend(profile, spec), True, tmp_path, progress=messages.append, scale=scale, slo=spec
    )
    assert sum("done earlier, skipped" in m for m in messages) == 1
    report = write_report(tmp_path, EXPERIMENTS).read_text()
    assert "--slo long-context" in report and "ms per prompt token" in report


def test_results_under_other_engine_limits_are_kept_apart(tmp_path: Path) -> None:
    """An experiment run with --kv-capacity-tokens (engine_limits) saves its results and saturation rates
    apart from the profile's: neither is reused for the other, and the report's command names the limits."""
    from dataclasses import replace

    exp, scale = EXPERIMENTS["mixed-bursty"], Scale(150, (0,))
    profile = get_profile("a40-qwen2.5-3b")
    run_experiment(exp, SimBackend(profile), True, tmp_path, scale=scale)
    limits = {"kv_capacity_tokens": 1_000_000}
    big = replace(profile, limits=replace(profile.limits, **limits))
    messages: list[str] = []
    run_experiment(
        exp, SimBackend(big), True, tmp_path, progress=messages.append, scale=scale, engine_limits=limits
    )
    assert sum("running it again" in m for m in messages) == 1
    assert any("saturation search on 2P4D:mixed-bursty:kv_capacity_tokens=1000000" in m for m in messages)
    manifest = json.loads((tmp_path / "mixed-bursty" / "manifest.json").read_text())
    assert manifest["engine_limits"] == limits
    messages.clear()
    run_experiment(
        exp, SimBackend(big), True, tmp_path, progress=messages.append, scale=scale, engine_limits=limits
    )
    assert sum("done earlier, skipped" in m for m in messages) == 1
    assert "--kv-capacity-tokens 1000000" in write_report(tmp_path, EXPERIMENTS).read_text()
