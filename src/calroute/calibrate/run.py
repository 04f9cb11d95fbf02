"""Calibrate a live cluster: warm up, sweep, fit, and derive the router's prices and SLO targets.

The budget (``duration_s``) covers everything; the warm-up takes what it takes (bounded by its timeouts),
the remainder (at least ``MIN_SWEEP_S``, so a slow warm-up makes the run overrun, not fail) is split
between the prefill/handoff sweep and the decode sweep, with some slack because a round or batch already
running when its phase's budget ends is allowed to finish.

Emulated clusters multiply every modelled duration by their ``time_scale``; the constants measured are
those of the scaled hardware, which is what a router talking to that cluster must price. The report also
gives them divided back by the time scale (the unscaled hardware's, up to the HTTP overhead, which does
not scale).
"""

from __future__ import annotations

import asyncio
import secrets
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from calroute.calibrate.client import (
    DEFAULT_TOKEN_IDS,
    EMULATED_TOKEN_IDS,
    EngineClient,
    RequestFailed,
    kv_bytes_from_metrics,
)
from calroute.calibrate.measure import (
    HandoffMeasurement,
    PrefillMeasurement,
    decode_sweep,
    prefill_sweep,
    warm_up,
)
from calroute.cluster.file import ClusterFile
from calroute.costmodel.calibration import Calibration, DecodeCurve, PrefillCurve, derive_calibration
from calroute.costmodel.fit import Fit, fit_decode, fit_prefill, fit_transfer
from calroute.costmodel.profiles import get_profile
from calroute.errors import CalibrationError

PREFILL_SHARE = 0.3  # of the budget left after the warm-up
DECODE_SHARE = 0.6  # the remaining 10 % is slack for a round or batch that overruns its phase
MIN_DURATION_S = 5.0
# The sweeps get at least this long even when a slow warm-up (real vLLM on CPU compiles its first shapes
# for ~30 s) ate the budget: a calibration that overruns says so; one with no samples is no calibration.
MIN_SWEEP_S = 20.0
# Likewise the decode sweep when a slow prefill sweep (CPU vLLM stalls a handoff now and then) left it
# less: its first batch alone is priced at a pessimistic step time of seconds.
MIN_DECODE_S = 12.0
MIN_SAMPLES = 6  # per sweep: three constants, a held-out point, and room to reject an outlier
METHOD = (
    "calroute calibrate: unloaded P/D prefills over a geometric prompt ladder (client-observed latency); "
    "decode steps over a steady window of B concurrent streams at two prompt lengths; KV transfer = "
    "decode-engine TTFT after a handoff minus one fitted decode step; non-negative least squares with "
    "every 4th sample held out; tau and SLO targets by derive_calibration"
)


async def resolve_kv_bytes_per_token(client: EngineClient, cluster: ClusterFile) -> tuple[int, str]:
    """(KV bytes per token, where it came from): the cluster file's ``extra.kv_bytes_per_token`` if set;
    an emulated cluster's profile (or calibration file); else the engines' vLLM cache-config metric."""
    override = cluster.extra.get("kv_bytes_per_token")
    if override is not None:
        return int(override), "cluster file extra.kv_bytes_per_token"
    if cluster.kind == "emulated":
        if cluster.profile is None:
            raise CalibrationError(
                "the emulated cluster file names no profile: cannot tell KV bytes per token"
            )
        if cluster.profile.startswith("calibration:"):
            path = cluster.profile.removeprefix("calibration:")
            return Calibration.load(Path(path)).kv_bytes_per_token, f"calibration file {path}"
        return get_profile(cluster.profile).calibration.kv_bytes_per_token, f"profile:{cluster.profile}"
    engine = cluster.prefill[0]
    try:
        text = await client.get_text(f"{engine.url}/metrics", 10.0)
    except RequestFailed as e:
        raise CalibrationError(f"cannot read {engine.id}'s /metrics for the KV size: {e}") from e
    value = kv_bytes_from_metrics(text)
    if value is None:
        raise CalibrationError(
            f"{engine.id}'s /metrics does not give the KV bytes per token (vllm:cache_config_info needs "
            "kv_cache_memory_bytes); set extra: {kv_bytes_per_token: N} in the cluster file"
        )
    return value, "vllm:cache_config_info kv_cache_memory_bytes / (num_gpu_blocks x block_size)"


def _enough(sweep: str, n: int, duration_s: float) -> None:
    # The fits need more than this anyway; failing here says why there are so few.
    if n < MIN_SAMPLES:
        raise CalibrationError(
            f"only {n} {sweep} samples within the {duration_s:g} s budget (failed requests, if any, are "
            "listed above): give the calibration more time (--duration)"
        )


