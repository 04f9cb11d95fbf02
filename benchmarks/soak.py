"""Soak: the proxy under load on emulated engines for a set duration, with a fault every 30 s.

An emulated 2P+4D cluster (one process per engine, so one can be killed and restarted), `calroute serve`
in its own process with a request log, and the open-loop load generator at the given rate. Faults cycle
through: an engine answering 500s, a stalled decode engine, a decode engine killed (and restarted 10 s
later on its port), /metrics gone; each lasts 10 s. Reported: requests offered, completed, failed by
reason, lost (offered without a terminal record at the client, or at the proxy: must be 0), the proxy's
memory at the start, every tenth of the run and at the end, its TCP sockets by state at the end
(CLOSE_WAIT means a leak), and how many sockets 30 sequential requests add afterwards (a pool: at most one
per engine, if it expired while idle; a leak: one or two per request).
Exit status 1 when anything is lost.
The default rate, 10 req/s of mixed-bursty traffic, is about round-robin's saturation point on 2P+4D.
--time-scale S < 1 runs the same soak S times faster: the engines' modelled durations, the gaps between
arrivals and the fault timings are all multiplied by S, so the same requests meet the same load relative to
the engines and the same faults in S times the wall time (durations and rates are given at time scale 1).
A request sent to a stalled engine waits out the proxy's stall timeout (--stall-timeout-s, 60 s by default)
and is then retried on another engine.
Usage: python benchmarks/soak.py [--duration-s 600] [--rate 10] [--fault-every-s 30] [--time-scale 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from calroute import aio
from calroute.cluster.launch import up_emulated
from calroute.cluster.procs import (
    free_port,
    run_script,
    start_process_group,
    stop_process_group,
    wait_http_ready,
)
from calroute.harness.loadgen import drive
from calroute.results.records import read_records
from calroute.workload.families import generate_family

FAULTS = ("error_rate", "stall", "crash", "metrics_down")


PROBE_SETTLE_S = 0.5
PROBE_REQUESTS = 30


def _post(url: str, payload: dict[str, Any]) -> None:
    req = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=5) as r:
        r.read()


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


# /proc/net/tcp state codes (include/net/tcp_states.h)
_TCP_STATES = {"01": "established", "06": "time_wait", "08": "close_wait", "0A": "listen"}


def _sockets_by_state(pid: int) -> dict[str, int]:
    """The process's TCP sockets by state. A socket the peer closed and we never did sits in CLOSE_WAIT: the
    signature of a leaked connection (a pooled keep-alive connection, however many, is ESTABLISHED)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = str(fd.readlink())
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    states: Counter[str] = Counter()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            cols = line.split()
            if cols[9] in inodes:
                states[_TCP_STATES.get(cols[3], cols[3])] += 1
    return dict(states)


