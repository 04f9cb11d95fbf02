"""One live run: a proxy with one policy variant in front of a running cluster, driven by the load generator.

Per run, as the paper's protocol asks: start the proxy fresh, reset every engine's prefix cache, warm up
through the proxy (not measured), drive the open-loop schedule, collect the client's records, stop the
proxy. A finished run leaves summary.json in its directory, with what it was made from (the variant and a
digest of the request schedule); a later call with the same definition reuses it (resumable), any other
definition runs again in a clean directory. The SLO targets are not part of the definition: they judge the
records and do not change the run (requests carry their class by name), so a reused run is judged again, by
the targets of this call.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from calroute import aio
from calroute.cluster.file import ClusterFile
from calroute.cluster.procs import free_port, start_process_group, stop_process_group, wait_http_ready
from calroute.costmodel.calibration import Calibration, mismatched
from calroute.errors import CalrouteError
from calroute.harness.gates import reset_prefix_caches
from calroute.harness.loadgen import drive
from calroute.results.metrics import RunSink, RunSummary, SummaryAccumulator, summarize
from calroute.results.records import RecordWriter, RequestRecord, read_records
from calroute.routing.seeds import RouterSeeds
from calroute.routing.variant import Variant
from calroute.types import RequestSpec, SloClass

WARMUP_REQUESTS = 4


@dataclass(frozen=True)
class LiveSetup:
    cluster: ClusterFile
    cluster_path: Path  # the file the proxy reads
    calibration: Calibration  # the cluster's measured constants: SLO targets, and the "calibrated" router


@dataclass(frozen=True)
class LiveRun:
    summary: RunSummary
    valid: bool
    lateness_p99_s: float
    # the proxy's KV-event batches: how many, and their mean delay from the engine's ts to the index (None:
    # no batch, or no prefix index); what the calibrated simulator's --kv-event-delay-s is set from
    kv_event_batches: int = 0
    kv_event_delay_s: float | None = None


def _kv_event_delay(url: str) -> tuple[int, float | None]:
    """(batches, mean delay in seconds) from the proxy's calroute_kv_events_delay_seconds."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:  # noqa: S310 (loopback, our proxy)
            text = r.read(4 * 1024 * 1024).decode()
    except OSError:
        return 0, None
    count = total = 0.0
    for family in text_string_to_metric_families(text):
        if family.name == "calroute_kv_events_delay_seconds":
            for sample in family.samples:
                if sample.name.endswith("_count"):
                    count = sample.value
                elif sample.name.endswith("_sum"):
                    total = sample.value
    return int(count), (total / count if count else None)


class LiveRunError(CalrouteError):
    pass


def _proxy_argv(
    setup: LiveSetup, variant: Variant, run_dir: Path, port: int, seed: int, prefix_index: bool = False
) -> list[str]:
    """``prefix_index``: the proxy hashes prompts and routes on what the engines cache (docs/prefix.md),
    for workloads whose prompts share prefixes; elsewhere it would only cost the hashing."""
    cal = setup.calibration if variant.router == "calibrated" else mismatched(setup.calibration)
    cal_path = run_dir / "router-calibration.json"
    cal.save(cal_path)
    argv = [
        sys.executable,
        "-m",
        "calroute",
        "serve",
        "--cluster",
        str(setup.cluster_path),
        "--policy",
        variant.policy,
        "--calibration",
        str(cal_path),
        "--port",
        str(port),
        "--log",
        str(run_dir / "proxy.jsonl"),
        "--predictor",
        variant.predictor,
        "--predictor-noise",
        repr(variant.predictor_noise),
        "--predictor-seed",
        str(RouterSeeds.of_run(seed).predictor),  # the simulator's (experiments/kit/sim_backend.py)
    ]
    for key, value in variant.params.items():
        argv += ["--param", f"{key}={value}"]
    if variant.router == "online":
        argv.append("--online-calibration")
    if prefix_index:
        argv.append("--prefix-index")
    return argv


def _reset(cluster: ClusterFile) -> None:
    """Isolation between runs: the paper saw identical configurations 20 points apart without it."""
    result = reset_prefix_caches(cluster)
    if not result.passed:
        raise LiveRunError(f"could not reset the engines' prefix caches: {result.detail}")


def seed_of(requests: Sequence[RequestSpec]) -> int:
    """Prompts differ between seeds: derive their seed from the requests themselves (stable)."""
    return sum(r.prompt_tokens * (i + 1) for i, r in enumerate(requests[:64])) % 1_000_003


async def _warm_up(url: str, model: str) -> None:
    warm = [RequestSpec(f"warmup-{i}", 0.01 * i, 64, 4, SloClass.LOOSE) for i in range(WARMUP_REQUESTS)]
    await drive(url, warm, model)