def _signed_median_by_engine(pairs: list[tuple[str, float]]) -> dict[str, float]:
    by: dict[str, list[float]] = {}
    for engine, value in pairs:
        by.setdefault(engine, []).append(value)
    return {e: statistics.median(v) for e, v in sorted(by.items())}


def _constants(cal: Calibration) -> dict[str, float]:
    return {
        "tau_pre_s": cal.tau_pre_s,
        "tau_dec_s": cal.tau_dec_s,
        "prefill.base_s": cal.prefill.base_s,
        "prefill.per_token_s": cal.prefill.per_token_s,
        "prefill.attn_s_per_token2": cal.prefill.attn_s_per_token2,
        "decode.base_s": cal.decode.base_s,
        "decode.per_seq_s": cal.decode.per_seq_s,
        "decode.per_ctx_token_s": cal.decode.per_ctx_token_s,
        "transfer.latency_s": cal.transfer.latency_s,
        "transfer.bandwidth_bytes_per_s": cal.transfer.bandwidth_bytes_per_s,
        "slo.tight_ttft_s": cal.slo.tight_ttft_s,
        "slo.tight_tpot_s": cal.slo.tight_tpot_s,
    }


def _unscaled(constants: dict[str, float], time_scale: float) -> dict[str, float]:
    """Constants at time scale 1: times divide by the scale, the bandwidth multiplies."""
    return {
        k: v * time_scale if k.endswith("bandwidth_bytes_per_s") else v / time_scale
        for k, v in constants.items()
    }


def transfer_samples(handoffs: list[HandoffMeasurement], decode: DecodeCurve) -> list[tuple[int, float]]:
    """Transfer time = decode TTFT after a handoff - the step that computes the last prompt token's logits
    (one sequence holding the prompt but that token; an idle engine has no step boundary to wait for)."""
    return [(h.prompt_tokens, h.decode_ttft_s - decode.step_s(1, h.prompt_tokens - 1)) for h in handoffs]


