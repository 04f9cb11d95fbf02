"""`calroute bench`: drive a live target (the router proxy, or one engine) with a workload on its schedule.

Writes DIR/records.jsonl (the shared per-request schema, as requests end) and DIR/summary.json (the shape
of `calroute simulate --json`, one run, plus the run's validity, the generator's lateness and the SLO
targets used). Exit codes: 0 valid run, 2 bad arguments or unreachable target or failed gates, 3 the run
completed but the generator could not keep the schedule (files written, figures not to be trusted).
"""

from __future__ import annotations

import asyncio
import json
import math
import resource
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import aiohttp
import typer

from calroute import aio
from calroute.cli.common import (
    SLO_DEFAULT,
    SLO_HELP,
    err,
    exit_on_error,
    load_profile,
    progress_bar,
    slo_option,
)
from calroute.cluster.file import ClusterFile
from calroute.costmodel.calibration import Calibration
from calroute.costmodel.profiles import DEFAULT_PROFILE, profile_names
from calroute.errors import ConfigError
from calroute.harness import gates
from calroute.harness.loadgen import DEFAULT_MAX_LATENESS_S, DEFAULT_TIMEOUT_S, LoadResult, drive
from calroute.results.metrics import summarize
from calroute.results.records import RecordWriter
from calroute.types import RequestSpec
from calroute.workload.source import WORKLOADS, FamilyWorkload, TraceWorkload, WorkloadSource

Family = Enum("Family", {f: f for f in WORKLOADS}, type=str)  # type: ignore[misc]
EXIT_INVALID = 3


def workload_requests(
    source: WorkloadSource, rate_rps: float, duration_s: float, seed: int, max_requests: int | None
) -> list[RequestSpec]:
    """The source's requests arriving before ``duration_s``, at most ``max_requests`` of them.

    A family is generated with enough requests to cover the duration: the mean rate times the duration
    plus a margin for bursts, doubled until the last arrival passes the duration. The count generated
    depends only on (family, rate, duration, seed), never on ``max_requests``: mixed-bursty's arrivals
    depend on how many are drawn, and a capped run must send the first requests of the uncapped one.
    """
    if isinstance(source, FamilyWorkload):
        n = max(16, math.ceil(rate_rps * duration_s * 1.2 + 10 * math.sqrt(rate_rps * duration_s)))
        while True:
            reqs = FamilyWorkload(source.family, n, source.tight_fraction).requests(rate_rps, seed)
            if reqs[-1].arrival_s >= duration_s:
                break
            n *= 2
    else:
        reqs = source.requests(rate_rps, seed)
    kept = sorted((r for r in reqs if r.arrival_s < duration_s), key=lambda r: r.arrival_s)
    if max_requests is not None:
        kept = kept[:max_requests]
    if not kept:
        raise ConfigError(f"no request arrives within --duration {duration_s:g} s at {rate_rps:g} req/s")
    return kept


