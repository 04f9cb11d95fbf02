"""`calroute tune` end to end on a tiny study, its bad input, and `--params FILE` on the commands that run a
policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from calroute.cli.app import app
from calroute.cli.tune import training_families
from calroute.policies import marginal_cost
from calroute.policies.params_file import load_params_file
from calroute.workload.source import WORKLOADS

runner = CliRunner()
TINY = [
    "tune",
    "--prefill", "1", "--decode", "2",
    "--workload", "mixed-bursty",
    "--requests", "100", "--seeds", "2", "--rate-factors", "1.0",
    "--trials", "4", "--batch-size", "2",
    "--validation-seeds", "2", "--validate-on", "chat",
    "--workers", "1",
]  # fmt: skip


def invoke(*args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, list(args))
    return res.exit_code, res.stdout, res.stderr


def test_a_tiny_study_writes_a_params_file_that_simulate_reads(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    code, stdout, stderr = invoke(*TINY, "--out", str(out))
    assert code == 0, stderr
    doc = json.loads(out.read_text())
    assert doc["policy"] == "marginal_cost"
    assert set(doc["params"]) == set(marginal_cost.Params.__dataclass_fields__)
    t = doc["training"]
    assert t["seeds"] == [0, 1] and t["complete_trials"] == 4 and t["trials"] == 4
    assert t["workload"] == "mixed-bursty" and (t["prefill"], t["decode"]) == (1, 2)
    assert t["rates_rps"] == [t["saturation"]["rate_rps"]]
    assert t["calibration"].startswith("profile ") and t["handset_objective"] is not None
    assert t["best_objective"] >= t["handset_objective"]  # the hand-set values are a trial
    v = doc["validation"]
    assert v["seeds"] == [2, 3]
    assert [w["workload"] for w in v["workloads"]] == ["mixed-bursty", "chat"]
    assert all(w["tuned_minus_handset"]["n"] == 2 for w in v["workloads"])
    assert "# Tuned marginal_cost" in stdout and "| chat |" in (tmp_path / "p.md").read_text()
    assert (tmp_path / "p.study.db").exists()
    assert load_params_file(out).params == doc["params"]

    # a rerun continues the stored study: nothing left to do at the same count
    code, _, stderr = invoke(*TINY, "--out", str(out))
    assert code == 0, stderr
    assert json.loads(out.read_text())["training"]["complete_trials"] == 4

    code, stdout, stderr = invoke(
        "simulate", "--workload", "chat", "--rate", "8", "--seeds", "1", "--requests", "100",
        "--policies", "least_loaded,marginal_cost", "--params", str(out),
        "--param", "marginal_cost.rho=0.5", "--json",
    )  # fmt: skip
    assert code == 0, stderr
    assert {r["policy"] for r in json.loads(stdout)["runs"]} == {"least_loaded", "marginal_cost"}


def test_a_rerun_with_another_configuration_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    args = [*TINY, "--trials", "1", "--validate-on", "none", "--out", str(out)]
    assert invoke(*args)[0] == 0
    before = out.read_text()
    assert [w["workload"] for w in json.loads(before)["validation"]["workloads"]] == ["mixed-bursty"]
    code, _, stderr = invoke(*args, "--seed", "5")
    assert code == 2
    assert "another configuration" in stderr and "study_seed" in stderr
    assert out.read_text() == before


def test_several_families_train_together_and_validate_as_trained_on(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    args = [
        "tune", "--prefill", "1", "--decode", "2",
        "--workload", "reasoning,chat,reasoning",  # any order; the repeated name counts once
        "--requests", "40", "--seeds", "1", "--rate-factors", "1.0",
        "--trials", "2", "--batch-size", "2",
        "--validation-seeds", "2", "--validate-on", "none",
        "--workers", "1", "--out", str(out),
    ]  # fmt: skip
    code, stdout, stderr = invoke(*args)
    assert code == 0, stderr
    doc = json.loads(out.read_text())
    t = doc["training"]
    assert t["workloads"] == ["chat", "reasoning"] and "workload" not in t and "saturation" not in t
    per = t["per_workload"]
    assert list(per) == ["chat", "reasoning"]
    for w in per.values():
        assert w["rates_rps"] == [w["saturation"]["rate_rps"]]
    assert per["chat"]["saturation"]["rate_rps"] != per["reasoning"]["saturation"]["rate_rps"]
    hand = [w["handset_objective"] for w in per.values()]
    assert t["handset_objective"] == pytest.approx(sum(hand) / 2)
    best = [w["best_objective"] for w in per.values()]
    assert t["best_objective"] == pytest.approx(sum(best) / 2)
    v = doc["validation"]["workloads"]
    assert [(w["workload"], w["trained_on"]) for w in v] == [("chat", True), ("reasoning", True)]
    assert [w["saturation_rps"] for w in v] == [w["saturation"]["rate_rps"] for w in per.values()]
    assert "Trained on 2 workloads at once: chat, reasoning;" in " ".join(stdout.split())

    # another list of families is another study
    code, _, stderr = invoke(*args[:6], "chat", *args[7:])
    assert code == 2
    assert 'workload null there, "chat" here' in " ".join(stderr.split())


def test_workload_all_is_every_family() -> None:
    assert training_families("all") == list(WORKLOADS)
    assert training_families(" chat, reasoning,chat ") == ["chat", "reasoning"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--workload", "chat,nope"], "--workload: unknown nope"),
        (["--workload", ","], "--workload: no family given"),
        (["--policy", "bogus"], "unknown policy 'bogus'"),
        (["--policy", "round_robin"], "declares no tunable parameters"),
        (["--trials", "0"], "--trials must be >= 1"),
        (["--trace", "x.csv"], "exactly one of --workload and --trace"),
        (["--search", "w_b,w_nope"], "no search range for w_nope"),
        (["--param", "w_bogus=1"], "unknown parameter"),
        (["--param", "rho=-1"], "rho must be >= 0"),
        (["--validate-on", "chat,nope"], "--validate-on: unknown nope"),
        (["--rate-factors", "1,x"], "--rate-factors"),
        (["--executor", "bogus"], "unknown executor 'bogus'"),
        (["--workers", "0"], "--workers must be >= 1"),
    ],
)
def test_bad_input_is_named_and_nothing_is_written(tmp_path: Path, extra: list[str], message: str) -> None:
    out = tmp_path / "p.json"
    code, _, stderr = invoke(*TINY, "--out", str(out), *extra)
    assert code == 2
    assert message in " ".join(stderr.split())
    assert list(tmp_path.iterdir()) == []


def test_an_existing_out_for_another_policy_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    out.write_text(json.dumps({"policy": "queue_kv", "params": {}}))
    code, _, stderr = invoke(*TINY, "--out", str(out))
    assert code == 2
    assert "holds parameters of policy 'queue_kv'" in " ".join(stderr.split())
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]


@pytest.mark.parametrize(
    "command",
    [
        ["simulate", "--workload", "chat", "--rate", "8", "--policies", "least_loaded,marginal_cost"],
        ["serve", "--cluster", "missing.yaml"],
        ["run", "--cluster", "missing.yaml", "--rate", "1"],
        ["experiment", "ablation", "--quick"],
    ],
)
@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"policy": "marginal_cost", "params": {"w_nope": 1}}, "unknown parameter(s) w_nope"),
        ({"policy": "marginal_cost", "params": {"sigma_tight": 0}}, "sigma_tight must be > 0"),
        (
            {"policy": "cache_aware", "params": {}},
            "for policy 'cache_aware', which this command does not run",
        ),
        ("{", "not valid JSON"),
    ],
)
def test_params_errors_on_every_command_before_anything_runs(
    tmp_path: Path, command: list[str], doc: object, message: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    out = [] if command[0] == "serve" else ["--out", str(tmp_path / "out")]
    code, _, stderr = invoke(*command, "--params", str(path), *out)
    assert code == 2
    assert message in " ".join(stderr.split())
    assert not (tmp_path / "out").exists()