async def _calibrate(
    cluster: ClusterFile,
    duration_s: float,
    progress: Callable[[str], None],
    cluster_path: Path | None,
    api_key: str | None,
    seed: int | None,
) -> tuple[Calibration, dict[str, Any]]:
    started = time.perf_counter()
    # Prompts must be new to every engine's prefix cache, including across calibrations of one cluster:
    # a fresh seed per run unless the caller fixes one.
    seed = secrets.randbits(63) if seed is None else seed
    started_at = datetime.now(UTC)
    token_ids = EMULATED_TOKEN_IDS if cluster.kind == "emulated" else DEFAULT_TOKEN_IDS
    # No connection limit: a batch of B streams needs B connections at once (aiohttp's default is 100).
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        client = EngineClient(session, cluster.model, token_ids, seed=seed, api_key=api_key)
        kv_bytes, kv_source = await resolve_kv_bytes_per_token(client, cluster)
        progress(
            f"calibrating {cluster.kind} cluster ({len(cluster.prefill)}P+{len(cluster.decode)}D, "
            f"time scale {cluster.time_scale:g}) within {duration_s:.0f} s; "
            f"KV {kv_bytes} B/token ({kv_source})"
        )
        await warm_up(client, cluster, progress)
        warmup_s = time.perf_counter() - started
        left_s = duration_s - warmup_s
        if left_s < MIN_SWEEP_S:
            progress(
                f"warm-up took {warmup_s:.1f} s of the {duration_s:g} s budget: measuring for "
                f"{MIN_SWEEP_S:g} s anyway (the calibration will overrun by {MIN_SWEEP_S - left_s:.0f} s)"
            )
            left_s = MIN_SWEEP_S

        phase_started = time.perf_counter()
        prefills, handoffs = await prefill_sweep(client, cluster, PREFILL_SHARE * left_s, progress)
        prefill_phase_s = time.perf_counter() - phase_started
        _enough("prefill", len(prefills), duration_s)
        pre_fit = fit_prefill([(m.prompt_tokens, m.latency_s) for m in prefills])
        progress(
            f"prefill fit: R^2 {_fmt(pre_fit.report.r2_fit)}, held-out R^2 {_fmt(pre_fit.report.r2_held_out)}"
            + "".join(f"; {n}" for n in pre_fit.report.notes)
        )

        phase_started = time.perf_counter()
        # The decode share grows by whatever the prefill phase left unused.
        decode_budget_s = left_s * (PREFILL_SHARE + DECODE_SHARE) - prefill_phase_s
        if decode_budget_s < MIN_DECODE_S:
            progress(
                f"prefill sweep took {prefill_phase_s:.1f} s: measuring decode for {MIN_DECODE_S:g} s anyway "
                f"(the calibration will overrun by {MIN_DECODE_S - decode_budget_s:.0f} s)"
            )
            decode_budget_s = MIN_DECODE_S
        decodes = await decode_sweep(client, cluster, pre_fit.curve, decode_budget_s, progress)
        decode_phase_s = time.perf_counter() - phase_started
    _enough("decode", len(decodes), duration_s)
    dec_fit = fit_decode([(m.batch, m.context_tokens, m.tpot_s) for m in decodes])
    progress(
        f"decode fit: R^2 {_fmt(dec_fit.report.r2_fit)}, held-out R^2 {_fmt(dec_fit.report.r2_held_out)}"
    )
    xfer_fit = fit_transfer(transfer_samples(handoffs, dec_fit.curve), kv_bytes)
    wall_s = time.perf_counter() - started

    fits: dict[str, Fit[Any]] = {"prefill": pre_fit, "decode": dec_fit, "transfer": xfer_fit}
    source = str(cluster_path) if cluster_path is not None else ",".join(e.url for e in cluster.engines)
    counts = {"prefill": len(prefills), "decode": len(decodes), "transfer": len(handoffs)}
    cluster_info = {
        "kind": cluster.kind,
        "model": cluster.model,
        "time_scale": cluster.time_scale,
        "profile": cluster.profile,
        "prefill_engines": len(cluster.prefill),
        "decode_engines": len(cluster.decode),
    }
    provenance: dict[str, Any] = {
        "source": f"calibrate:{cluster.kind}:{source}",
        "method": METHOD,
        "date": started_at.isoformat(timespec="seconds"),
        "cluster": cluster_info,
        "samples": counts,
        "kv_bytes_per_token_source": kv_source,
        "budget_s": duration_s,
        "wall_s": round(wall_s, 3),
        "fit": {name: f.report.to_dict() for name, f in fits.items()},
    }
    cal = derive_calibration(pre_fit.curve, dec_fit.curve, xfer_fit.curve, kv_bytes, provenance)
    constants = _constants(cal)
    report: dict[str, Any] = {
        "wall_s": wall_s,
        "budget_s": duration_s,
        "prompt_seed": seed,
        "phases_s": {"warmup": warmup_s, "prefill": prefill_phase_s, "decode": decode_phase_s},
        "cluster": cluster_info,
        "kv_bytes_per_token": {"value": kv_bytes, "source": kv_source},
        "constants": constants,
        "constants_at_time_scale_1": _unscaled(constants, cluster.time_scale),
        "fits": {name: f.report.to_dict() for name, f in fits.items()},
        "per_engine_median_rel_residual": {
            "prefill": _prefill_residuals(prefills, pre_fit.curve),
            "decode": _signed_median_by_engine(
                [
                    (m.engine_id, m.tpot_s / dec_fit.curve.step_s(m.batch, round(m.context_tokens)) - 1)
                    for m in decodes
                ]
            ),
        },
        "samples": {
            "prefill": [vars(m) for m in prefills],
            "handoff": [vars(m) for m in handoffs],
            "decode": [vars(m) for m in decodes],
        },
    }
    progress(f"calibration done in {wall_s:.1f} s")
    return cal, report


def _prefill_residuals(prefills: list[PrefillMeasurement], curve: PrefillCurve) -> dict[str, float]:
    return _signed_median_by_engine(
        [(m.engine_id, m.latency_s / curve.single_s(m.prompt_tokens) - 1) for m in prefills]
    )


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def calibrate_cluster(
    cluster: ClusterFile,
    duration_s: float,
    progress: Callable[[str], None],
    *,
    cluster_path: Path | None = None,
    api_key: str | None = None,
    seed: int | None = None,
) -> tuple[Calibration, dict[str, Any]]:
    """Measure ``cluster`` within about ``duration_s`` seconds and return (calibration, report).

    The calibration's provenance records the source, method, date, the cluster's kind/model/time scale,
    the sample counts and every fit's quality; the report adds the phase times, the constants (also at time
    scale 1), per-engine residuals and the raw samples. ``seed`` fixes the random prompts (by default a
    fresh one per run, so no prompt can be in an engine's prefix cache from an earlier calibration).
    Raises CalibrationError when a sweep cannot be run or its samples do not determine a curve.
    """
    if duration_s < MIN_DURATION_S:
        raise CalibrationError(f"duration must be >= {MIN_DURATION_S:g} s, got {duration_s:g}")
    return asyncio.run(_calibrate(cluster, duration_s, progress, cluster_path, api_key, seed))