class RssSampler(threading.Thread):
    """The proxy's RSS every `every_s`: a leak grows for the whole run, a warming allocator levels off."""

    def __init__(self, pid: int, every_s: float, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.pid, self.every_s, self.stop_event = pid, every_s, stop
        self.samples_kb: list[int] = []
        self.sockets: list[int] = []  # beside it: the connection pool grows with the largest burst so far

    def run(self) -> None:
        while not self.stop_event.wait(self.every_s):
            self.samples_kb.append(_rss_kb(self.pid))
            self.sockets.append(sum(_sockets_by_state(self.pid).values()))


def _probe_growth(proxy_url: str, model: str, n: int, pid: int) -> int:
    """Open sockets added by `n` sequential requests: a pool reuses its connections, a leak adds one or two
    per request."""
    before = sum(_sockets_by_state(pid).values())
    for _ in range(n):
        _post(f"{proxy_url}/v1/completions", {"model": model, "prompt": "probe", "max_tokens": 2})
    # The client has its answer before the proxy has closed its side of that connection (a CI run counted
    # that one socket more): let the last close land.
    time.sleep(PROBE_SETTLE_S)
    return sum(_sockets_by_state(pid).values()) - before


class FaultSchedule(threading.Thread):
    """Every ``every_s``: the next fault for 10 s on one engine, then back to normal."""

    def __init__(
        self,
        cluster: Any,
        procs: list[Any],
        argv_of: list[list[str]],
        logs: Path,
        every_s: float,
        lasts_s: float,
        stop: threading.Event,
    ) -> None:
        super().__init__(daemon=True)
        self.cluster, self.procs, self.argv_of, self.logs = cluster, procs, argv_of, logs
        self.every_s, self.lasts_s, self.stop_event = every_s, lasts_s, stop
        self.log: list[str] = []

    def run(self) -> None:
        i = 0
        while not self.stop_event.wait(max(1.0, self.every_s - self.lasts_s)):
            kind = FAULTS[i % len(FAULTS)]
            target = self.cluster.decode[i % len(self.cluster.decode)]
            index = list(self.cluster.engines).index(target)
            self.log.append(f"{time.strftime('%H:%M:%S')} {kind} on {target.id}")
            try:
                if kind == "crash":
                    stop_process_group(self.procs[index].pid)
                    self.procs[index].wait(timeout=10)
                elif kind == "stall":
                    _post(f"{target.url}/_calroute/faults", {"stall": True})
                elif kind == "error_rate":
                    _post(f"{target.url}/_calroute/faults", {"error_rate": 1.0})
                else:
                    _post(f"{target.url}/_calroute/faults", {"metrics_down": True})
                if self.stop_event.wait(self.lasts_s):
                    return
                if kind == "crash":
                    self.procs[index] = start_process_group(
                        self.argv_of[index], None, self.logs / f"restart{i}.log"
                    )
                    wait_http_ready(f"{target.url}/health", 30, proc=self.procs[index])
                else:
                    _post(
                        f"{target.url}/_calroute/faults",
                        {"stall": False, "error_rate": 0.0, "metrics_down": False},
                    )
            except Exception as e:  # a fault that could not be set is reported, not fatal
                self.log.append(f"  could not apply {kind}: {e}")
            i += 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration-s", type=float, default=600.0)
    ap.add_argument("--rate", type=float, default=10.0, help="requests/s (mixed-bursty mean rate)")
    ap.add_argument("--fault-every-s", type=float, default=30.0)
    ap.add_argument("--fault-lasts-s", type=float, default=10.0)
    ap.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="multiply engine durations, arrival gaps and fault timings: the same soak, faster",
    )
    ap.add_argument(
        "--stall-timeout-s",
        type=float,
        default=60.0,
        help="the proxy's stall timeout (calroute serve --stall-timeout), which stalled requests wait out",
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--workdir", type=Path, help="keep engine and proxy logs here (default: a temporary dir)")
    args = ap.parse_args()
    scale = args.time_scale
    if not scale > 0:
        ap.error(f"--time-scale must be > 0, got {scale}")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = args.workdir or Path(tmp_name)
        tmp.mkdir(parents=True, exist_ok=True)
        launched = up_emulated(2, 4, tmp / "engines", process_per_engine=True, time_scale=scale)
        cluster = launched.file
        cluster_path = tmp / "cluster.yaml"
        cluster.save(cluster_path)
        # how to restart each engine on its own port: the same command the launcher used
        argv_of = [
            [
                sys.executable,
                "-m",
                "calroute",
                "engines",
                "emulate",
                "--time-scale",
                str(scale),
                "--engine",
                f"{e.role.value}:{e.url.rsplit(':', 1)[1]}",
            ]
            for e in cluster.engines
        ]
        port = free_port()
        log = tmp / "proxy.jsonl"
        proxy = start_process_group(
            [
                sys.executable,
                "-m",
                "calroute",
                "serve",
                "--cluster",
                str(cluster_path),
                "--port",
                str(port),
                "--log",
                str(log),
                "--stall-timeout",
                repr(args.stall_timeout_s),
            ],
            None,
            tmp / "proxy.log",
        )
        stop = threading.Event()
        schedule = FaultSchedule(
            cluster,
            launched.procs,
            argv_of,
            tmp,
            args.fault_every_s * scale,
            args.fault_lasts_s * scale,
            stop,
        )
        try:
            wait_http_ready(f"http://127.0.0.1:{port}/health", 30, proc=proxy)
            rss_start = _rss_kb(proxy.pid)
            n = int(args.rate * args.duration_s * 1.1) + 10
            reqs = [
                r._replace(arrival_s=r.arrival_s * scale)
                for r in generate_family("mixed-bursty", args.rate, n, 0)
                if r.arrival_s < args.duration_s
            ]
            schedule.start()
            rss = RssSampler(proxy.pid, max(5.0, scale * args.duration_s / 10), stop)
            rss.start()
            result = aio.run(drive(f"http://127.0.0.1:{port}", reqs, cluster.model, timeout_s=120.0))
            stop.set()
            schedule.join(30)
            rss_end = _rss_kb(proxy.pid)
            time.sleep(2.0)  # let the engines restarted by the last fault finish their handshakes
            sockets = _sockets_by_state(proxy.pid)
            logged = list(read_records(log))  # before the probe requests add theirs
            growth = _probe_growth(f"http://127.0.0.1:{port}", cluster.model, PROBE_REQUESTS, proxy.pid)
        finally:
            stop.set()
            stop_process_group(proxy.pid)
            proxy.wait(timeout=10)
            for p in launched.procs:
                stop_process_group(p.pid)
                if p.poll() is None:
                    p.wait(timeout=10)
        client = Counter(r.status.value for r in result.records)
        by_reason = Counter((r.error or "").split(":")[0][:60] for r in logged if r.status.value != "ok")
        offered = len(reqs)
        # the client keeps one record per request it sent; the proxy one per request it admitted (all of them
        # here: every request is well formed)
        lost = max(0, offered - len(result.records)) + max(0, offered - len(logged))
        report = {
            "duration_s": args.duration_s,
            "rate_rps": args.rate,
            "fault_every_s": args.fault_every_s,
            "time_scale": scale,
            "stall_timeout_s": args.stall_timeout_s,
            "offered": offered,
            "client_records": dict(client),
            "proxy_records": len(logged),
            "proxy_status": dict(Counter(r.status.value for r in logged)),
            "failed_by_reason": dict(by_reason),
            "lost": lost,
            "proxy_rss_kb_start": rss_start,
            "proxy_rss_kb_end": rss_end,
            "proxy_rss_kb_series": rss.samples_kb,
            "proxy_sockets_series": rss.sockets,
            "proxy_sockets_end": sockets,
            "proxy_socket_growth_over_probe": growth,
            "probe_requests": PROBE_REQUESTS,
            "e2e_max_s": max((r.last_token_s or r.arrival_s) - r.arrival_s for r in logged),
            "lateness_p99_s": result.lateness_p99_s,
            "faults": schedule.log,
        }
        print(json.dumps(report) if args.json else json.dumps(report, indent=2))
        if lost:
            sys.exit(1)


if __name__ == "__main__":
    run_script(main)  # a timeout or kill stops the engines and proxies this started, too
