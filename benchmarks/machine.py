"""What ran a benchmark: VMs differ by 2x between sessions, so results carry the CPU they ran on."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def machine() -> dict[str, object]:
    """The CPU model, core count, Python version and the 1-minute load average when asked."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "load_1m": os.getloadavg()[0],
    }


def dated_path(results: Path, name: str, date: str) -> Path:
    """Where a benchmark's JSON of ``date`` goes: results/NAME_DATE.json, or with the first free letter after
    the date (b, c, ...) when a run of that day is there already."""
    results.mkdir(parents=True, exist_ok=True)
    stem = f"{name}_{date}"
    path = results / f"{stem}.json"
    suffix = iter("bcdefghijklmnopqrstuvwxyz")
    while path.exists():
        path = results / f"{stem}{next(suffix)}.json"
    return path
