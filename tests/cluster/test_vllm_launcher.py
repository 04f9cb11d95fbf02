"""The real-vLLM launcher: its command line, the process-group helpers, and one real engine end to end."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from calroute.cluster.procs import (
    EngineStartError,
    free_port,
    free_ports,
    process_group_alive,
    spread_group_threads,
    start_process_group,
    stop_process_group,
    wait_http_ready,
)
from calroute.cluster.vllm import (
    MIB,
    VllmEngineConfig,
    default_vllm_paths,
    kv_events_endpoint,
    start_vllm_engine,
    stop,
    vllm_available,
    vllm_command,
    wait_ready,
)
from calroute.errors import CalrouteError, ConfigError
from calroute.types import Role

REPO_ROOT = Path(__file__).resolve().parents[2]
# Paths for the pure command-line tests only: nothing is run from them.
FAKE_VENV = Path("/opt/venv-vllm")
FAKE_MODEL = Path("/opt/venv-vllm/tiny-model")


def flag(argv: list[str], name: str) -> str:
    """The value that follows ``name`` in ``argv`` (the flag must appear exactly once)."""
    assert argv.count(name) == 1, f"{name} appears {argv.count(name)} times in {argv}"
    return argv[argv.index(name) + 1]


def transfer_config(argv: list[str]) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(flag(argv, "--kv-transfer-config"))
    return parsed


# --- the command line (pure) ---


def test_prefill_command_has_the_cpu_flags_and_env() -> None:
    cfg = VllmEngineConfig(port=8101, role=Role.PREFILL, side_channel_port=5601)
    argv, env = vllm_command(cfg, FAKE_VENV, FAKE_MODEL)

    assert argv[:3] == [str(FAKE_VENV / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server"]
    assert flag(argv, "--model") == str(FAKE_MODEL)
    assert flag(argv, "--served-model-name") == "tiny"
    assert flag(argv, "--host") == "127.0.0.1"
    assert flag(argv, "--port") == "8101"
    assert flag(argv, "--dtype") == "float32"
    assert flag(argv, "--max-model-len") == "2048"
    assert flag(argv, "--max-num-seqs") == "16"
    assert flag(argv, "--kv-cache-memory-bytes") == str(64 * MIB)
    assert flag(argv, "--seed") == "0"
    assert "--enforce-eager" in argv
    assert "--block-size" not in argv
    assert "--kv-events-config" not in argv
    assert transfer_config(argv) == {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_producer",
        "kv_buffer_device": "cpu",
        "kv_load_failure_policy": "fail",
    }
    assert env == {
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": "1",
        "VLLM_SERVER_DEV_MODE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "NIXL_PTHR_DELAY_US": "1000",
        "VLLM_NIXL_SIDE_CHANNEL_PORT": "5601",
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
    }


def test_decode_command_carries_lease_and_failure_policy() -> None:
    cfg = VllmEngineConfig(
        port=8102,
        role=Role.DECODE,
        served_model_name="m",
        side_channel_port=5602,
        kv_cache_bytes=2 * MIB,
        max_model_len=512,
        max_num_seqs=4,
        block_size=32,
        kv_lease_s=10,
        kv_load_failure_policy="recompute",
        extra_args=("--max-logprobs", "5"),
    )
    argv, env = vllm_command(cfg, FAKE_VENV, FAKE_MODEL)

    assert transfer_config(argv) == {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_consumer",
        "kv_buffer_device": "cpu",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"kv_lease_duration": 10},
    }
    assert flag(argv, "--served-model-name") == "m"
    assert flag(argv, "--kv-cache-memory-bytes") == str(2 * MIB)
    assert flag(argv, "--max-model-len") == "512"
    assert flag(argv, "--max-num-seqs") == "4"
    assert flag(argv, "--block-size") == "32"
    assert argv[-2:] == ["--max-logprobs", "5"]
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5602"


def test_lease_is_whole_seconds_in_the_json() -> None:
    cfg = VllmEngineConfig(port=1, role=Role.PREFILL, side_channel_port=2, kv_lease_s=12.0)
    argv, _ = vllm_command(cfg, FAKE_VENV, FAKE_MODEL)
    assert transfer_config(argv)["kv_connector_extra_config"] == {"kv_lease_duration": 12}
    assert '"kv_lease_duration":12}' in flag(argv, "--kv-transfer-config")


def test_kv_events_are_published_on_the_engines_unix_socket(tmp_path: Path) -> None:
    endpoint = kv_events_endpoint(tmp_path, "prefill-0")
    assert endpoint == f"ipc://{tmp_path / 'kv-events-prefill-0.sock'}"
    cfg = VllmEngineConfig(port=1, role=Role.PREFILL, side_channel_port=2, kv_events_endpoint=endpoint)
    argv, _ = vllm_command(cfg, FAKE_VENV, FAKE_MODEL)
    # vLLM's KVEventsConfig keys; an ipc endpoint is one vLLM's publisher binds (it connects to a tcp
    # endpoint without a wildcard)
    assert json.loads(flag(argv, "--kv-events-config")) == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": endpoint,
    }


def test_role_given_as_a_string_is_the_enum() -> None:
    cfg = VllmEngineConfig(port=1, role="decode", side_channel_port=2)  # type: ignore[arg-type]
    assert cfg.role is Role.DECODE
    assert transfer_config(vllm_command(cfg, FAKE_VENV, FAKE_MODEL)[0])["kv_role"] == "kv_consumer"


def test_plain_engine_has_no_nixl() -> None:
    argv, env = vllm_command(VllmEngineConfig(port=8103, role=Role.DECODE, nixl=False), FAKE_VENV, FAKE_MODEL)
    assert "--kv-transfer-config" not in argv
    assert not any(key.startswith(("NIXL_", "VLLM_NIXL_")) for key in env)


def test_relative_paths_become_absolute() -> None:
    argv, _ = vllm_command(VllmEngineConfig(port=1, role=Role.DECODE, nixl=False), Path("v"), Path("m"))
    assert argv[0] == str(Path.cwd() / "v" / "bin" / "python")
    assert flag(argv, "--model") == str(Path.cwd() / "m")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"block_size": 16},
        {"block_size": 0},
        {"kv_cache_bytes": 0},
        {"kv_lease_s": 0.0},
        {"kv_lease_s": 2.5},
        {"kv_load_failure_policy": "retry"},
        {"side_channel_port": None},
        {"role": "router"},
        {"kv_events_endpoint": "tcp://127.0.0.1:5557"},  # vLLM would connect, not bind
        {"kv_events_endpoint": "tcp://*:5557"},  # every interface
        {"kv_events_endpoint": "ipc:///" + "x" * 120},  # past a unix socket's path limit
    ],
)
def test_bad_configs_are_refused(kwargs: dict[str, Any]) -> None:
    base: dict[str, Any] = {"port": 8100, "role": Role.PREFILL, "side_channel_port": 5600}
    with pytest.raises(ConfigError):
        VllmEngineConfig(**{**base, **kwargs})


def test_paths_and_availability(tmp_path: Path) -> None:
    venv, model = default_vllm_paths(tmp_path)
    assert (venv, model) == (tmp_path / ".venv-vllm", tmp_path / ".venv-vllm" / "tiny-model")
    assert not vllm_available(venv, model)
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert not vllm_available(venv, model)  # no completion marker yet
    (venv / ".complete").touch()
    assert vllm_available(venv, model)


# --- process groups, with small stand-in processes ---


def pid_running(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts; whatever is left of their groups is killed and reaped afterwards."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield procs
    finally:
        for proc in procs:
            stop_process_group(proc.pid, timeout_s=2.0)
            proc.wait(timeout=5.0)


def http_server_argv(port: int, directory: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "http.server",
        str(port),
        "--bind",
        "127.0.0.1",
        "--directory",
        str(directory),
    ]


def test_start_wait_and_stop_a_server(tmp_path: Path, started: list[subprocess.Popen[bytes]]) -> None:
    port = free_port()
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "hello.txt").write_text("hi")
    log = tmp_path / "logs" / "server.log"
    proc = start_process_group(http_server_argv(port, tmp_path / "www"), None, log)
    started.append(proc)

    assert os.getpgid(proc.pid) == proc.pid != os.getpgrp()
    wait_http_ready(f"http://127.0.0.1:{port}/hello.txt", 20.0, proc, log)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/hello.txt", timeout=5) as resp:
        assert resp.read() == b"hi"
    assert process_group_alive(proc.pid)

    stop_process_group(proc.pid, timeout_s=5.0)
    assert not process_group_alive(proc.pid)
    assert proc.wait(timeout=5.0) is not None
    assert "GET /hello.txt" in log.read_text()  # the server's own log went to the file
    stop_process_group(proc.pid)  # a second stop of a gone group is fine


def test_stop_kills_the_whole_group(tmp_path: Path, started: list[subprocess.Popen[bytes]]) -> None:
    port = free_port()
    pid_file = tmp_path / "sleep.pid"
    script = f'sleep 1000 & echo $! > "{pid_file}"; exec {" ".join(http_server_argv(port, tmp_path))}'
    proc = start_process_group(["/bin/sh", "-c", script], None, tmp_path / "group.log")
    started.append(proc)
    wait_http_ready(f"http://127.0.0.1:{port}/", 20.0, proc, tmp_path / "group.log")
    sleep_pid = int(pid_file.read_text())
    assert pid_running(sleep_pid)
    assert os.getpgid(sleep_pid) == proc.pid

    stop_process_group(proc.pid, timeout_s=5.0)
    proc.wait(timeout=5.0)
    assert not pid_running(sleep_pid)
    assert not process_group_alive(proc.pid)


def start_python_group(
    code: str, ready: str, log: Path, started: list[subprocess.Popen[bytes]]
) -> subprocess.Popen[bytes]:
    """Run ``code`` in a process group of its own; return once it has printed ``ready`` (or after 10 s)."""
    proc = start_process_group(
        [sys.executable, "-c", f"{code}\nprint({ready!r}, flush=True)\ntime.sleep(1000)"], None, log
    )
    started.append(proc)
    deadline_s = time.monotonic() + 10.0
    while ready not in log.read_text() and time.monotonic() < deadline_s:
        time.sleep(0.05)
    return proc


def test_term_ignoring_group_is_killed(tmp_path: Path, started: list[subprocess.Popen[bytes]]) -> None:
    code = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)"
    proc = start_python_group(code, "up", tmp_path / "stubborn.log", started)

    t0_s = time.monotonic()
    stop_process_group(proc.pid, timeout_s=0.5)
    assert 0.4 < time.monotonic() - t0_s < 5.0
    assert proc.wait(timeout=5.0) == -9


def test_early_exit_raises_with_log_tail(tmp_path: Path, started: list[subprocess.Popen[bytes]]) -> None:
    log = tmp_path / "crash.log"
    code = "import sys\nfor i in range(40): print('line', i)\nprint('fatal: no model here')\nsys.exit(3)"
    proc = start_process_group([sys.executable, "-c", code], None, log)
    started.append(proc)
    with pytest.raises(EngineStartError) as info:
        wait_http_ready(f"http://127.0.0.1:{free_port()}/health", 20.0, proc, log)
    message = str(info.value)
    assert "exited with code 3" in message
    assert "fatal: no model here" in message
    assert "line 39" in message and "line 10" not in message  # only the tail
    assert isinstance(info.value, CalrouteError)


def test_timeout_raises_with_log_tail(tmp_path: Path, started: list[subprocess.Popen[bytes]]) -> None:
    log = tmp_path / "slow.log"
    code = "import time; print('still loading weights', flush=True); time.sleep(1000)"
    proc = start_process_group([sys.executable, "-c", code], None, log)
    started.append(proc)
    t0_s = time.monotonic()
    with pytest.raises(EngineStartError, match="not ready after") as info:
        wait_http_ready(f"http://127.0.0.1:{free_port()}/health", 1.0, proc, log)
    assert time.monotonic() - t0_s < 5.0
    assert "still loading weights" in str(info.value)


def _group_affinities(pgid: int) -> list[set[int]]:
    affinities = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.getpgid(int(entry.name)) == pgid:
                affinities += [os.sched_getaffinity(int(task.name)) for task in (entry / "task").iterdir()]
        except OSError:
            continue  # exited while we looked
    return affinities


def test_spread_group_threads_undoes_a_pin(tmp_path: Path, started: list[subprocess.Popen[bytes]]) -> None:
    # Like vLLM's CPU NIXL worker: a thread pins itself to the last core after other threads started.
    cpus = os.sched_getaffinity(0)
    code = (
        "import os, threading, time\n"
        "threading.Thread(target=time.sleep, args=(1000,), daemon=True).start()\n"
        f"os.sched_setaffinity(0, {{{max(cpus)}}})"
    )
    proc = start_python_group(code, "pinned", tmp_path / "pinned.log", started)
    assert {max(cpus)} in _group_affinities(proc.pid)

    changed = spread_group_threads(proc.pid, cpus)
    assert changed == (1 if len(cpus) > 1 else 0)  # only the main thread was pinned
    assert all(a == cpus for a in _group_affinities(proc.pid))
    assert spread_group_threads(proc.pid, cpus) == 0  # idempotent
    stop_process_group(proc.pid, timeout_s=5.0)


def test_refuses_to_stop_our_own_group() -> None:
    with pytest.raises(ValueError):
        stop_process_group(os.getpgrp())
    with pytest.raises(ValueError):
        stop_process_group(0)


def test_free_port_is_bindable() -> None:
    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_free_ports_are_distinct_and_outside_the_ephemeral_range() -> None:
    # A port from the ephemeral range can be taken by any outgoing connection while vLLM loads.
    lo_s, hi_s = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    ports = free_ports(40)
    assert len(set(ports)) == 40
    assert all(not int(lo_s) <= p <= int(hi_s) for p in ports)
    assert free_ports(0) == []
    with pytest.raises(ValueError):
        free_ports(-1)


class _Scripted(random.Random):
    """Offers the given ports in order, then whatever the base generator picks."""

    def __init__(self, first: list[int]) -> None:
        super().__init__(0)
        self._first = list(first)

    def randint(self, a: int, b: int) -> int:
        return self._first.pop(0) if self._first else super().randint(a, b)


def test_free_ports_skips_a_port_in_use_and_repeats() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", free_port()))
        held.listen()
        taken = held.getsockname()[1]
        spare = free_port()
        ports = free_ports(2, _Scripted([taken, spare, spare]))
    assert ports[0] == spare
    assert taken not in ports and len(set(ports)) == 2


# --- one real engine ---


@pytest.mark.slow
def test_real_vllm_engine_serves_and_stops(tmp_path: Path) -> None:
    venv, model = default_vllm_paths(REPO_ROOT)
    if not vllm_available(venv, model):
        pytest.fail(f"the real-vLLM venv is not built ({venv}, {model}): run `make vllm` first")
    # A NIXL prefill engine: exercises the NIXL install and the progress-thread shim, not only plain vLLM.
    http_port, side_channel_port = free_ports(2)
    cfg = VllmEngineConfig(port=http_port, role=Role.PREFILL, side_channel_port=side_channel_port)
    t0_s = time.monotonic()
    engine = start_vllm_engine(cfg, venv, model, tmp_path)
    try:
        wait_ready([engine], timeout_s=180.0)
        print(f"engine ready in {time.monotonic() - t0_s:.1f} s")
        # NIXL's worker pins its model thread to the last core; wait_ready lets it use every core again.
        assert all(a == os.sched_getaffinity(0) for a in _group_affinities(engine.pgid))
        with urllib.request.urlopen(f"{engine.url}/v1/models", timeout=10) as resp:
            models = json.load(resp)
        assert [m["id"] for m in models["data"]] == ["tiny"]

        body = {"model": "tiny", "prompt": "def f(x):", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
        request = urllib.request.Request(
            f"{engine.url}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as resp:
            completion = json.load(resp)
        assert completion["usage"]["completion_tokens"] == 8
    finally:
        stop(engine)
    assert not process_group_alive(engine.pgid)
    assert engine.popen.returncode is not None
