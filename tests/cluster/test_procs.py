"""stop_on_sigterm: a job killed with SIGTERM still runs its ``finally`` blocks (where it stops the engines
and proxies it started), also when a script started it with ``&``, which ignores SIGINT in it; run_script
ends such a script with one line and status 130."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

JOB = """
import signal, sys, time
from calroute.cluster.procs import stop_on_sigterm
if sys.argv[1] == "sigint-ignored":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
stop_on_sigterm()
try:
    print("ready", flush=True)
    time.sleep(30)
finally:
    open(sys.argv[2], "w").write("stopped what it started")
"""


def _terminated_when_ready(*argv: str) -> tuple[int, bytes]:
    """Run ``python -c argv...``, SIGTERM it once it prints "ready"; its status and stderr (10 s at most)."""
    job = subprocess.Popen([sys.executable, "-c", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert job.stdout is not None and job.stdout.readline() == b"ready\n"
        job.send_signal(signal.SIGTERM)
        _, stderr = job.communicate(timeout=10)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait(timeout=5)
    return job.returncode, stderr


@pytest.mark.parametrize("how", ["foreground", "sigint-ignored"])
def test_sigterm_runs_the_finally_blocks(tmp_path: Path, how: str) -> None:
    marker = tmp_path / "cleanup"
    _, stderr = _terminated_when_ready(JOB, how, str(marker))
    assert marker.read_text() == "stopped what it started"
    assert b"KeyboardInterrupt" in stderr  # it ended as Ctrl-C would, not silently by the signal


SCRIPT = """
import sys, time
from calroute.cluster.procs import run_script
def main():
    try:
        print("ready", flush=True)
        time.sleep(30)
    finally:
        open(sys.argv[1], "w").write("stopped what it started")
run_script(main)
"""


def test_a_script_killed_ends_with_one_line_and_status_130(tmp_path: Path) -> None:
    marker = tmp_path / "cleanup"
    returncode, stderr = _terminated_when_ready(SCRIPT, str(marker))
    assert marker.read_text() == "stopped what it started"
    assert returncode == 130
    assert stderr.decode().strip() == "interrupted: the engines and proxies it started are stopped"


def test_a_free_port_run_avoids_ports_handed_out_but_not_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    # the engines' HTTP ports are chosen free but bound only when their processes start: a run of event
    # ports must not land on them (make demo once failed: "Address already in use" on an engine's own port)
    from calroute.cluster import procs

    taken = procs.free_ports(2)
    real = procs.free_port
    offers = iter([taken[0], taken[1] - 1])  # both runs of 2 would cover a taken port

    def offer() -> int:
        return next(offers, None) or real()

    monkeypatch.setattr(procs, "free_port", offer)
    first = procs.free_port_run(2, exclude=set(taken))
    assert not set(taken) & {first, first + 1}
