"""The processes under test: the emulated cluster, calroute, vllm-router (installed on demand)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.overhead.client import Salts, Target
from benchmarks.overhead.cpu import CpuMeter
from benchmarks.overhead.method import BENCH_VENV, REPO, VLLM_ROUTER_VERSION
from calroute.cluster.launch import LaunchedCluster
from calroute.cluster.procs import (
    free_port,
    start_process_group,
    stop_process_group,
    wait_http_ready,
)


def ensure_vllm_router(log: Path) -> tuple[Path | None, str]:
    """(path of the vllm-router executable, note); None when it is not installed and cannot be. The note goes
    into the report: it names the venv relative to the repository and the log by its name in the log dir."""
    venv = BENCH_VENV.relative_to(REPO)
    exe = BENCH_VENV / "bin" / "vllm-router"
    py = BENCH_VENV / "bin" / "python"

    def installed() -> bool:
        if not exe.exists():
            return False
        r = subprocess.run(
            [str(py), "-c", "import importlib.metadata as m; print(m.version('vllm-router'))"],
            capture_output=True,
            text=True,
        )
        return r.returncode == 0 and r.stdout.strip() == VLLM_ROUTER_VERSION

    if installed():
        return exe, f"vllm-router {VLLM_ROUTER_VERSION} from {venv}"
    print(f"installing vllm-router=={VLLM_ROUTER_VERSION} into {BENCH_VENV} ...", file=sys.stderr, flush=True)
    pip = [str(py), "-m", "pip", "install", "--quiet", f"vllm-router=={VLLM_ROUTER_VERSION}"]
    steps = {  # what the note says of a step (the venv relative to the repository): its argv
        f"python -m venv --clear {venv}": [sys.executable, "-m", "venv", "--clear", str(BENCH_VENV)],
        f"pip install vllm-router=={VLLM_ROUTER_VERSION}": pip,
    }
    with log.open("ab") as f:
        for step, argv in steps.items():
            try:
                r = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, timeout=600)
            except (OSError, subprocess.TimeoutExpired) as e:
                return None, f"vllm-router NOT MEASURED, not installed ({step}: {e})"
            if r.returncode != 0:
                return None, f"vllm-router not installed: `{step}` exited {r.returncode} (see {log.name})"
    if not installed():
        return (
            None,
            f"vllm-router NOT MEASURED, not installed: {exe.relative_to(REPO)} missing or the wrong version "
            "after pip install",
        )
    return exe, f"vllm-router {VLLM_ROUTER_VERSION} installed into {venv}"


@dataclass
class Bench:
    cluster: LaunchedCluster
    cluster_path: Path
    log_dir: Path
    router_exe: Path | None
    calroute_policy: str
    salts: Salts = field(default_factory=Salts)
    starts: int = 0

    @contextlib.contextmanager
    def serving(self, mode: str) -> Iterator[Target]:
        """The mode's target, with its proxy (if any) running for the duration of the block."""
        c = self.cluster.file
        if mode == "direct":
            yield Target(mode, prefill=[e.url for e in c.prefill], decode=[e.url for e in c.decode])
            return
        port = free_port()
        self.starts += 1
        log = self.log_dir / f"{mode}-{self.starts}.log"
        if mode == "calroute":
            argv = [sys.executable, "-m", "calroute", "serve", "--cluster", str(self.cluster_path)]
            argv += ["--policy", self.calroute_policy, "--port", str(port)]
        else:
            assert self.router_exe is not None
            argv = [
                str(self.router_exe),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--vllm-pd-disaggregation",
            ]
            for e in c.prefill:
                argv += ["--prefill", e.url]
            for e in c.decode:
                argv += ["--decode", e.url]
            argv += ["--policy", "round_robin", "--prometheus-host", "127.0.0.1"]
            argv += ["--prometheus-port", str(free_port()), "--worker-startup-check-interval", "1"]
        env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
        proc = start_process_group(argv, env, log)
        try:
            wait_http_ready(f"http://127.0.0.1:{port}/health", 60.0, proc=proc, log_path=log)
            yield Target(mode, url=f"http://127.0.0.1:{port}", pgid=proc.pid)
        finally:
            stop_process_group(proc.pid)
            proc.wait(timeout=10)

    def meter(self, target: Target) -> CpuMeter:
        return CpuMeter(self.cluster.file.pgids, target.pgid)

    def handoff_warnings(self) -> int:
        """Failed or unrecognised KV handoffs the engines and proxies logged so far."""
        needles = ("invalid KVTransferParams", "potentially invalid KV blocks", "No kv_transfer_params")
        n = 0
        for log in [*(Path(p) for p in self.cluster.file.logs), *self.log_dir.glob("vllm-router-*.log")]:
            try:
                text = log.read_text(errors="replace")
            except OSError:
                continue
            n += sum(text.count(s) for s in needles)
        return n


def source_fingerprint() -> str:
    """A hash of calroute's sources: others edit the tree while benchmarks run, so say which code ran."""
    h = hashlib.sha256()
    for f in sorted((REPO / "src" / "calroute").rglob("*.py")):
        h.update(f.relative_to(REPO).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]
