"""The command line end to end: `calroute simulate` and `profile` in process, errors, stopping a live job."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from calroute.cli.app import app
from calroute.cluster.file import ClusterFile
from calroute.cluster.procs import process_group_alive, stop_process_group
from calroute.costmodel.profiles import DEFAULT_PROFILE, get_profile
from calroute.experiments import get_experiment
from calroute.policies import POLICIES, SIM_ONLY_POLICIES
from calroute.results.records import read_records

TRACES = Path(__file__).resolve().parents[2] / "data" / "traces"
runner = CliRunner()


def invoke(*args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, list(args))
    return res.exit_code, res.stdout, res.stderr


def test_simulate_json_has_the_documented_shape() -> None:
    code, out, _ = invoke(
        "simulate", "--workload", "chat", "--rate", "8", "--seeds", "2", "--requests", "150", "--json"
    )
    assert code == 0
    doc = json.loads(out)
    assert doc["rate_rps"] == 8.0
    assert len(doc["runs"]) == 8
    assert {r["policy"] for r in doc["runs"]} == {
        "round_robin",
        "least_loaded",
        "length_heuristic",
        "marginal_cost",
    }
    for r in doc["runs"]:
        assert {
            "policy",
            "seed",
            "requests",
            "goodput",
            "ttft_p50_s",
            "ttft_p99_s",
            "tpot_p50_s",
            "tpot_p99_s",
            "prefix_hit_ratio",
        } <= set(r)
        assert r["requests"] == 150 and 0.0 <= r["goodput"] <= 1.0
        assert r["prefix_hit_ratio"] == 0.0  # the paper's families share no prefix


def test_first_seed_moves_the_seeds_and_the_requests_with_them() -> None:
    def runs(*args: str) -> dict[int, float]:
        code, out, _ = invoke(
            "simulate", "--workload", "chat", "--rate", "8", "--requests", "60", "--json", *args
        )
        assert code == 0
        return {r["seed"]: r["goodput"] for r in json.loads(out)["runs"] if r["policy"] == "round_robin"}

    later = runs("--policies", "round_robin", "--seeds", "2", "--first-seed", "5")
    assert set(later) == {5, 6}
    assert runs("--policies", "round_robin", "--seeds", "1", "--first-seed", "6") == {6: later[6]}


def test_simulate_policies_all_runs_every_registered_policy() -> None:
    code, out, err = invoke(
        "simulate", "--workload", "chat", "--rate", "8", "--seeds", "1", "--requests", "40",
        "--policies", "all", "--json",
    )  # fmt: skip
    assert code == 0, err
    ran = [r["policy"] for r in json.loads(out)["runs"]]
    assert ran == [p for p in POLICIES if p not in SIM_ONLY_POLICIES]
    assert {"prefix_scorer_mix", "kv_overlap_cost", "cache_aware", "marginal_cost"} <= set(ran)


def test_simulate_sample_interval_reaches_the_engines_samples() -> None:
    # queue_kv reads only the sampled metrics, round_robin none: how old the samples are changes the first's
    # run and not the second's, and the output says what the interval was.
    def run(interval: str) -> dict[str, Any]:
        code, out, err = invoke(
            "simulate", "--workload", "chat", "--rate", "60", "--seeds", "1", "--requests", "400",
            "--policies", "queue_kv,round_robin", "--sample-interval-s", interval, "--json",
        )  # fmt: skip
        assert code == 0, err
        doc: dict[str, Any] = json.loads(out)
        return doc

    slow, fast = run("0.05"), run("0.002")
    assert (slow["sample_interval_s"], fast["sample_interval_s"]) == (0.05, 0.002)
    by_policy = [{r["policy"]: r for r in doc["runs"]} for doc in (slow, fast)]
    assert by_policy[0]["round_robin"] == by_policy[1]["round_robin"]
    assert by_policy[0]["queue_kv"] != by_policy[1]["queue_kv"]


def test_simulate_saturate_and_table(tmp_path: Path) -> None:
    code, out, _ = invoke(
        "simulate",
        "--workload",
        "reasoning",
        "--prefill",
        "1",
        "--decode",
        "2",
        "--policies",
        "round_robin,marginal_cost",
        "--seeds",
        "1",
        "--requests",
        "300",
        "--saturate",
        "--out",
        str(tmp_path),
    )
    assert code == 0
    assert "marginal_cost" in out and "round_robin" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    probes = summary["saturation"]["probes"]
    assert len(probes) >= 3 and summary["rate_rps"] > 0
    assert (tmp_path / "table.md").read_text().startswith("| policy")
    assert sorted(p.name for p in (tmp_path / "records").iterdir()) == [
        "marginal_cost-seed0.jsonl",
        "round_robin-seed0.jsonl",
    ]
    # the path each summary names its records by is relative to the summary's folder: no machine's in it
    assert "\n".join(r["records"] for r in summary["runs"]) == (
        "records/round_robin-seed0.jsonl\nrecords/marginal_cost-seed0.jsonl"
    )
    assert str(tmp_path) not in (tmp_path / "summary.json").read_text()
    assert summary["backend"] == "sim"


def test_record_files_are_byte_identical_across_invocations(tmp_path: Path) -> None:
    for d in ("a", "b"):
        code, _, _ = invoke(
            "simulate",
            "--workload",
            "mixed-bursty",
            "--rate",
            "10",
            "--seeds",
            "1",
            "--requests",
            "300",
            "--predictor-noise",
            "0.5",
            "--out",
            str(tmp_path / d),
        )
        assert code == 0
    for f in (tmp_path / "a" / "records").iterdir():
        assert f.read_bytes() == (tmp_path / "b" / "records" / f.name).read_bytes()


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("azure_llm_2023/AzureLLMInferenceTrace_conv.csv", ["--rate", "6"]),
        ("mooncake_fast25/synthetic_trace.jsonl", []),
        (
            "vidur_arxiv_summarization_lengths/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
            ["--rate", "4"],
        ),
    ],
)
def test_simulate_any_shared_trace(name: str, args: list[str]) -> None:
    code, out, err = invoke(
        "simulate",
        "--trace",
        str(TRACES / name),
        "--seeds",
        "1",
        "--requests",
        "200",
        "--policies",
        "round_robin,marginal_cost",
        "--json",
        *args,
    )
    assert code == 0, err
    doc = json.loads(out)
    assert all(r["requests"] == 200 for r in doc["runs"])
    if "mooncake" in name:  # long contexts beyond the model's 32k are rejected, and say so
        assert doc["runs"][0]["status_counts"].get("rejected", 0) > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rate", "1"], "exactly one of --workload and --trace"),
        (["--workload", "chat", "--trace", "x.csv", "--rate", "1"], "exactly one of"),
        (["--workload", "chat", "--rate", "1", "--saturate"], "at most one of --rate and --saturate"),
        (["--workload", "chat"], "needs a rate"),
        (["--workload", "chat", "--rate", "1", "--policies", "round_robin,bogus"], "bogus"),
        (["--workload", "chat", "--rate", "1", "--param", "marginal_cost.rho"], "POLICY.NAME=VALUE"),
        (["--workload", "chat", "--rate", "1", "--param", "marginal_cost.zzz=1"], "unknown parameter"),
        (
            ["--workload", "chat", "--rate", "1", "--param", "least_loaded.x=1", "--policies", "round_robin"],
            "not in --policies",
        ),
        (["--trace", "/no/such/file.csv"], "no such file"),
        (["--workload", "chat", "--rate", "-2"], "--rate must be > 0"),
        (
            ["--workload", "chat", "--rate", "1", "--sample-interval-s", "0"],
            "--sample-interval-s must be > 0",
        ),
        (["--workload", "chat", "--rate", "1", "--predictor", "gpt"], "unknown predictor"),
        (
            ["--workload", "chat", "--saturate", "--saturate-on", "best"],
            "--saturate-on: unknown policy 'best'",
        ),
        (["--workload", "chat", "--rate", "1", "--prefix-source", "psychic"], "unknown prefix source"),
        (["--workload", "chat", "--rate", "1", "--calibration", "/no/cal.json"], "cannot read calibration"),
        (
            ["--workload", "chat", "--rate", "1", "--kv-capacity-tokens", "0"],
            "--kv-capacity-tokens must be >= 1",
        ),
        (["--workload", "chat", "--rate", "1", "--max-num-seqs", "-3"], "--max-num-seqs must be >= 1"),
        (
            [
                "--trace",
                str(
                    TRACES
                    / "vidur_arxiv_summarization_lengths"
                    / "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"
                ),
            ],
            "--rate",
        ),
    ],
)
def test_errors_are_clear_and_exit_2(args: list[str], message: str) -> None:
    code, _, err = invoke("simulate", "--requests", "10", *args)
    assert code == 2
    assert message in err.replace("\n", " ")


def test_profile_file_round_trips_through_simulate(tmp_path: Path) -> None:
    cal = tmp_path / "cal.json"
    code, _, _ = invoke("profile", "a40-qwen2.5-3b", "--out", str(cal))
    assert code == 0
    base = ["simulate", "--workload", "chat", "--rate", "6", "--seeds", "1", "--requests", "200", "--json"]
    _, with_file, _ = invoke(*base, "--calibration", str(cal))
    _, default, _ = invoke(*base)
    assert json.loads(with_file)["runs"] == json.loads(default)["runs"]
    # pricing with constants 7x too small changes marginal_cost's decisions, not the hardware or the SLOs
    d = json.loads(cal.read_text())
    d["tau_dec_s"] /= 7.4
    d["tau_pre_s"] /= 7.4
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps(d))
    busy = [
        "simulate",
        "--workload",
        "mixed-bursty",
        "--rate",
        "12",
        "--seeds",
        "1",
        "--requests",
        "400",
        "--policies",
        "marginal_cost",
    ]
    invoke(*busy, "--out", str(tmp_path / "right"))
    invoke(*busy, "--router-calibration", str(wrong), "--out", str(tmp_path / "wrong"))
    right_doc = json.loads((tmp_path / "right" / "summary.json").read_text())
    wrong_doc = json.loads((tmp_path / "wrong" / "summary.json").read_text())
    assert right_doc["slo"] == wrong_doc["slo"]
    decode_ids = [
        [r.decode_id for r in read_records(tmp_path / d / "records" / "marginal_cost-seed0.jsonl")]
        for d in ("right", "wrong")
    ]
    assert decode_ids[0] != decode_ids[1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--param", "marginal_cost.zzz=1"], "unknown parameter"),
        (["--param", "marginal_cost.w_cobatch=-1"], "w_cobatch must be >= 0"),
        (["--param", "least_loaded.x=1", "--policies", "marginal_cost"], "not in --policies"),
        (["--policies", "bogus"], "unknown policy"),
    ],
)
def test_run_rejects_bad_policy_parameters_before_touching_the_cluster(
    args: list[str], message: str, tmp_path: Path
) -> None:
    # the cluster file does not exist: a parameter error must come first
    code, _, err = invoke("run", "--cluster", str(tmp_path / "none.yaml"), "--rate", "1", *args)
    assert code == 2
    assert message in err.replace("\n", " ")


def _left_running(out: Path) -> list[str]:
    """Engine groups named by the job's cluster files, and processes whose command line names ``out``."""
    left = [
        f"engine group {g}"
        for f in out.rglob("cluster.yaml")
        for g in ClusterFile.load(f).pgids
        if process_group_alive(g)
    ]
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):  # gone meanwhile
            continue
        if str(out) in cmdline and state not in ("Z", "X"):
            left.append(f"pid {proc.name}: {cmdline[:120]}")
    return left


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.slow
@pytest.mark.parametrize("sigint_ignored", [False, True], ids=["foreground", "started-with-&"])
def test_sigterm_stops_every_process_a_live_experiment_started(tmp_path: Path, sigint_ignored: bool) -> None:
    """A job stopped with SIGTERM (a scheduler, a CI timeout) must not leave its engines and proxy behind,
    also when started in the background by a script, which ignores SIGINT in it."""
    out = tmp_path / "exp"
    log = tmp_path / "experiment.log"
    # The calibration an earlier, interrupted run of this experiment left (experiments resume with it): the
    # job reaches its first proxy without the ~20 s calibration sweep, and is stopped with the same processes
    # running (itself, the engines and a proxy).
    (cell,) = get_experiment("mixed-bursty").cells(quick=True)
    shape_dir = out / "emulated" / "_clusters" / f"{cell.prefill}P{cell.decode}D"
    shape_dir.mkdir(parents=True)
    get_profile(DEFAULT_PROFILE).calibration.save(shape_dir / "calibration.json")
    argv = [sys.executable, "-m", "calroute", "experiment", "mixed-bursty", "--backend", "emulated"]
    argv += ["--quick", "--requests", "200", "--saturation", "sim", "--out", str(out)]
    with log.open("wb") as f:
        job = subprocess.Popen(
            argv,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_ignore_sigint if sigint_ignored else None,  # noqa: PLW1509 (no threads started yet)
        )
    try:
        deadline_s = time.monotonic() + 120.0
        # A proxy's log exists once engines, calibration and the first proxy are all up.
        while not any(out.rglob("proxy.log")) and time.monotonic() < deadline_s:
            assert job.poll() is None, log.read_text()[-2000:]
            time.sleep(0.2)
        running = _left_running(out)
        assert len(running) >= 3, running  # the job, the engines, the proxy

        job.send_signal(signal.SIGTERM)
        job.wait(timeout=60)
        deadline_s = time.monotonic() + 15.0
        while _left_running(out) and time.monotonic() < deadline_s:
            time.sleep(0.2)
        assert _left_running(out) == [], log.read_text()[-2000:]
        assert "Traceback" not in log.read_text()
    finally:
        for cluster_file in out.rglob("cluster.yaml"):
            for g in ClusterFile.load(cluster_file).pgids:
                stop_process_group(g, timeout_s=1.0)
        for line in _left_running(out):  # a proxy left behind when this test fails
            if line.startswith("pid "):
                with contextlib.suppress(ProcessLookupError):
                    stop_process_group(os.getpgid(int(line.split()[1].rstrip(":"))), timeout_s=1.0)
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)


