"""`calroute engines up / down`: start a cluster of engines, wait until healthy, write the cluster file;
stop every process group a cluster file names.

Emulated engines run as `python -m calroute engines emulate` (all engines in one process by default, or
one process per engine so a test can kill one); real engines are vLLM's CPU build serving the tiny model
(`make vllm`), with NixlConnector between them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from calroute.cluster import vllm
from calroute.cluster.file import EMULATOR_TOKENIZER, ClusterEngine, ClusterFile
from calroute.cluster.procs import (
    free_port_run,
    free_ports,
    start_process_group,
    stop_process_group,
    wait_http_ready,
)
from calroute.costmodel.profiles import get_profile
from calroute.errors import ConfigError
from calroute.types import Role

# The tiny model's KV per token: 2 (K, V) x 2 layers x 2 KV heads x head_dim 32 x 4 bytes (float32).
_TINY_KV_BYTES_PER_TOKEN_DEFAULT = 1024


@dataclass
class LaunchedCluster:
    """A cluster this process started: its file, and the process handles to reap when stopping it."""

    file: ClusterFile
    procs: list[subprocess.Popen[bytes]]

    def stop(self) -> None:
        try:
            down(self.file)
        finally:
            for p in self.procs:
                if p.poll() is None:
                    p.wait(timeout=10)


def _roles(prefill: int, decode: int) -> list[tuple[str, Role]]:
    if prefill < 1 or decode < 1:
        raise ConfigError(f"a cluster needs at least 1 prefill and 1 decode engine, got {prefill}P+{decode}D")
    return [(f"prefill-{i}", Role.PREFILL) for i in range(prefill)] + [
        (f"decode-{i}", Role.DECODE) for i in range(decode)
    ]


def up_emulated(
    prefill: int,
    decode: int,
    log_dir: Path,
    profile: str = "a40-qwen2.5-3b",
    calibration: Path | None = None,
    time_scale: float = 1.0,
    stream_interval: int = 1,
    model: str = "emulated",
    process_per_engine: bool = False,
    kv_lease_s: float = 30.0,
    timeout_s: float = 60.0,
    kv_events: bool = False,
    limits: Mapping[str, int] | None = None,
) -> LaunchedCluster:
    """``kv_events``: every engine publishes vLLM's KV events on a loopback port of its own, written into the
    cluster file (kv_events_endpoint) for the proxy to subscribe to. ``limits``: engine limits in place of the
    profile's (EngineLimits' fields: kv_capacity_tokens, max_model_len, max_batched_tokens, max_num_seqs)."""
    roles = _roles(prefill, decode)
    hw = get_profile(profile)
    if limits:
        hw = replace(hw, limits=replace(hw.limits, **limits))
    ports = free_ports(len(roles))
    base = [
        sys.executable,
        "-m",
        "calroute",
        "engines",
        "emulate",
        "--profile",
        profile,
        "--time-scale",
        str(time_scale),
        "--stream-interval",
        str(stream_interval),
        "--model",
        model,
        "--kv-lease-s",
        str(kv_lease_s),
    ]
    if calibration is not None:
        base += ["--calibration", str(calibration)]
    for name, value in (limits or {}).items():
        base += [f"--{name.replace('_', '-')}", str(value)]
    groups = [[i] for i in range(len(roles))] if process_per_engine else [list(range(len(roles)))]
    event_ports: dict[int, int] = {}
    procs = []
    try:
        for n, members in enumerate(groups):
            argv = list(base)
            for i in members:
                argv += ["--engine", f"{roles[i][1].value}:{ports[i]}"]
            if kv_events:
                # One process's engines publish on consecutive ports (vLLM's offset per rank): a free run.
                # (not the engines' HTTP ports, chosen free but not bound until their processes start)
                first = free_port_run(len(members), exclude={*ports, *event_ports.values()})
                event_ports.update({i: first + k for k, i in enumerate(members)})
                config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{first}"}
                argv += ["--kv-events-config", json.dumps(config)]
            log = log_dir / f"emulated-{n}.log"
            procs.append((start_process_group(argv, None, log), log))
        for i, (_, _) in enumerate(roles):
            popen, log = procs[0 if not process_per_engine else i]
            wait_http_ready(f"http://127.0.0.1:{ports[i]}/health", timeout_s, proc=popen, log_path=log)
    except BaseException:
        for popen, _ in procs:
            stop_process_group(popen.pid)
            popen.wait(timeout=10)
        raise
    file = ClusterFile(
        kind="emulated",
        model=model,
        max_model_len=hw.limits.max_model_len,
        engines=tuple(
            ClusterEngine(
                name,
                role,
                f"http://127.0.0.1:{port}",
                hw.limits.kv_capacity_tokens,
                f"tcp://127.0.0.1:{event_ports[i]}" if i in event_ports else None,
            )
            for i, ((name, role), port) in enumerate(zip(roles, ports, strict=True))
        ),
        profile=profile if calibration is None else f"calibration:{calibration}",
        tokenizer=EMULATOR_TOKENIZER,
        time_scale=time_scale,
        pgids=tuple(p.pid for p, _ in procs),
        logs=tuple(str(log) for _, log in procs),
    )
    return LaunchedCluster(file, [p for p, _ in procs])


def _kv_bytes_per_token(model_dir: Path) -> int:
    try:
        cfg = json.loads((model_dir / "config.json").read_text())
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        return int(2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * 4)
    except (OSError, KeyError, ValueError):
        return _TINY_KV_BYTES_PER_TOKEN_DEFAULT


def up_vllm(
    prefill: int,
    decode: int,
    log_dir: Path,
    repo_root: Path,
    kv_cache_bytes: int = 64 * 1024 * 1024,
    max_model_len: int = 2048,
    kv_lease_s: float | None = None,
    kv_load_failure_policy: str = "fail",
    timeout_s: float = 240.0,
    kv_events: bool = False,
) -> LaunchedCluster:
    """``kv_events``: every engine publishes vLLM's KV events on a unix socket in ``log_dir`` (vLLM binds
    only those or every interface), written into the cluster file (kv_events_endpoint) for the proxy, which
    translates vLLM's block hashes into its own (contract/blocks.py)."""
    venv, model_dir = vllm.default_vllm_paths(repo_root)
    if not vllm.vllm_available(venv, model_dir):
        raise ConfigError(f"real vLLM is not installed in {venv}: run `make vllm` first")
    roles = _roles(prefill, decode)
    started: list[vllm.VllmEngine] = []
    ports = free_ports(2 * len(roles))  # HTTP and NIXL side channel for each engine, all distinct
    events = {name: vllm.kv_events_endpoint(log_dir, name) for name, _ in roles} if kv_events else {}
    try:
        for i, (name, role) in enumerate(roles):
            cfg = vllm.VllmEngineConfig(
                port=ports[2 * i],
                role=role,
                side_channel_port=ports[2 * i + 1],
                kv_cache_bytes=kv_cache_bytes,
                max_model_len=max_model_len,
                kv_lease_s=kv_lease_s,
                kv_load_failure_policy=kv_load_failure_policy,
                kv_events_endpoint=events.get(name),
            )
            started.append(vllm.start_vllm_engine(cfg, venv, model_dir, log_dir))
        vllm.wait_ready(started, timeout_s)
    except BaseException:
        for e in started:
            vllm.stop(e)
        raise
    kv_tokens = kv_cache_bytes // _kv_bytes_per_token(model_dir)
    file = ClusterFile(
        kind="vllm",
        model="tiny",
        max_model_len=max_model_len,
        engines=tuple(
            ClusterEngine(name, role, e.url, kv_tokens, events.get(name))
            for (name, role), e in zip(roles, started, strict=True)
        ),
        pgids=tuple(e.pgid for e in started),
        logs=tuple(str(e.log_path) for e in started),
        block_tokens=vllm.CPU_DEFAULT_BLOCK_TOKENS,  # the engines run with vLLM's CPU default
        tokenizer=str(model_dir.absolute()),  # the tiny model's own tokenizer files
    )
    return LaunchedCluster(file, [e.popen for e in started])


def down(cluster: ClusterFile) -> None:
    for pgid in cluster.pgids:
        stop_process_group(pgid)
