"""What ran a benchmark: VMs differ by 2x between sessions, so results carry the CPU they ran on."""

from __future__ import annotations

import datetime
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from calroute.results.provenance import git_commit

ROOT = Path(__file__).resolve().parents[1]


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


def report_head(name: str, **machine_extra: object) -> dict[str, Any]:
    """What every benchmark's JSON begins with: its name, the date, the commit and the machine (plus
    ``machine_extra``, e.g. the load before the run)."""
    return {
        "benchmark": name,
        "date": datetime.date.today().isoformat(),
        "git_commit": git_commit(ROOT),
        "machine": {**machine(), **machine_extra},
    }


def save_report(report: Mapping[str, Any], results: Path, out: Path | None = None) -> Path:
    """Write ``report`` to ``out``, or to its dated path under ``results`` (dated_path); says where."""
    path = out if out is not None else dated_path(results, str(report["benchmark"]), str(report["date"]))
    path.write_text(json.dumps(report, indent=2) + "\n")
    shown = path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path
    print(f"wrote {shown}", file=sys.stderr)
    return path