def run_definition(variant: Variant, requests: Sequence[RequestSpec]) -> dict[str, object]:
    """What a run is made from: a saved run is reused only for an equal definition. The schedule's digest
    covers the workload, rate, seed and count; the variant covers policy, parameters, router and predictor."""
    digest = hashlib.sha256()
    for r in requests:
        blocks = f",{' '.join(map(str, r.prefix_blocks))}" if r.prefix_blocks else ""
        digest.update(
            f"{r.request_id},{r.arrival_s!r},{r.prompt_tokens},{r.output_tokens},{r.slo_class.value}"
            f"{blocks}\n".encode()
        )
    return {"variant": asdict(variant), "requests": len(requests), "schedule_sha256": digest.hexdigest()}


def with_routing(
    records: Sequence[RequestRecord], proxy_ids: Mapping[str, str], proxy_log: Path
) -> list[RequestRecord]:
    """The client's records with what only the proxy knows of each request, from its own record (found by
    the id its answer named, LoadResult.proxy_ids): the engines it chose, its output-length prediction, the
    path and why, and on the local path the cached tokens the decode engine reported (the client's header
    carries the prefill engine's only). Times stay the client's. A request the proxy has no record of keeps
    the client's record as it is."""
    if not proxy_ids or not proxy_log.exists():
        return list(records)
    by_id = {r.request_id: r for r in read_records(proxy_log)}
    out = []
    for rec in records:
        p = by_id.get(proxy_ids.get(rec.request_id, ""))
        if p is None:
            out.append(rec)
            continue
        out.append(
            rec.replace(
                prefill_id=p.prefill_id,
                decode_id=p.decode_id,
                predicted_output_tokens=p.predicted_output_tokens,
                local_prefill=p.local_prefill,
                path_reason=p.path_reason,
                predicted_cached_tokens=p.predicted_cached_tokens,
                cached_tokens=p.cached_tokens if p.local_prefill else rec.cached_tokens,
            )
        )
    return out


def run_variant(
    setup: LiveSetup,
    variant: Variant,
    requests: Sequence[RequestSpec],
    run_dir: Path,
    progress: Callable[[int, int], None] | None = None,
    seed: int = 0,
) -> LiveRun:
    """One variant's run on a live cluster, or its saved result when the definition is unchanged. ``seed``
    is the arrival trace's: the injected predictor error derives from it, as on the simulator."""
    done = run_dir / "summary.json"
    definition = run_definition(variant, requests)
    if done.exists():
        d = json.loads(done.read_text())
        if d.get("definition") == definition:
            records = run_dir / "records.jsonl"
            summary = (
                summarize(list(read_records(records)), setup.calibration.slo)
                if records.exists()
                else RunSummary(**d["summary"])
            )
            return LiveRun(
                summary,
                d["valid"],
                d["lateness_p99_s"],
                d.get("kv_event_batches", 0),
                d.get("kv_event_delay_s"),
            )
    if run_dir.exists():  # made from another definition, or interrupted: its logs must not mix with ours
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    proxy: subprocess.Popen[bytes] = start_process_group(
        _proxy_argv(setup, variant, run_dir, port, seed, any(r.prefix_blocks for r in requests)),
        None,
        run_dir / "proxy.log",
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ready(f"{url}/health", 30, proc=proxy, log_path=run_dir / "proxy.log")
        _reset(setup.cluster)
        aio.run(_warm_up(url, setup.cluster.model))
        _reset(setup.cluster)  # the warm-up's prompts must not help the measured ones
        result = aio.run(
            drive(
                url,
                list(requests),
                setup.cluster.model,
                progress=progress,
                policy=variant.label,
                prompt_seed=seed_of(requests),
                oracle_header=variant.predictor == "oracle",
            )
        )
        batches, delay_s = _kv_event_delay(url)
    finally:
        stop_process_group(proxy.pid)
        proxy.wait(timeout=10)
    acc = SummaryAccumulator(setup.calibration.slo)
    routed = with_routing(result.records, result.proxy_ids, run_dir / "proxy.jsonl")
    with (run_dir / "records.jsonl").open("w") as f:
        sink = RunSink(acc, RecordWriter(f, flush_every=256))
        for rec in routed:
            sink(rec)
    run = LiveRun(acc.summary(), result.valid, result.lateness_p99_s, batches, delay_s)
    tmp = done.with_suffix(".tmp")
    tmp.write_text(
        json.dumps(
            {
                "summary": asdict(run.summary),
                "valid": run.valid,
                "lateness_p99_s": run.lateness_p99_s,
                "kv_event_batches": run.kv_event_batches,
                "kv_event_delay_s": run.kv_event_delay_s,
                "definition": definition,
            },
            indent=2,
        )
    )
    tmp.replace(done)
    return run
