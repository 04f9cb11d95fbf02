"""CPU accounting: the cores used by the engines, the proxy, the client and everything else."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.overhead.method import PARTS

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def group_cpu_s(pgid: int) -> float:
    """User + system CPU seconds of the live processes of a process group (from /proc)."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[2]) == pgid:
            total += (int(fields[11]) + int(fields[12])) * _TICK_S
    return total


def machine_busy_s() -> float:
    """CPU seconds every process on the machine has used since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is already counted in user)
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) * _TICK_S


@dataclass
class CpuMeter:
    """CPU used between ``start`` and ``stop`` by the engines, the proxy, this client, and everything else
    on the machine (other people's jobs share these two cores)."""

    engine_pgids: tuple[int, ...]
    proxy_pgid: int | None
    marks: dict[str, float] = field(default_factory=dict)

    def _now(self) -> dict[str, float]:
        return {
            "engines": sum(group_cpu_s(g) for g in self.engine_pgids),
            "proxy": group_cpu_s(self.proxy_pgid) if self.proxy_pgid is not None else 0.0,
            "client": time.process_time(),
            "machine": machine_busy_s(),
            "wall": time.monotonic(),
        }

    def start(self) -> None:
        self.marks = self._now()

    def stop(self) -> dict[str, float]:
        """CPU seconds used since ``start`` (and the wall seconds), per part."""
        now = self._now()
        return {k: now[k] - self.marks[k] for k in now}


def cpu_summary(used: dict[str, float], requests: int) -> dict[str, float]:
    """Cores busy and CPU milliseconds per request, per part; ``others``: the rest of the machine."""
    used = dict(used)
    used["others"] = max(0.0, used.get("machine", 0.0) - sum(used.get(k, 0.0) for k in PARTS[:3]))
    wall = used.get("wall", 0.0)
    out: dict[str, float] = {}
    for k in PARTS:
        out[f"{k}_cores"] = used.get(k, 0.0) / wall if wall else math.nan
        out[f"{k}_cpu_ms_per_req"] = used.get(k, 0.0) / max(1, requests) * 1e3
    return out


def cores_text(cpu: dict[str, float]) -> str:
    return "/".join(f"{cpu[f'{k}_cores']:.2f}" for k in PARTS)
