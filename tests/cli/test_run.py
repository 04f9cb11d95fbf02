"""`calroute run` on an emulated cluster: gates, one proxy per policy, records, summary, resumption."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from calroute.cli.app import app
from calroute.cluster import launch
from calroute.costmodel.calibration import Calibration
from calroute.costmodel.profiles import DEFAULT_PROFILE, get_profile

REQUESTS = 40
# The emulated engines run the profile 10x faster: the runs' timing is not what is checked here (the gates,
# records, summary and resumption are), and the mixed-bursty trace's longest output (4096 tokens) would
# otherwise hold each of the three runs open for over a minute.
TIME_SCALE = 0.1
runner = CliRunner()


def _time_scaled(cal: Calibration, scale: float) -> Calibration:
    """The calibration of the same hardware with every duration times ``scale`` (as the cluster runs it)."""
    return replace(
        cal,
        tau_pre_s=cal.tau_pre_s * scale,
        tau_dec_s=cal.tau_dec_s * scale,
        prefill=replace(
            cal.prefill,
            base_s=cal.prefill.base_s * scale,
            per_token_s=cal.prefill.per_token_s * scale,
            attn_s_per_token2=cal.prefill.attn_s_per_token2 * scale,
        ),
        decode=replace(
            cal.decode,
            base_s=cal.decode.base_s * scale,
            per_seq_s=cal.decode.per_seq_s * scale,
            per_ctx_token_s=cal.decode.per_ctx_token_s * scale,
        ),
        transfer=replace(
            cal.transfer,
            latency_s=cal.transfer.latency_s * scale,
            bandwidth_bytes_per_s=cal.transfer.bandwidth_bytes_per_s / scale,
        ),
        slo=replace(
            cal.slo, tight_ttft_s=cal.slo.tight_ttft_s * scale, tight_tpot_s=cal.slo.tight_tpot_s * scale
        ),
    )


@pytest.fixture
def cluster_path(tmp_path: Path) -> Iterator[Path]:
    launched = launch.up_emulated(1, 2, tmp_path / "engines", time_scale=TIME_SCALE)
    path = tmp_path / "cluster.yaml"
    launched.file.save(path)
    try:
        yield path
    finally:
        launched.stop()


def _run(cluster: Path, cal: Path, out: Path, *extra: str) -> tuple[int, str, str]:
    args = ["run", "--cluster", str(cluster), "--calibration", str(cal), "--rate", "8"]
    args += ["--requests", str(REQUESTS), "--seeds", "1", "--policies", "round_robin,marginal_cost"]
    res = runner.invoke(app, [*args, "--out", str(out), *extra])
    return res.exit_code, res.stdout, res.stderr


@pytest.mark.slow
def test_run_compares_policies_live_and_resumes_only_what_is_unchanged(
    cluster_path: Path, tmp_path: Path
) -> None:
    cal = tmp_path / "calibration.json"
    # the cluster runs the profile at TIME_SCALE, and the router and SLO targets know it
    _time_scaled(get_profile(DEFAULT_PROFILE).calibration, TIME_SCALE).save(cal)
    out = tmp_path / "run"

    code, stdout, stderr = _run(cluster_path, cal, out)
    assert code == 0, stderr
    assert "correctness gates passed" in stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rate_rps"] == 8.0
    assert sorted(r["policy"] for r in summary["runs"]) == ["marginal_cost", "round_robin"]
    for r in summary["runs"]:
        assert r["requests"] == REQUESTS
        assert 0.0 <= r["goodput"] <= 1.0
        # as `calroute simulate` writes it: each run's records, relative to the summary's folder
        assert (out / r["records"]).is_file() and not Path(r["records"]).is_absolute()
    assert str(tmp_path) not in (out / "summary.json").read_text()
    assert "goodput - marginal_cost, paired, 95 % CI" in (out / "table.md").read_text()
    assert "marginal_cost" in stdout and "round_robin" in stdout  # the table

    record_files = sorted(out.rglob("records.jsonl"))
    assert len(record_files) == 2
    for f in record_files:
        records = [json.loads(line) for line in f.read_text().splitlines()]
        assert len({r["request_id"] for r in records}) == REQUESTS  # exactly one record per request
        # Unloaded (8 req/s on 1P+2D): every request is served with its exact output length.
        assert {r["status"] for r in records} == {"ok"}
        assert all(r["output_tokens"] == r["target_output_tokens"] for r in records)
    mtimes = {f: f.stat().st_mtime_ns for f in record_files}

    # The proxy's own log (warm-up included): its decisions follow the policy it was started with.
    (rr_log,) = out.rglob("round_robin-seed0/proxy.jsonl")
    rr = sorted((json.loads(line) for line in rr_log.read_text().splitlines()), key=lambda r: r["arrival_s"])
    assert len(rr) >= REQUESTS and {r["policy"] for r in rr} == {"round_robin"}
    decode_ids = [r["decode_id"] for r in rr]
    # two decode engines, alternating
    assert all(a != b for a, b in zip(decode_ids, decode_ids[1:], strict=False))

    # A second call finds every run done: nothing is re-run, the same summary comes back.
    code, _, stderr = _run(cluster_path, cal, out)
    assert code == 0, stderr
    assert "done earlier, skipped" in " ".join(stderr.split())
    assert {f: f.stat().st_mtime_ns for f in record_files} == mtimes
    assert json.loads((out / "summary.json").read_text()) == summary

    # A changed parameter re-runs that policy's run, in a clean directory; the other run is still reused.
    code, _, stderr = _run(cluster_path, cal, out, "--param", "marginal_cost.w_cobatch=0")
    assert code == 0, stderr
    assert "running it again" in " ".join(stderr.split())  # rich wraps lines
    changed = {f.parent.name for f in record_files if f.stat().st_mtime_ns != mtimes[f]}
    assert changed == {"marginal_cost-seed0"}
    (mc_log,) = out.rglob("marginal_cost-seed0/proxy.jsonl")
    assert len(mc_log.read_text().splitlines()) == len(rr)  # this run's requests only, not appended to