def test_the_engine_limits_are_settable_and_recorded() -> None:
    """--kv-capacity-tokens and the other limits replace the profile's, on the simulated engines, and the
    summary says which were used: at 4,000 tokens a document's longer requests are refused."""
    args = ["simulate", "--workload", "document", "--rate", "2", "--requests", "60", "--json"]
    args += ["--policies", "round_robin"]
    code, out, err = invoke(*args)
    assert code == 0, err
    default = json.loads(out)
    assert (
        default["engine_limits"]["kv_capacity_tokens"]
        == get_profile(DEFAULT_PROFILE).limits.kv_capacity_tokens
    )
    code, out, err = invoke(
        *args, "--kv-capacity-tokens", "4000", "--max-model-len", "4000", "--max-num-seqs", "8"
    )
    assert code == 0, err
    small = json.loads(out)
    assert small["engine_limits"] | {"max_batched_tokens": 0} == {
        **default["engine_limits"],
        "kv_capacity_tokens": 4000,
        "max_model_len": 4000,
        "max_num_seqs": 8,
        "max_batched_tokens": 0,
    }

    def refused(doc: dict[str, Any]) -> int:
        return sum(int(r["status_counts"].get("rejected", 0)) for r in doc["runs"])

    assert refused(small) > refused(default)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--policies", "aggregated", "--rate", "2"], None),
        (["--policies", "aggregated,marginal_cost", "--rate", "2"], "marginal_cost need prefill instances"),
        (["--policies", "aggregated", "--saturate"], "round_robin need prefill instances"),
    ],
)
def test_an_aggregated_cluster_takes_the_aggregated_policy_only(args: list[str], error: str | None) -> None:
    base = ["simulate", "--prefill", "0", "--decode", "2", "--workload", "chat", "--requests", "60"]
    code, out, err = invoke(*base, *args, "--json")
    if error is None:
        assert code == 0, err
        assert {r["policy"] for r in json.loads(out)["runs"]} == {"aggregated"}
    else:
        assert code != 0 and error in err.replace("\n", " ")
