"""CPU accounting: the cores used by the engines, the proxy, the client and everything else."""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.overhead.method import OTHERS_WINDOW_S, PARTS

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _stat_cpu(stat: str) -> tuple[int, float]:
    """(process group, user + system CPU seconds) from a /proc/PID/stat line."""
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[2]), (int(fields[11]) + int(fields[12])) * _TICK_S


def group_pids(pgids: Iterable[int]) -> list[int]:
    """The live processes of these process groups."""
    want = set(pgids)
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            pgid, _ = _stat_cpu((entry / "stat").read_text())
        except (OSError, IndexError, ValueError):
            continue
        if pgid in want:
            pids.append(int(entry.name))
    return pids


def group_cpu_s(pgid: int) -> float:
    """User + system CPU seconds of the live processes of a process group (from /proc)."""
    return pids_cpu_s(group_pids([pgid]))


def pids_cpu_s(pids: Iterable[int]) -> float:
    """User + system CPU seconds of these processes; one that has exited counts as nothing."""
    total = 0.0
    for pid in pids:
        try:
            total += _stat_cpu(Path(f"/proc/{pid}/stat").read_text())[1]
        except (OSError, IndexError, ValueError):
            continue
    return total


def machine_busy_s() -> float:
    """CPU seconds every process on the machine has used since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is already counted in user)
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) * _TICK_S


def peak_others_cores(samples: Sequence[tuple[float, float, float]], min_window_s: float = 0.0) -> float:
    """The most cores the rest of the machine used between two consecutive samples at least
    ``min_window_s`` apart (CPU times come in 10 ms ticks: over a short window one tick reads as a core).

    A sample is (wall seconds, machine busy CPU seconds, our processes' CPU seconds). A round's mean
    hides a burst: another job taking a whole core for one second of a five-second round averages 0.2
    cores, under the limit, yet every request in flight during that second waits."""
    peak = 0.0
    for (w0, m0, o0), (w1, m1, o1) in zip(samples, samples[1:], strict=False):
        if w1 - w0 >= min_window_s and w1 > w0:
            peak = max(peak, ((m1 - m0) - (o1 - o0)) / (w1 - w0))
    return peak


@dataclass
class CpuMeter:
    """CPU used between ``start`` and ``stop`` by the engines, the proxy, this client, and everything else
    on the machine (other people's jobs share these two cores).

    Between the two, a thread samples the machine every ``window_s`` so that ``others_peak_cores`` shows a
    burst of the others that the round's mean would hide. The sample reads only the processes found at
    ``start`` (a scan of /proc costs ~2 ms; reading a dozen stat files, ~0.1 ms)."""

    engine_pgids: tuple[int, ...]
    proxy_pgid: int | None
    window_s: float = OTHERS_WINDOW_S
    marks: dict[str, float] = field(default_factory=dict)
    others_peak_cores: float = 0.0
    _samples: list[tuple[float, float, float]] = field(default_factory=list)
    _halt: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _pids: list[int] = field(default_factory=list)

    def _now(self) -> dict[str, float]:
        return {
            "engines": sum(group_cpu_s(g) for g in self.engine_pgids),
            "proxy": group_cpu_s(self.proxy_pgid) if self.proxy_pgid is not None else 0.0,
            "client": time.process_time(),
            "machine": machine_busy_s(),
            "wall": time.monotonic(),
        }

    def _sample(self, pids: list[int]) -> tuple[float, float, float]:
        ours = pids_cpu_s(pids) + time.process_time()
        return time.monotonic(), machine_busy_s(), ours

    def _sampler(self) -> None:
        while not self._halt.wait(self.window_s):
            self._samples.append(self._sample(self._pids))

    def start(self) -> None:
        groups = [*self.engine_pgids, *([self.proxy_pgid] if self.proxy_pgid is not None else [])]
        self._pids = group_pids(groups)
        self.marks = self._now()
        self._samples = [self._sample(self._pids)]
        self._halt.clear()
        self._thread = threading.Thread(target=self._sampler, daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, float]:
        """CPU seconds used since ``start`` (and the wall seconds), per part."""
        if self._thread is not None:
            self._halt.set()
            self._thread.join()
            self._thread = None
            self._samples.append(self._sample(self._pids))
        self.others_peak_cores = peak_others_cores(self._samples, self.window_s / 2)
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
