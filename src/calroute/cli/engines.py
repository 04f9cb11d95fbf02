"""`calroute engines ...`: run emulated engines, bring a cluster up, take it down."""

from __future__ import annotations

import logging
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from calroute.cli import limits
from calroute.cli.common import (
    err,
    exit_on_error,
    load_profile,
)
from calroute.cluster.file import ClusterFile
from calroute.costmodel.profiles import DEFAULT_PROFILE, profile_names
from calroute.errors import ConfigError
from calroute.types import Role

engines_app = typer.Typer(no_args_is_help=True, help="Engines: the vLLM emulator, real vLLM, cluster files.")


class Kind(StrEnum):
    emulated = "emulated"
    vllm = "vllm"


@engines_app.command()
def emulate(
    engine: Annotated[list[str], typer.Option(help="ROLE:PORT, e.g. prefill:8100 (repeatable; port 0: any)")],
    profile: Annotated[
        str, typer.Option(help=f"hardware profile: {', '.join(profile_names())}")
    ] = DEFAULT_PROFILE,
    calibration: Annotated[
        Path | None, typer.Option(help="time engines by a calibration file's curves")
    ] = None,
    time_scale: Annotated[float, typer.Option(min=0.001, help="multiply every modelled duration")] = 1.0,
    stream_interval: Annotated[int, typer.Option(min=1, help="tokens per SSE chunk after the first")] = 1,
    model: Annotated[str, typer.Option(help="served model name")] = "emulated",
    host: Annotated[str, typer.Option(help="address to bind (loopback by default)")] = "127.0.0.1",
    kv_lease_s: Annotated[
        float, typer.Option(min=0.0, help="how long a prefill engine holds unpulled KV")
    ] = 30.0,
    kv_load_failure_policy: Annotated[
        str, typer.Option(help="fail or recompute when a KV pull fails")
    ] = "fail",
    handshake_timeout_s: Annotated[
        float, typer.Option(min=0.0, help="unreachable prefill engine: fail after")
    ] = 5.0,
    seed: Annotated[int, typer.Option(help="seed of injected faults")] = 0,
    kv_events_config: Annotated[
        str | None,
        typer.Option(
            help="vLLM's KV events JSON, e.g. "
            '\'{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557"}\'; '
            "engine i publishes on the endpoint's port + i"
        ),
    ] = None,
    kv_capacity_tokens: limits.KvCapacity = None,
    max_model_len: limits.MaxModelLen = None,
    max_batched_tokens: limits.MaxBatchedTokens = None,
    max_num_seqs: limits.MaxNumSeqs = None,
) -> None:
    """Serve emulated vLLM engines (GPU-like timing from a hardware profile) until SIGTERM."""
    from calroute.contract.kv_events import KvEventsConfig
    from calroute.emulator.emulate import run
    from calroute.emulator.group import EngineSpec, GroupConfig

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with exit_on_error():
        specs = []
        for item in engine:
            role, _, port = item.partition(":")
            try:
                specs.append(EngineSpec(Role(role), int(port or 0)))
            except ValueError as e:
                raise ConfigError(f"--engine {item!r}: expected prefill:PORT or decode:PORT") from e
        given = limits.overrides(kv_capacity_tokens, max_model_len, max_batched_tokens, max_num_seqs)
        hw = load_profile(profile, calibration, limits=given)
        if kv_load_failure_policy not in ("fail", "recompute"):
            raise ConfigError(
                f"--kv-load-failure-policy must be fail or recompute, got {kv_load_failure_policy!r}"
            )
        events = None if kv_events_config is None else KvEventsConfig.from_json(kv_events_config)
        config = GroupConfig(
            profile=hw,
            model_name=model,
            host=host,
            time_scale=time_scale,
            stream_interval=stream_interval,
            kv_lease_s=kv_lease_s,
            kv_failure_policy=kv_load_failure_policy,
            handshake_timeout_s=handshake_timeout_s,
            seed=seed,
            kv_events=events,
        )
    run(config, specs)


@engines_app.command()
def up(
    prefill: Annotated[int, typer.Option(min=1, help="prefill engines")] = 1,
    decode: Annotated[int, typer.Option(min=1, help="decode engines")] = 1,
    kind: Annotated[
        Kind, typer.Option(help="emulated engines, or real vLLM (CPU build, tiny model)")
    ] = Kind.emulated,
    profile: Annotated[str, typer.Option(help="emulated: hardware profile")] = DEFAULT_PROFILE,
    calibration: Annotated[Path | None, typer.Option(help="emulated: time by a calibration file")] = None,
    time_scale: Annotated[float, typer.Option(min=0.001, help="emulated: multiply modelled durations")] = 1.0,
    stream_interval: Annotated[int, typer.Option(min=1, help="emulated: tokens per SSE chunk")] = 1,
    process_per_engine: Annotated[bool, typer.Option(help="emulated: one process per engine")] = False,
    kv_events: Annotated[
        bool,
        typer.Option(
            help="publish vLLM's KV events (endpoints in the cluster file), for serve --prefix-index"
        ),
    ] = False,
    out: Annotated[Path, typer.Option(help="the cluster file to write")] = Path("cluster.yaml"),
    log_dir: Annotated[Path, typer.Option(help="engine logs")] = Path("out/engines"),
    kv_capacity_tokens: limits.KvCapacity = None,
    max_model_len: limits.MaxModelLen = None,
    max_batched_tokens: limits.MaxBatchedTokens = None,
    max_num_seqs: limits.MaxNumSeqs = None,
) -> None:
    """Start engines, wait until they are healthy, write the cluster file. The engine limits apply to
    emulated engines (real vLLM's are its own flags: cluster/vllm.py)."""
    from calroute.cluster import launch

    with exit_on_error():
        given = limits.overrides(kv_capacity_tokens, max_model_len, max_batched_tokens, max_num_seqs)
        if given and kind is not Kind.emulated:
            raise ConfigError(
                "--kv-capacity-tokens, --max-model-len, --max-batched-tokens and --max-num-seqs are for "
                "emulated engines"
            )
        if kind is Kind.emulated:
            launched = launch.up_emulated(
                prefill,
                decode,
                log_dir,
                profile=profile,
                calibration=calibration,
                time_scale=time_scale,
                stream_interval=stream_interval,
                process_per_engine=process_per_engine,
                kv_events=kv_events,
                limits=given,
            )
        else:
            launched = launch.up_vllm(prefill, decode, log_dir, repo_root=Path.cwd(), kv_events=kv_events)
    cluster = launched.file
    cluster.save(out)
    for engine in cluster.engines:
        err.print(f"{engine.id:>10}  {engine.url}")
    err.print(f"wrote {out}; stop with: calroute engines down {out}")


@engines_app.command()
def down(
    cluster_file: Annotated[Path, typer.Argument(help="a cluster file written by `engines up`")],
) -> None:
    """Stop every engine process a cluster file names."""
    from calroute.cluster import launch

    with exit_on_error():
        cluster = ClusterFile.load(cluster_file)
        launch.down(cluster)
    err.print(f"stopped {len(cluster.pgids)} process group(s)")
