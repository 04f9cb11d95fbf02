"""Launcher for real vLLM engines (the CPU build that ``make vllm`` installs) serving the tiny local model.

Engines start in their own process group and are stopped as a group: killing only the API server would leave
its EngineCore and worker alive (and, with NIXL, still serving KV reads).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from calroute.cluster.procs import (
    process_group_alive,
    spread_group_threads,
    start_process_group,
    stop_process_group,
    wait_http_ready,
)
from calroute.errors import ConfigError
from calroute.types import Role

MIB = 1024 * 1024
# The CPU attention backend only accepts block sizes that are multiples of 32 (its default is 128).
CPU_BLOCK_MULTIPLE = 32
CPU_DEFAULT_BLOCK_TOKENS = 128  # vLLM's KV block size on CPU when --block-size is not given
KV_LOAD_FAILURE_POLICIES = ("fail", "recompute")
# The longest path a unix socket (an ipc:// endpoint) may have on Linux, less its NUL.
_MAX_IPC_PATH_BYTES = 107
VLLM_VENV_DIRNAME = ".venv-vllm"
TINY_MODEL_DIRNAME = "tiny-model"
_COMPLETE_MARKER = ".complete"


@dataclass(frozen=True)
class VllmEngineConfig:
    """One real vLLM engine. ``side_channel_port`` (NIXL's handshake port) must be unique per engine."""

    port: int
    role: Role
    served_model_name: str = "tiny"
    side_channel_port: int | None = None
    kv_cache_bytes: int = 64 * MIB
    max_model_len: int = 2048
    max_num_seqs: int = 16
    block_size: int | None = None
    kv_lease_s: float | None = None
    kv_load_failure_policy: str = "fail"
    nixl: bool = True
    # Where the engine publishes its KV events (vLLM's --kv-events-config endpoint); None: no events.
    kv_events_endpoint: str | None = None
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        try:
            # A plain "prefill"/"decode" string is stored as the enum that the rest of the code compares.
            object.__setattr__(self, "role", Role(self.role))
        except ValueError:
            raise ConfigError(f"role must be prefill or decode, got {self.role!r}") from None
        if self.kv_cache_bytes <= 0:
            raise ConfigError(f"kv_cache_bytes must be positive, got {self.kv_cache_bytes}")
        if self.block_size is not None and (self.block_size <= 0 or self.block_size % CPU_BLOCK_MULTIPLE):
            raise ConfigError(
                f"block_size must be a positive multiple of {CPU_BLOCK_MULTIPLE} on CPU: {self.block_size}"
            )
        if self.kv_lease_s is not None and (self.kv_lease_s <= 0 or not float(self.kv_lease_s).is_integer()):
            # vLLM reads kv_lease_duration as whole seconds (and heartbeats every lease // 6 s).
            raise ConfigError(f"kv_lease_s must be a positive whole number of seconds, got {self.kv_lease_s}")
        if self.kv_load_failure_policy not in KV_LOAD_FAILURE_POLICIES:
            raise ConfigError(
                f"kv_load_failure_policy must be one of {KV_LOAD_FAILURE_POLICIES}, "
                f"got {self.kv_load_failure_policy!r}"
            )
        if self.kv_events_endpoint is not None:
            check_kv_events_endpoint(self.kv_events_endpoint)
        if self.nixl and self.side_channel_port is None:
            # vLLM's default side-channel port would collide as soon as a second NIXL engine starts.
            raise ConfigError("a NIXL engine needs its own side_channel_port")


@dataclass(frozen=True)
class VllmEngine:
    """A started engine: ``pgid`` is its process group, ``url`` its base URL (no trailing slash)."""

    cfg: VllmEngineConfig
    url: str
    pgid: int
    log_path: Path
    popen: subprocess.Popen[bytes]


def check_kv_events_endpoint(endpoint: str) -> None:
    """vLLM's publisher binds only an ipc:// (or inproc://) endpoint or a wildcard one (tcp://*:PORT, every
    interface) and connects to any other, expecting the subscriber to bind; the proxy's subscriber connects,
    so the engine must bind. Servers here bind loopback only: an engine's events go on a unix socket."""
    if not endpoint.startswith("ipc://"):
        raise ConfigError(f"kv_events_endpoint must be an ipc:// endpoint (vLLM binds it), got {endpoint!r}")
    if len(endpoint.removeprefix("ipc://").encode()) > _MAX_IPC_PATH_BYTES:
        raise ConfigError(
            f"kv_events_endpoint's path is longer than a unix socket allows ({_MAX_IPC_PATH_BYTES} bytes): "
            f"{endpoint!r}"
        )


def kv_events_endpoint(directory: Path, name: str) -> str:
    """An engine's KV-event endpoint: a unix socket in ``directory`` (see check_kv_events_endpoint)."""
    return f"ipc://{directory.absolute() / f'kv-events-{name}.sock'}"


def default_vllm_paths(repo_root: Path) -> tuple[Path, Path]:
    """(venv, model dir) where ``make vllm`` puts them."""
    venv = repo_root / VLLM_VENV_DIRNAME
    return venv, venv / TINY_MODEL_DIRNAME


def vllm_available(venv: Path, model_dir: Path) -> bool:
    """True when ``make vllm`` completed for ``venv`` and the model is in place."""
    return (
        (venv / _COMPLETE_MARKER).is_file()
        and (venv / "bin" / "python").exists()
        and (model_dir / "config.json").is_file()
    )


def _kv_transfer_config(cfg: VllmEngineConfig) -> str:
    transfer: dict[str, object] = {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_producer" if cfg.role is Role.PREFILL else "kv_consumer",
        "kv_buffer_device": "cpu",
        "kv_load_failure_policy": cfg.kv_load_failure_policy,
    }
    if cfg.kv_lease_s is not None:
        transfer["kv_connector_extra_config"] = {"kv_lease_duration": int(cfg.kv_lease_s)}
    return json.dumps(transfer, separators=(",", ":"))


def vllm_command(cfg: VllmEngineConfig, venv: Path, model_dir: Path) -> tuple[list[str], dict[str, str]]:
    """The argv and the environment additions that start ``cfg`` (pure: nothing is checked or run)."""
    env = {
        # Several engines share 2 cores: the default binding pins every engine's worker to core 0.
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": "1",
        # Enables /reset_prefix_cache, which tests use to start from a cold cache.
        "VLLM_SERVER_DEV_MODE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    argv = [
        str(venv.absolute() / "bin" / "python"),
        # The `vllm` console script fails for the vllm-cpu distribution (no metadata named "vllm").
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir.absolute()),
        "--served-model-name",
        cfg.served_model_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(cfg.port),
        # float32 keeps greedy output bit-identical across engines; bfloat16 diverges after a dozen tokens.
        "--dtype",
        "float32",
        "--max-model-len",
        str(cfg.max_model_len),
        "--max-num-seqs",
        str(cfg.max_num_seqs),
        # Without an explicit size the CPU worker claims most of the machine's RAM for KV.
        "--kv-cache-memory-bytes",
        str(cfg.kv_cache_bytes),
        "--enforce-eager",
        "--seed",
        "0",
        # usage.prompt_tokens_details.cached_tokens: what the prefill engine served from its prefix cache,
        # which the proxy records (docs/prefix.md)
        "--enable-prompt-tokens-details",
    ]
    if cfg.block_size is not None:
        argv += ["--block-size", str(cfg.block_size)]
    if cfg.kv_events_endpoint is not None:
        # Each step's cached and evicted blocks, for the proxy's precise prefix index (docs/prefix.md).
        events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": cfg.kv_events_endpoint}
        argv += ["--kv-events-config", json.dumps(events, separators=(",", ":"))]
    if cfg.nixl:
        argv += ["--kv-transfer-config", _kv_transfer_config(cfg)]
        env |= {
            # Read by the shim make vllm installs: NIXL's progress thread would otherwise spin a whole core.
            "NIXL_PTHR_DELAY_US": "1000",
            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(cfg.side_channel_port),
            "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
        }
    argv += list(cfg.extra_args)
    return argv, env


