"""The short soak of CI: benchmarks/soak.py for 45 s with a fault every 12 s; nothing may be lost.

It runs 4x faster (--time-scale 0.25): the engines' modelled durations, the arrival gaps and the fault
timings are all divided by 4, so the same 307 requests meet the same load relative to the engines and the same
fault cycles (each of the four kinds at least once) in about 11 s of arrivals instead of 45. The proxy's stall
timeout is 10 s instead of 60 (--stall-timeout-s): the stalled requests still wait it out and are retried
elsewhere, which is what is checked, without a minute's wait.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.faults

REPO = Path(__file__).resolve().parents[2]


def test_short_soak_loses_nothing() -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "soak.py"),
            "--duration-s",
            "45",
            "--rate",
            "6",
            "--fault-every-s",
            "12",
            "--fault-lasts-s",
            "5",
            "--time-scale",
            "0.25",
            "--stall-timeout-s",
            "10",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr[-3000:] + out.stdout[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["lost"] == 0
    assert report["proxy_records"] == report["offered"] == sum(report["client_records"].values())
    assert len(report["faults"]) >= 3
    assert report["client_records"].get("ok", 0) >= 0.8 * report["offered"]
    assert report["proxy_sockets_end"].get("close_wait", 0) == 0
    # the idle pool may have expired before the probe: one new connection per engine (2P+4D) at most; a leak
    # would add one or two per request (30 requests)
    assert report["proxy_socket_growth_over_probe"] <= 6