async def _models(target: str) -> dict[str, Any]:
    """The first model the target's /v1/models lists."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s,
            s.get(target.rstrip("/") + "/v1/models") as r,
        ):
            if r.status != 200:
                raise ConfigError(f"{target}/v1/models answered HTTP {r.status}; give --model")
            data = (await r.json(content_type=None))["data"]
            model: dict[str, Any] = data[0]
            return model
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, IndexError, TypeError) as e:
        raise ConfigError(f"cannot read the model from {target}/v1/models ({type(e).__name__}: {e})") from e


def _raise_fd_limit() -> None:
    # An open loop holds one connection per request in flight: thousands under overload.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard and hard != resource.RLIM_INFINITY:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass  # keep the soft limit; requests beyond it fail and are recorded as failed


def _summary(
    result: LoadResult,
    cal: Calibration,
    *,
    rate_rps: float,
    seed: int,
    label: str,
    records_path: Path,
    source: WorkloadSource,
    duration_s: float,
    target: str,
    model: str,
    profile: str | None,
    calibration: Path | None,
    gate_results: list[gates.GateResult] | None,
    slo_spec: str = SLO_DEFAULT,
) -> dict[str, Any]:
    s = summarize(result.records, cal.slo)
    return {
        "rate_rps": rate_rps,
        "runs": [
            {
                "policy": label,
                "seed": seed,
                "requests": s.requests,
                "goodput": s.goodput,
                "ttft_p50_s": s.ttft_p50_s,
                "ttft_p99_s": s.ttft_p99_s,
                "tpot_p50_s": s.tpot_p50_s,
                "tpot_p99_s": s.tpot_p99_s,
                "status_counts": s.status_counts,
                "records": str(records_path),
                "completed": s.completed,
                "good": s.good,
                "good_rps": s.good_rps,
                "duration_s": s.duration_s,
            }
        ],
        "workload": {**source.describe(), "requests": len(result.records), "duration_s": duration_s},
        "target": target,
        "model": model,
        "profile": profile,
        "calibration": None if calibration is None else str(calibration),
        "slo": {"spec": slo_spec, **cal.slo.to_dict()},  # as `calroute simulate --json` gives it
        "valid": result.valid,
        "lateness": result.lateness_dict(),
        "run_duration_s": result.duration_s,
        "schedule_s": result.schedule_s,
        "started_unix_s": result.started_unix_s,
        "gates": None if gate_results is None else [vars(g) for g in gate_results],
    }


def bench(
    target: Annotated[str, typer.Option(help="base URL to drive: the router proxy (or one engine)")],
    rate: Annotated[float, typer.Option(help="mean arrival rate, requests/s")],
    duration: Annotated[float, typer.Option(help="schedule length, s: requests arriving before it are sent")],
    out_dir: Annotated[Path, typer.Option("--out", help="write records.jsonl and summary.json here")],
    workload: Annotated[Family | None, typer.Option(help="a synthetic workload family")] = None,
    trace: Annotated[Path | None, typer.Option(help="a trace file (rescaled to --rate)")] = None,
    seed: Annotated[int, typer.Option(help="seed of arrivals, lengths, SLO classes and prompts")] = 0,
    requests: Annotated[int | None, typer.Option(min=1, help="send at most this many requests")] = None,
    tight_fraction: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="share of tight-SLO requests")
    ] = 0.5,
    calibration: Annotated[
        Path | None, typer.Option(help="calibration JSON whose SLO targets judge goodput")
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(help=f"hardware profile whose SLO targets judge goodput (default {DEFAULT_PROFILE})"),
    ] = None,
    model: Annotated[str | None, typer.Option(help="model name to ask for; default: the target's")] = None,
    policy_label: Annotated[str, typer.Option(help="policy name written in records and summary")] = "live",
    cluster: Annotated[
        Path | None,
        typer.Option(help="cluster file: run the correctness gates and reset prefix caches first"),
    ] = None,
    max_lateness_ms: Annotated[
        float, typer.Option(min=0.001, help="bound on the generator's p99 lateness for a valid run")
    ] = DEFAULT_MAX_LATENESS_S * 1e3,
    timeout: Annotated[
        float, typer.Option(min=0.001, help="per-request deadline, s (then: cancelled)")
    ] = DEFAULT_TIMEOUT_S,
    slo: Annotated[str, typer.Option(help=SLO_HELP)] = SLO_DEFAULT,
) -> None:
    """Drive a live target with a workload, open loop; write per-request records and a summary."""
    with exit_on_error():
        if (workload is None) == (trace is None):
            raise ConfigError("give exactly one of --workload and --trace")
        if calibration is not None and profile is not None:
            raise ConfigError("give at most one of --calibration and --profile")
        if rate <= 0 or duration <= 0:
            raise ConfigError(f"--rate and --duration must be > 0, got {rate} and {duration}")
        if trace is not None and not trace.is_file():
            raise ConfigError(f"--trace {trace}: no such file")
        if profile is not None and profile not in profile_names():
            raise ConfigError(f"--profile {profile!r}: known: {', '.join(profile_names())}")
        slo_spec = slo_option(slo)
        cal = load_profile(profile, calibration, slo_spec).calibration
        source: WorkloadSource = (
            FamilyWorkload(workload.value, 1, tight_fraction)
            if workload is not None
            else TraceWorkload(trace, None, tight_fraction)  # type: ignore[arg-type]
        )
        reqs = workload_requests(source, rate, duration, seed, requests)
        gate_results: list[gates.GateResult] | None = None
        if cluster is not None:
            c = ClusterFile.load(cluster)
            err.print(f"correctness gates on {len(c.engines)} engines ...")
            gate_results = gates.require_gates(c)
            reset = gates.reset_prefix_caches(c)
            gate_results.append(reset)
            if not reset.passed:
                raise gates.GateFailed(gate_results)
        info = asyncio.run(_models(target)) if model is None else {"id": model}
        model_name = str(info["id"])
        max_len = info.get("max_model_len")
        if isinstance(max_len, int):
            too_long = sum(r.prompt_tokens + r.output_tokens > max_len for r in reqs)
            if too_long:
                err.print(
                    f"[yellow]warning:[/] {too_long} request(s) exceed the model's max_model_len {max_len}: "
                    "they will fail"
                )

    _raise_fd_limit()
    out_dir.mkdir(parents=True, exist_ok=True)
    records_path = out_dir / "records.jsonl"
    with records_path.open("w") as f, progress_bar() as progress:
        writer = RecordWriter(f, flush_every=64)  # a crash loses at most 64 records; writes stay cheap
        task = progress.add_task(f"{policy_label} @ {rate:g} req/s", total=len(reqs))
        result = aio.run(
            drive(
                target,
                reqs,
                model_name,
                progress=lambda done, total: progress.update(task, completed=done),
                max_lateness_s=max_lateness_ms / 1e3,
                timeout_s=timeout,
                policy=policy_label,
                prompt_seed=seed,
                on_record=writer.write,
            )
        )
        writer.flush()
    summary = _summary(
        result,
        cal,
        rate_rps=rate,
        seed=seed,
        label=policy_label,
        records_path=records_path,
        source=source,
        duration_s=duration,
        target=target,
        model=model_name,
        profile=None if calibration is not None else profile or DEFAULT_PROFILE,
        calibration=calibration,
        gate_results=gate_results,
        slo_spec=slo_spec.name,
    )
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    run = summary["runs"][0]

    def s(x: float | None, unit: float = 1.0, fmt: str = ".3f") -> str:
        return "-" if x is None else format(x * unit, fmt)

    typer.echo(
        f"{policy_label} @ {rate:g} req/s, {run['requests']} requests: goodput {run['goodput']:.3f}, "
        f"p99 TTFT {s(run['ttft_p99_s'])} s, p99 TPOT {s(run['tpot_p99_s'], fmt='.4f')} s, "
        f"lateness p99 {result.lateness_p99_s * 1e3:.2f} ms ({'valid' if result.valid else 'INVALID'})"
    )
    err.print(f"wrote {records_path} and {out_dir / 'summary.json'}")
    if not result.valid:
        err.print(
            f"[red]invalid run:[/] the generator's p99 lateness {result.lateness_p99_s * 1e3:.2f} ms exceeds "
            f"{max_lateness_ms:g} ms: the offered load was not the schedule"
        )
        raise typer.Exit(EXIT_INVALID)
