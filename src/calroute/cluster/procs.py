"""Process-group helpers shared by every engine launcher: start in a new session, wait for HTTP, stop.

An engine is a tree of processes (vLLM: API server, EngineCore, worker), so it is always stopped as a group.
"""

from __future__ import annotations

import http.client
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from types import FrameType

from calroute.errors import CalrouteError

_POLL_S = 0.25
_LOG_TAIL_LINES = 20
_LOG_TAIL_BYTES = 64 * 1024


class EngineStartError(CalrouteError):
    """An engine process exited, or did not answer, before it was ready."""


class EngineStopError(CalrouteError):
    """An engine's process group could not be stopped."""


def start_process_group(
    argv: list[str], env: Mapping[str, str] | None, log_path: Path, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start ``argv`` as the leader of a new session (its pid is the group id), output to ``log_path``.

    ``env`` is the whole environment of the child; ``None`` inherits ours.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # The child keeps its own copy of the descriptor, so ours can be closed at once.
    with log_path.open("wb") as log:
        return subprocess.Popen(
            argv,
            env=None if env is None else dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _group_members(pgid: int) -> list[tuple[int, str]] | None:
    """(pid, state) of every process in the group, from /proc; None where /proc is not available."""
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    members: list[tuple[int, str]] = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited while we were scanning
        # The command name is in parentheses and may itself contain spaces or parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid:
            members.append((int(entry.name), fields[0]))
    return members


def spread_group_threads(pgid: int, cpus: set[int]) -> int:
    """Let every thread of every process in the group run on ``cpus``; returns how many threads changed.

    Threads that exit while we walk the group are skipped; so is a machine without /proc (nothing to do).
    """
    members = _group_members(pgid) or []
    changed = 0
    for pid, _ in members:
        try:
            tids = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
        except OSError:
            continue
        for tid in tids:
            try:
                if os.sched_getaffinity(tid) != cpus:
                    os.sched_setaffinity(tid, cpus)
                    changed += 1
            except OSError:
                continue
    return changed


def process_group_alive(pgid: int) -> bool:
    """True while any process of the group is running; zombies (exited, not yet reaped) do not count."""
    members = _group_members(pgid)
    if members is not None:
        return any(state not in ("Z", "X") for _, state in members)
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Send ``sig`` to the group; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def _wait_group_gone(pgid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while process_group_alive(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    return True


def stop_on_sigterm() -> None:
    """From now on, handle SIGTERM as Ctrl-C, so that ``finally`` blocks stop what the process started.

    A scheduler, a CI timeout or ``kill`` stops a job with SIGTERM, whose default action skips every
    ``finally`` and leaves the engines and proxies the job started running in their own process groups.
    Handled as Ctrl-C instead (asyncio's runner cancels its main task on SIGINT), the job stops them. A job
    started with ``&`` from a script has SIGINT ignored, so SIGINT's default handler comes back first.
    """
    signal.signal(signal.SIGTERM, _terminate_as_interrupt)


def run_script(main: Callable[[], None]) -> None:
    """Run a script's ``main`` with SIGTERM handled as Ctrl-C (stop_on_sigterm). An interruption ends it with
    one line and status 130, as a shell reports Ctrl-C: its ``finally`` blocks have already stopped what it
    started, and a traceback through the event loop would only hide that."""
    stop_on_sigterm()
    try:
        main()
    except KeyboardInterrupt:
        print("interrupted: the engines and proxies it started are stopped", file=sys.stderr, flush=True)
        raise SystemExit(130) from None


def _terminate_as_interrupt(signum: int, frame: FrameType | None) -> None:
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.raise_signal(signal.SIGINT)


def stop_process_group(pgid: int, timeout_s: float = 10.0) -> None:
    """SIGTERM the group, wait up to ``timeout_s`` for it to exit, then SIGKILL what is left.

    A group that is already gone is fine. Refuses our own group and pgid <= 1 (which would signal more than
    one engine). The caller still owns reaping its direct child (``Popen.wait``).
    """
    if pgid <= 1 or pgid == os.getpgrp():
        raise ValueError(f"refusing to stop process group {pgid}: it is not an engine's own group")
    if not process_group_alive(pgid) or not _signal_group(pgid, signal.SIGTERM):
        return
    if _wait_group_gone(pgid, timeout_s):
        return
    _signal_group(pgid, signal.SIGKILL)
    # SIGKILL cannot be ignored; the wait only covers the kernel tearing the processes down.
    if not _wait_group_gone(pgid, 5.0):
        raise EngineStopError(f"process group {pgid} survived SIGKILL")


def log_tail(log_path: Path | None, lines: int = _LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file, or a note saying why there are none."""
    if log_path is None:
        return "(no log)"
    try:
        with log_path.open("rb") as f:
            size_bytes = f.seek(0, os.SEEK_END)
            f.seek(max(0, size_bytes - _LOG_TAIL_BYTES))
            text = f.read().decode("utf-8", errors="replace")
    except OSError as e:
        return f"(log {log_path} unreadable: {e})"
    tail = text.splitlines()[-lines:]
    return "\n".join(tail) if tail else f"(log {log_path} is empty)"


def _start_failure(message: str, log_path: Path | None) -> EngineStartError:
    where = f" (log: {log_path})" if log_path is not None else ""
    return EngineStartError(f"{message}{where}; last lines of the log:\n{log_tail(log_path)}")


def wait_http_ready(
    url: str,
    timeout_s: float,
    proc: subprocess.Popen[bytes] | None = None,
    log_path: Path | None = None,
) -> None:
    """Poll GET ``url`` until it answers 200; EngineStartError if ``proc`` exits first or time runs out."""
    # An HTTP proxy from the environment must never see requests meant for a local engine.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + timeout_s
    while True:
        if proc is not None and proc.poll() is not None:
            raise _start_failure(
                f"process {proc.pid} exited with code {proc.returncode} before {url} was ready", log_path
            )
        # Probe before looking at the clock, so even a zero timeout checks once.
        probe_timeout_s = min(2.0, max(0.1, deadline - time.monotonic()))
        try:
            with opener.open(url, timeout=probe_timeout_s) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError, http.client.HTTPException):
            pass  # not listening yet, or answering non-200 while it loads
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            raise _start_failure(f"{url} not ready after {timeout_s:.1f} s", log_path)
        time.sleep(min(_POLL_S, remaining_s))


# Ports the kernel hands out for bind(0) and outgoing connections (Linux's default range; read live below).
_EPHEMERAL_DEFAULT = (32768, 60999)
_LISTEN_FLOOR = 20000  # below it sit many well-known service ports


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return _EPHEMERAL_DEFAULT


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(n: int, rng: random.Random | None = None) -> list[int]:
    """``n`` distinct TCP ports on 127.0.0.1, free a moment ago, chosen outside the kernel's ephemeral range.

    A port from bind(0) goes back to the ephemeral pool at once: while a vLLM engine loads for a minute
    or more, its own outgoing connections and bind(0) sockets (ZMQ, gloo) may take it, and the NIXL side
    channel then fails with "Address already in use" (seen in CI). A port below the ephemeral range can
    only be taken by an explicit bind. Random picks keep concurrent launchers apart.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    eph_lo, eph_hi = _ephemeral_range()
    lo, hi = (_LISTEN_FLOOR, eph_lo - 1) if eph_lo - 1 - _LISTEN_FLOOR >= 1000 else (eph_hi + 1, 65535)
    if rng is None:
        rng = random.SystemRandom()  # ports are not part of any experiment: no seed
    chosen: list[int] = []
    for _ in range(50 * max(n, 1)):
        if len(chosen) == n:
            return chosen
        port = rng.randint(lo, hi)
        if port not in chosen and _bindable(port):
            chosen.append(port)
    if len(chosen) == n:
        return chosen
    raise OSError(f"found only {len(chosen)} of {n} free ports in {lo}..{hi} on 127.0.0.1")


def free_port() -> int:
    """One port as :func:`free_ports` chooses them (another process may still take it first)."""
    return free_ports(1)[0]


def free_port_run(n: int, exclude: Collection[int] = ()) -> int:
    """The first of ``n`` consecutive free ports (chosen as :func:`free_ports` chooses them), none of them in
    ``exclude`` (ports already handed out and not yet bound): for a process whose engines take a base port
    plus their index, as vLLM's KV-event publishers do per rank."""
    for _ in range(50):
        first = free_port()
        run = range(first, first + n)
        if (
            first + n - 1 <= 65535
            and not any(p in exclude for p in run)
            and all(_bindable(p) for p in range(first + 1, first + n))
        ):
            return first
    raise OSError(f"found no {n} consecutive free ports on 127.0.0.1")
