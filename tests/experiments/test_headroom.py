"""The headroom experiment and the live check of tuned weights: which variants a params file adds, the
summary's paired figures and distances to the ceiling, the warning when a run seed was trained on, and
`--first-seed`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from calroute.cli.app import app
from calroute.experiments import headroom, tuned
from calroute.experiments.kit.ceiling import MODEL as CEILING_MODEL
from calroute.experiments.kit.ceiling import Ceiling
from calroute.experiments.kit.cells import CellResult, Run
from calroute.results.metrics import RunSummary


def _params(path: Path, policy: str, seeds: list[int], rate_rps: float = 5.0, **params: float) -> None:
    training = {"seeds": seeds, "saturation": {"rate_rps": rate_rps}}
    doc = {"format": "calroute-params/1", "policy": policy, "params": params, "training": training}
    path.write_text(json.dumps(doc))


@pytest.fixture
def tuning_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "tuning"
    d.mkdir()
    monkeypatch.setattr(headroom, "TUNING_DIR", d)
    monkeypatch.setattr(tuned, "TUNING_DIR", d)
    return d


def _labels(exp: headroom.Headroom | tuned.TunedCheck, family: str) -> dict[str, dict[str, object]]:
    cell = next(c for c in exp.cells(quick=False) if c.key == family)
    return {v.label: v.params for v in cell.variants}


@pytest.mark.parametrize(
    ("files", "family", "expected"),
    [
        # no file: no tuned variant, nothing invented
        ([], "chat", {"round_robin", "least_loaded", "length_heuristic", "marginal_cost", "clairvoyant"}),
        # marginal_cost's file also prices the clairvoyant with its weights
        (
            [("chat.json", "marginal_cost")],
            "chat",
            {"round_robin", "least_loaded", "length_heuristic", "marginal_cost", "clairvoyant"}
            | {"marginal_cost-tuned", "clairvoyant-mc-tuned"},
        ),
        # one study on every family adds its weights to every family's cell
        (
            [("all.json", "marginal_cost")],
            "document",
            {
                "round_robin",
                "least_loaded",
                "length_heuristic",
                "marginal_cost",
                "clairvoyant",
                "marginal_cost-all",
            },
        ),
        # the prefix families' baselines are the prefix-aware peers; the clairvoyant's own study adds its
        # variant
        (
            [("agentic.json", "marginal_cost"), ("clairvoyant-agentic.json", "clairvoyant")],
            "agentic",
            {
                "least_loaded",
                "prefix_scorer_mix",
                "kv_overlap_cost",
                "cache_aware",
                "marginal_cost",
                "clairvoyant",
            }
            | {"marginal_cost-tuned", "clairvoyant-mc-tuned", "clairvoyant-tuned"},
        ),
    ],
)
def test_headroom_variants_follow_the_params_files(
    tuning_dir: Path, files: list[tuple[str, str]], family: str, expected: set[str]
) -> None:
    for name, policy in files:
        _params(tuning_dir / name, policy, [0, 1, 2, 3], w_evict=2.5)
    labels = _labels(headroom.Headroom(), family)
    assert set(labels) == expected
    for label in expected - {
        "round_robin",
        "least_loaded",
        "length_heuristic",
        "marginal_cost",
        "clairvoyant",
    }:
        if "tuned" in label or label.endswith("-all"):
            assert labels[label] == {"w_evict": 2.5}


def test_a_family_runs_where_its_study_trained(tuning_dir: Path) -> None:
    _params(tuning_dir / "agentic.json", "marginal_cost", [0], rate_rps=1.25)
    _params(
        tuning_dir / "clairvoyant-agentic.json", "clairvoyant", [0], rate_rps=9.0
    )  # the clairvoyant's own: not it
    cells = {c.key: c for c in headroom.Headroom().cells(quick=False)}
    assert cells["agentic"].rate_rps == 1.25
    assert cells["chat"].rate_rps is None  # no study: a fresh saturation search


def test_a_bad_params_file_is_an_error_naming_it(tuning_dir: Path) -> None:
    _params(tuning_dir / "chat.json", "marginal_cost", [0], no_such_weight=1.0)
    with pytest.raises(Exception, match="chat.json.*no_such_weight"):
        headroom.Headroom().cells(quick=False)


def _summary(goodput: float) -> RunSummary:
    return RunSummary(400, 400, round(400 * goodput), goodput, 0.1, 0.3, 0.01, 0.011, 30.0, 10.0, {"ok": 400})


def _cell(family: str, goodputs: dict[str, list[float]], first_seed: int) -> CellResult:
    runs = tuple(
        Run(label, first_seed + i, _summary(g)) for label, gs in goodputs.items() for i, g in enumerate(gs)
    )
    return CellResult(family, "sim", 5.0, runs)


def test_headroom_summary_pairs_the_best_baseline_tuning_and_the_clairvoyant(
    tuning_dir: Path, tmp_path: Path
) -> None:
    _params(tuning_dir / "shared-prefix.json", "marginal_cost", [0, 1, 2, 3], w_evict=2.5)
    cell = _cell(
        "shared-prefix",
        {
            "least_loaded": [0.60, 0.62, 0.58],
            "prefix_scorer_mix": [0.88, 0.90, 0.86],  # the best baseline
            "marginal_cost": [0.85, 0.86, 0.84],  # behind it on every seed
            "clairvoyant": [0.80, 0.85, 0.83],
            "marginal_cost-tuned": [0.89, 0.90, 0.88],
            "clairvoyant-mc-tuned": [0.90, 0.91, 0.89],  # the best clairvoyant
        },
        first_seed=4,
    )
    text = headroom.Headroom().report([cell], tmp_path)
    row = next(line for line in text.splitlines() if line.startswith("| shared-prefix | 5.00 |"))
    assert "prefix_scorer_mix 0.880" in row
    assert "-3.0 [" in row and "loss" in row  # hand-set marginal_cost minus the mix
    assert "+4.0 [+4.0, +4.0] n=3 win" in row  # tuned minus hand-set
    assert "+1.0 [+1.0, +1.0] n=3 win (vs marginal_cost-tuned)" in row
    assert "| no params file |" in row  # no all.json
    assert "clairvoyant-mc-tuned 0.900" in row and "(vs marginal_cost-tuned)" in row
    assert "clairvoyant marginal_cost (perfect inputs, not a bound)" in text
    assert "bound (best" not in text
    # no manifest beside the results (the traces unknown): no ceiling, and the report says why
    assert row.endswith("| - | - |")
    assert "No ceiling: no manifest.json" in text
    assert "Not a validation" not in text
    assert "No params file in docs/results/tuning for: marginal_cost-all, clairvoyant-tuned." in text


def test_the_distance_to_the_ceiling_is_the_mean_and_median_of_the_per_seed_gaps() -> None:
    cell = _cell(
        "chat",
        {"least_loaded": [0.80, 0.70, 0.90], "marginal_cost": [0.85, 0.86, 0.84]},
        first_seed=4,
    )
    ceiling = {s: Ceiling(400, g, g, 0) for s, g in zip((4, 5, 6), (0.95, 0.96, 0.99), strict=True)}
    text = headroom._summary([cell], {"chat": ceiling}, "")
    row = next(line for line in text.splitlines() if line.startswith("| chat |"))
    # ceiling mean 0.967; marginal_cost (the best by mean) is 10, 10 and 15 points below it
    assert row.endswith("| 0.967 | marginal_cost 11.7 (median 10.0) |")
    section = headroom._to_ceiling(cell, ceiling)
    assert "- least_loaded: 16.7 (median 15.0)" in section  # 15, 26 and 9 points
    assert "0 requests past the engines' length limit" in section


def test_a_run_on_training_seeds_is_flagged(tuning_dir: Path, tmp_path: Path) -> None:
    _params(tuning_dir / "shared-prefix.json", "marginal_cost", [0, 1, 2, 3], w_evict=2.5)
    goodputs = {"marginal_cost": [0.85, 0.86], "marginal_cost-tuned": [0.86, 0.87]}
    text = tuned.TunedCheck().report([_cell("shared-prefix", goodputs, first_seed=3)], tmp_path)
    assert "**Not a validation:** marginal_cost-tuned (shared-prefix.json) was trained on seeds [3]" in text
    assert "- marginal_cost-tuned: +1.0 [+1.0, +1.0] n=2 win" in text


def test_tuned_check_without_a_params_file_says_it_is_missing(tuning_dir: Path, tmp_path: Path) -> None:
    labels = _labels(tuned.TunedCheck(), "shared-prefix")
    assert set(labels) == {"least_loaded", "prefix_scorer_mix", "marginal_cost", "marginal_cost-w1"}
    assert labels["marginal_cost-w1"] == {"w_b": 1.0, "w_evict": 1.0}
    text = tuned.TunedCheck().report([_cell("shared-prefix", {"marginal_cost": [0.8]}, 4)], tmp_path)
    assert "the tuned variant is missing" in text


def test_first_seed_sets_the_seeds_an_experiment_runs(tuning_dir: Path, tmp_path: Path) -> None:
    _params(tuning_dir / "shared-prefix.json", "marginal_cost", [0, 1, 2, 3], w_evict=2.5)
    out = tmp_path / "out"
    args = ["experiment", "tuned", "--requests", "60", "--seeds", "2", "--first-seed", "4", "--workers", "1"]
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "sim" / "tuned" / "results.json").read_text())
    cells = {c["cell_key"]: c for c in saved}
    assert sorted({r["seed"] for r in cells["shared-prefix"]["runs"]}) == [4, 5]
    assert {r["label"] for r in cells["shared-prefix"]["runs"]} == {
        "least_loaded",
        "prefix_scorer_mix",
        "marginal_cost",
        "marginal_cost-w1",
        "marginal_cost-tuned",
    }
    assert {r["label"] for r in cells["mixed-bursty"]["runs"]} == {
        "least_loaded",
        "marginal_cost",
        "marginal_cost-w1",
    }
    report = (out / "sim" / "tuned" / "report.md").read_text()
    assert "Not a validation" not in report


def test_a_headroom_run_reports_the_ceiling_above_every_variant(tuning_dir: Path, tmp_path: Path) -> None:
    # the rates of the studies: no saturation search
    _params(tuning_dir / "mixed-bursty.json", "marginal_cost", [0], rate_rps=40.0)
    _params(tuning_dir / "shared-prefix.json", "marginal_cost", [0], rate_rps=8.0)
    out = tmp_path / "out"
    args = ["experiment", "headroom", "--quick", "--requests", "80", "--seeds", "2", "--first-seed", "4"]
    result = CliRunner().invoke(app, [*args, "--workers", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    exp_dir = out / "sim" / "headroom"
    saved = [CellResult.from_dict(c) for c in json.loads((exp_dir / "results.json").read_text())]
    ceilings = json.loads((exp_dir / "ceiling.json").read_text())
    assert len(ceilings) == 4  # two cells, two seeds
    by = {(e["of"]["workload"], e["of"]["seed"]): e["ceiling"] for e in ceilings}
    for c in saved:
        assert {e["of"]["rate_rps"] for e in ceilings if e["of"]["workload"] == c.cell_key} == {c.rate_rps}
        for r in c.runs:
            assert r.summary.goodput <= by[(c.cell_key, r.seed)]["goodput"], (c.cell_key, r.label, r.seed)
    report = (exp_dir / "report.md").read_text()
    assert "Idle perfect-cache ceiling" in report and "No ceiling" not in report
    # a ceiling kept from another construction of it is computed again, one of this one is reused
    stale = [
        {**e, "of": {**e["of"], "model": "another"}, "ceiling": {**e["ceiling"], "goodput": 0.123}}
        for e in ceilings
    ]
    kept = [{**e, "ceiling": {**e["ceiling"], "goodput": 0.456}} for e in ceilings]
    for planted, seen in ((stale, False), (kept, True)):
        (exp_dir / "ceiling.json").write_text(json.dumps(planted))
        text = headroom.Headroom().report(saved, exp_dir)
        assert ("Idle perfect-cache ceiling 0.456" in text) is seen
        assert "0.123" not in text
    assert all(e["of"]["model"] == CEILING_MODEL for e in ceilings)
