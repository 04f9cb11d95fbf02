"""`calroute calibrate` against live clusters: emulated 2P+4D at time scale 1 and 2, real vLLM 2P+1D.

The emulated engines run the a40-qwen2.5-3b profile, so the calibration must recover it. Every HTTP request
to them also costs a few milliseconds that the profile does not model (client and server JSON, the event
loop's wake-ups, a shared 2-core machine), and the calibration keeps that cost on purpose: the router pays
it too. tau_pre (one request) and the tight TTFT target (two requests: the prefill and the decode handoff)
are therefore compared with the profile plus that overhead, measured independently on the same cluster
right after the calibration; the bare-profile errors are printed for the record.

The emulator keeps time with the CPU it gets: on a shared machine, a burst of someone else's work during the
calibration makes the emulated hardware itself slower (steps stretch by the scheduling delay), and the
calibration rightly measures that. So each emulated test gets a second attempt when the first misses; both
attempts' figures are printed.
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import typer
from typer.testing import CliRunner

from calroute.calibrate.client import EMULATED_TOKEN_IDS, EngineClient
from calroute.calibrate.run import calibrate_cluster
from calroute.cli.calibrate import calibrate
from calroute.cluster import launch
from calroute.cluster.file import ClusterFile
from calroute.costmodel.calibration import (
    REF_PROMPT_TOKENS,
    TIGHT_SLO_FACTOR,
    Calibration,
    DecodeCurve,
)
from calroute.costmodel.profiles import get_profile

PROFILE = get_profile("a40-qwen2.5-3b").calibration
TOLERANCE = 0.10
# per_seq_s and per_ctx_token_s are a few percent of a step each, and per_seq_s also carries the emulator's
# own CPU cost per stream (its engines share one process: on the CI machine that cost read +18-21 % of
# per_seq_s, about 14 us per stream and step, which the router pays too). So they are held to the step
# time they predict, at every (batch, context) the sweep measured, and each to the right size. That step
# time may exceed the profile by the emulator's CPU cost per stream, up to a sanity bound.
CURVE_TERM_TOLERANCE = 0.5
MAX_STREAM_OVERHEAD_S = 30e-6
MAX_REQUEST_OVERHEAD_S = 0.015  # a sanity bound, so the overhead correction cannot hide a gross error
OVERHEAD_PROMPT_TOKENS = 32
# Other jobs on a shared machine stretch the emulated steps while they run (a CI run on 2026-12-01 missed
# twice in a row, by +10 and +20 % on tau_dec_s, and passed when run again a minute later).
ATTEMPTS = 3
MIN_PREFILL_R2_HELD_OUT = 0.99


async def _request_overheads(cluster: ClusterFile, n: int = 12) -> tuple[float, float]:
    """Median (prefill latency - profile prefill, handoff TTFT - profile transfer and step) of short P/D
    requests: the per-request cost that the calibration measures and the profile does not model."""
    scale = cluster.time_scale
    p = OVERHEAD_PROMPT_TOKENS
    pre: list[float] = []
    dec: list[float] = []
    async with aiohttp.ClientSession() as session:
        client = EngineClient(session, cluster.model, EMULATED_TOKEN_IDS, seed=secrets.randbits(63))
        for i in range(n):
            prefill, decode = (
                cluster.prefill[i % len(cluster.prefill)],
                cluster.decode[i % len(cluster.decode)],
            )
            prompt = client.prompt(p)
            latency_s, kv = await client.prefill(prefill.url, prompt, 10.0)
            trace = await client.stream(decode.url, prompt, 2, 10.0, kv)
            pre.append(latency_s - scale * PROFILE.prefill.single_s(p))
            dec.append(
                trace.first_token_s - scale * (PROFILE.transfer_s(p) + PROFILE.decode.step_s(1, p - 1))
            )
    return statistics.median(pre), statistics.median(dec)


def _check_against_profile(report: dict[str, Any], cluster: ClusterFile) -> dict[str, float]:
    """Assert the constants are within TOLERANCE of the (time-scaled) profile; return the errors."""
    scale = cluster.time_scale
    pre_oh, dec_oh = asyncio.run(_request_overheads(cluster))
    assert 0 < pre_oh < MAX_REQUEST_OVERHEAD_S and 0 < dec_oh < MAX_REQUEST_OVERHEAD_S, (pre_oh, dec_oh)
    ref_prefill_s = scale * PROFILE.prefill.single_s(REF_PROMPT_TOKENS)
    ref_unloaded_s = ref_prefill_s + scale * (
        PROFILE.transfer_s(REF_PROMPT_TOKENS) + PROFILE.decode.step_s(1, REF_PROMPT_TOKENS)
    )
    expected = {
        "prefill.per_token_s": scale * PROFILE.prefill.per_token_s,
        "decode.base_s": scale * PROFILE.decode.base_s,
        "decode.per_seq_s": scale * PROFILE.decode.per_seq_s,
        "decode.per_ctx_token_s": scale * PROFILE.decode.per_ctx_token_s,
        "tau_dec_s": scale * PROFILE.tau_dec_s,
        "slo.tight_tpot_s": scale * PROFILE.slo.tight_tpot_s,
        "tau_pre_s": (ref_prefill_s + pre_oh) / REF_PROMPT_TOKENS,
        "slo.tight_ttft_s": TIGHT_SLO_FACTOR * (ref_unloaded_s + pre_oh + dec_oh),
    }
    constants = report["constants"]
    errors = {k: constants[k] / v - 1 for k, v in expected.items()}
    bare = {
        "tau_pre_s": constants["tau_pre_s"] / (scale * PROFILE.tau_pre_s) - 1,
        "slo.tight_ttft_s": constants["slo.tight_ttft_s"] / (scale * PROFILE.slo.tight_ttft_s) - 1,
    }
    stderr = report["fits"]["decode"]["rel_stderr"]
    curve_terms = ("decode.per_seq_s", "decode.per_ctx_token_s")
    fitted = DecodeCurve(constants["decode.base_s"], constants[curve_terms[0]], constants[curve_terms[1]])
    step_errors: dict[tuple[int, int], float] = {}
    raw_step_errors: dict[tuple[int, int], float] = {}
    for m in report["samples"]["decode"]:
        batch, context = m["batch"], round(m["context_tokens"])
        profile_s = scale * PROFILE.decode.step_s(batch, context)
        error = fitted.step_s(batch, context) / profile_s - 1
        # Above the profile, the part beyond the largest per-stream cost allowed is the error.
        allowed = batch * MAX_STREAM_OVERHEAD_S / profile_s
        step_errors[batch, context] = error if error < 0 else max(0.0, error - allowed)
        raw_step_errors[batch, context] = error
    assert step_errors, "no decode samples"
    print(
        f"\ntime scale {scale:g}: wall {report['wall_s']:.1f} s; request overheads prefill "
        f"{1e3 * pre_oh:.2f} ms, handoff {1e3 * dec_oh:.2f} ms"
    )
    for k, e in errors.items():
        extra = f" (bare profile {100 * bare[k]:+.1f} %)" if k in bare else ""
        if k in curve_terms:
            extra = f" (rel stderr {stderr[k.removeprefix('decode.')]})"
        print(f"  {k:24s} {constants[k]:.4g}  error {100 * e:+.1f} %{extra}")
    worst = max(raw_step_errors.items(), key=lambda kv: abs(kv[1]))
    print(
        f"  decode step time         worst error {100 * worst[1]:+.1f} % at (batch, context) {worst[0]}, "
        f"{100 * step_errors[worst[0]]:+.1f} % beyond the per-stream allowance"
    )
    bad = {k: round(e, 4) for k, e in errors.items() if k not in curve_terms and abs(e) > TOLERANCE}
    bad |= {k: round(e, 4) for k, e in errors.items() if k in curve_terms and abs(e) > CURVE_TERM_TOLERANCE}
    bad |= {f"step{k}": round(e, 4) for k, e in step_errors.items() if abs(e) > TOLERANCE}
    assert not bad, f"off the profile by more than the tolerance: {bad}"
    # Prefill latency is linear in prompt tokens on the emulator; a held-out R^2 below this means the sweep's
    # points were disturbed (seen once in CI: 0.977 on a first attempt whose constants were all in tolerance).
    r2 = report["fits"]["prefill"]["r2_held_out"]
    assert r2 is not None and r2 > MIN_PREFILL_R2_HELD_OUT, f"prefill held-out R^2 {r2}"
    return errors


def _attempts(run: Callable[[], dict[str, Any]], cluster: ClusterFile) -> dict[str, Any]:
    """Run a calibration and check it, up to ATTEMPTS times; the report of the first that passes."""
    failures: list[str] = []
    for attempt in range(1, ATTEMPTS + 1):
        report = run()
        try:
            _check_against_profile(report, cluster)
            return report
        except AssertionError as e:
            failures.append(f"attempt {attempt}: {e}")
            print(f"attempt {attempt} missed: {e}")
    pytest.fail("\n".join(failures))


@pytest.mark.slow
def test_emulated_cluster_recovers_the_profile(tmp_path: Path) -> None:
    launched = launch.up_emulated(2, 4, tmp_path / "engines")
    results: list[Calibration] = []

    def run() -> dict[str, Any]:
        lines: list[str] = []
        started = time.perf_counter()
        cal, report = calibrate_cluster(launched.file, 60.0, lines.append)
        wall_s = time.perf_counter() - started
        # The acceptance criterion: the default budget, on this cluster, in under a minute.
        assert wall_s < 60.0, f"calibration took {wall_s:.1f} s"
        assert any(line.startswith("prefill: round") for line in lines)
        assert any(line.startswith("decode: decode-") for line in lines)
        results.append(cal)
        return report

    try:
        _attempts(run, launched.file)
    finally:
        launched.stop()
    cal = results[-1]
    p = cal.provenance
    assert p["source"].startswith("calibrate:emulated:http://127.0.0.1:")
    assert p["cluster"] == {
        "kind": "emulated",
        "model": "emulated",
        "time_scale": 1.0,
        "profile": "a40-qwen2.5-3b",
        "prefill_engines": 2,
        "decode_engines": 4,
    }
    assert set(p["samples"]) == {"prefill", "decode", "transfer"}
    assert set(p["fit"]) == {"prefill", "decode", "transfer"}
    assert p["fit"]["prefill"]["r2_held_out"] > MIN_PREFILL_R2_HELD_OUT
    assert cal.kv_bytes_per_token == PROFILE.kv_bytes_per_token
    assert Calibration.from_dict(json.loads(cal.to_json())) == cal


@pytest.mark.slow
def test_time_scale_2_doubles_the_constants_through_the_cli(tmp_path: Path) -> None:
    launched = launch.up_emulated(2, 4, tmp_path / "engines", time_scale=2.0)
    cluster_path = tmp_path / "cluster.yaml"
    launched.file.save(cluster_path)
    app = typer.Typer()
    app.command()(calibrate)
    app.command("unused")(lambda: None)  # two commands, so `calibrate` is addressed by name as in calroute
    out, report_path = tmp_path / "cal.json", tmp_path / "report.json"

    def run() -> dict[str, Any]:
        result = CliRunner().invoke(
            app,
            ["calibrate", "--cluster", str(cluster_path), "--duration", "40", "--out", str(out)]
            + ["--report", str(report_path)],
        )
        assert result.exit_code == 0, result.output
        assert "fit quality" in result.output and "at time scale 1" in result.output
        report: dict[str, Any] = json.loads(report_path.read_text())
        return report

    try:
        report = _attempts(run, launched.file)
    finally:
        launched.stop()
    cal = Calibration.load(out)
    assert cal.provenance["cluster"]["time_scale"] == 2.0
    assert cal.provenance["source"] == f"calibrate:emulated:{cluster_path}"
    at_1 = report["constants_at_time_scale_1"]
    assert at_1["tau_dec_s"] == pytest.approx(cal.tau_dec_s / 2)
    assert at_1["tau_dec_s"] == pytest.approx(PROFILE.tau_dec_s, rel=TOLERANCE)


def test_cli_errors_exit_2(tmp_path: Path) -> None:
    app = typer.Typer()
    app.command()(calibrate)
    app.command("unused")(lambda: None)
    result = CliRunner().invoke(app, ["calibrate", "--cluster", str(tmp_path / "missing.yaml")])
    assert result.exit_code == 2 and "error:" in result.output and "missing.yaml" in result.output


@pytest.mark.slow
def test_real_vllm_calibration_completes(real_vllm_cluster: ClusterFile, tmp_path: Path) -> None:
    # real_vllm_cluster: the session's shared real-vLLM 2P+1D cluster (tests/conftest.py)
    # CPU vLLM serving a tiny model is not GPU-like: no accuracy claim, only a complete, sane calibration.
    started = time.perf_counter()
    lines: list[str] = []
    try:
        # 60 s: a real CPU engine can stall for a whole request timeout (seen once in CI: two handoffs timed
        # out and the prefill sweep overran a 30 s budget, leaving the decode sweep no time).
        cal, report = calibrate_cluster(real_vllm_cluster, 60.0, lines.append)
    finally:
        print("\n".join(lines))  # shown when the test fails: where the budget went
    wall_s = time.perf_counter() - started
    path = tmp_path / "cal.json"
    cal.save(path)
    loaded = Calibration.load(path)
    assert loaded == cal
    constants = report["constants"]
    assert all(math.isfinite(v) and v >= 0 for v in constants.values()), constants
    positive = ("tau_pre_s", "tau_dec_s", "prefill.per_token_s", "decode.base_s", "slo.tight_ttft_s")
    assert all(constants[k] > 0 for k in positive)
    assert cal.kv_bytes_per_token == 1024  # the tiny model: 2 x 2 layers x 2 KV heads x 32 x 4 bytes
    assert cal.provenance["cluster"]["kind"] == "vllm"
    assert "cache_config_info" in cal.provenance["kv_bytes_per_token_source"]
    fits = report["fits"]
    print(f"\nreal vLLM 2P+1D: wall {wall_s:.1f} s (budget 60 s)")
    for name, fit in fits.items():
        assert isinstance(fit["r2_fit"], float) and fit["n_fit"] >= 3, (name, fit)
        print(
            f"  {name:8s} n={fit['n_fit']}/{fit['n_rejected']}/{fit['n_held_out']} "
            f"R^2 fit {fit['r2_fit']:.3f} held-out {fit['r2_held_out']} "
            f"median |res| {fit['held_out_median_rel_residual']} max {fit['held_out_max_rel_residual']} "
            f"notes {fit['notes']}"
        )
    for k, v in constants.items():
        print(f"  {k:32s} {v:.4g}")
    assert wall_s < 90.0  # the budget, plus the last requests' completion