def start_vllm_engine(cfg: VllmEngineConfig, venv: Path, model_dir: Path, log_dir: Path) -> VllmEngine:
    """Start one engine in its own process group and return at once (see ``wait_ready``)."""
    argv, env_additions = vllm_command(cfg, venv, model_dir)
    log_path = log_dir / f"vllm-{cfg.role.value}-{cfg.port}.log"
    popen = start_process_group(argv, {**os.environ, **env_additions}, log_path)
    return VllmEngine(
        cfg=cfg, url=f"http://127.0.0.1:{cfg.port}", pgid=popen.pid, log_path=log_path, popen=popen
    )


def wait_ready(engines: Sequence[VllmEngine], timeout_s: float = 180.0) -> None:
    """Wait until every engine's /health answers 200, all within one deadline (they load in parallel).

    Raises EngineStartError, with the tail of the failing engine's log; the caller stops the engines.
    """
    deadline = time.monotonic() + timeout_s
    for engine in engines:
        wait_http_ready(
            f"{engine.url}/health",
            max(0.0, deadline - time.monotonic()),
            proc=engine.popen,
            log_path=engine.log_path,
        )
    for engine in engines:
        unpin(engine)


def unpin(engine: VllmEngine) -> int:
    """Undo the core reservation of vLLM's CPU NixlConnector: let all of the engine's threads use every core
    this process may use. Returns how many threads were pinned.

    On CPU, the NIXL worker pins its model thread to the last core of each NUMA node (reserving it for KV
    loads). On one machine that puts every engine's model thread on the same core, where the two idle
    workers' spin-waits (sched_yield) starve each other: back-to-back handoffs on a 1P+1D cluster then
    stalled for up to the 30 s KV lease, and prefills took ~1 s, in every run; unpinned, none did (3 runs
    each, 40 handoffs per run). The pin is set while the engine loads, so it is done by the time /health
    answers.
    """
    return spread_group_threads(engine.pgid, os.sched_getaffinity(0))


def stop(engine: VllmEngine, timeout_s: float = 20.0) -> None:
    """Stop the engine's whole process group and reap its leader; a stopped engine is fine."""
    try:
        stop_process_group(engine.pgid, timeout_s)
    finally:
        if engine.popen.poll() is None:
            engine.popen.wait(timeout=5.0)


def engine_alive(engine: VllmEngine) -> bool:
    return process_group_alive(engine.pgid)
