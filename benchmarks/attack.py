"""Attack: the proxy under hostile clients, beside a normal load of legitimate requests (the acceptance run
of the hostile-clients issue).

An emulated cluster (``--prefill 1 --decode 2``; one process per engine), ``calroute serve`` in its own
process on 127.0.0.1 with a request log, and the project's open-loop load generator
(``calroute.harness.loadgen.drive``) sending legitimate streaming requests: Poisson arrivals at ``--rate``
for ``--duration-s``, each a distinct 128-token prompt and 16 output tokens. The same schedule runs twice:

1. baseline: the legitimate load alone;
2. attack: the same load while a separate attacker process (this file, ``--attacker``) holds open, for
   the whole phase, 300 slow-head connections (a request head sent a header line a second, never
   finished), 100 slow-body connections (a whole head announcing a 1 MB body, then a byte a second), 25
   large-body connections (a body just under the 8 MiB limit, sent but for its last byte, then a stall),
   and sends garbage request heads (random bytes, malformed lines, bad lengths, oversized lines) on fresh
   connections. A connection the proxy closes is opened again, so the counts hold whatever the proxy does.
   Meanwhile one decode engine answers badly (the emulator's bad_answer fault, ``POST /_calroute/faults``):
   BAD_ENGINE_RATE of the generation requests it gets, with ``oversized``, ``malformed`` and ``not_json``
   answers in turn (switched every BAD_SWITCH_S): a 4 MiB SSE event with no line break, past the proxy's
   1 MiB event cap; a chunked body whose first chunk size is no hex number, then a close; or an HTML page
   where a completion or an SSE stream should be. None sends a token, so the proxy must retry those
   requests on another decode engine: none may fail.

The attacker and the bad engine are in benchmarks/hostile/ (clients.py, engine.py).

Reported: the legitimate requests' p50/p99 TTFT in each phase and the ratio attack / baseline; the proxy's
RSS (VmRSS, /proc/PID/status) idle, peak per phase, and after the attack; its open descriptors
(/proc/PID/fd) likewise; the attacker's own counts (connections opened, closed by the proxy, answers by
status); the bad engine's injected answers by kind and the proxy's engine protocol errors and retries
(its /metrics); and lost legitimate requests: every request must end in exactly one record at the client
and one in the proxy's log (the attack's connections never reach a route, so they add none). Exit status 1
when any is lost. ``--time-scale S`` < 1 runs the engines and the arrival schedule S times faster, as in
soak.py; the attack lasts as long as the attack phase's schedule either way.

Usage: python benchmarks/attack.py [--duration-s 60] [--rate 5] [--prefill 1 --decode 2] [--time-scale 1]
       [--json] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

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
from calroute.results.records import RequestRecord, read_records
from calroute.types import RequestSpec, RequestStatus, SloClass
from calroute.workload.arrivals import poisson_arrivals_within

if __package__ in (None, ""):  # run as a script (python benchmarks/attack.py): the benchmarks package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.hostile.clients import (
    GARBAGE_WORKERS,
    LARGE_BODIES,
    LARGE_BODY_BYTES,
    SLOW_BODIES,
    SLOW_HEADS,
    attack,
)
from benchmarks.hostile.engine import (
    BAD_ANSWER_KINDS,
    BAD_ENGINE_RATE,
    BAD_SWITCH_S,
    BadEngine,
    proxy_counters,
)
from benchmarks.soak import _rss_kb

RAMP_S = 3.0  # the attack's connections are open before the attack phase's load starts
SETTLE_S = 2.0  # after the attack, before the "after" figures
SAMPLE_EVERY_S = 0.2
PROMPT_TOKENS, OUTPUT_TOKENS = 128, 16


# ---- the measuring side ---------------------------------------------------------------------------------


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


class Sampler(threading.Thread):
    """The proxy's RSS and open descriptors every SAMPLE_EVERY_S, their peaks per phase."""

    def __init__(self, pid: int, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.pid, self.stop_event = pid, stop
        self.phase = "idle"
        self.peak_rss_kb: dict[str, int] = {}
        self.peak_fds: dict[str, int] = {}

    def sample(self) -> tuple[int, int]:
        rss, fds = _rss_kb(self.pid), _fds(self.pid)
        self.peak_rss_kb[self.phase] = max(rss, self.peak_rss_kb.get(self.phase, 0))
        self.peak_fds[self.phase] = max(fds, self.peak_fds.get(self.phase, 0))
        return rss, fds

    def run(self) -> None:
        while not self.stop_event.wait(SAMPLE_EVERY_S):
            with contextlib.suppress(OSError, ValueError):
                self.sample()


def _schedule(rate: float, duration_s: float, scale: float, seed: int) -> list[RequestSpec]:
    arrivals_s = poisson_arrivals_within(rate, duration_s, np.random.default_rng(seed))
    return [
        RequestSpec(f"r{i}", float(t) * scale, PROMPT_TOKENS, OUTPUT_TOKENS, SloClass.TIGHT)
        for i, t in enumerate(arrivals_s)
    ]


def _ttft_ms(records: list[RequestRecord]) -> dict[str, float | None]:
    ttfts = [r.ttft_s for r in records if r.status is RequestStatus.OK and r.ttft_s is not None]
    if not ttfts:
        return {"p50": None, "p99": None}
    return {"p50": float(np.percentile(ttfts, 50)) * 1e3, "p99": float(np.percentile(ttfts, 99)) * 1e3}


def _phase(url: str, specs: list[RequestSpec], model: str, log: Path) -> dict[str, Any]:
    before = sum(1 for _ in read_records(log)) if log.exists() else 0
    result = aio.run(drive(url, specs, model, timeout_s=120.0))
    time.sleep(0.5)  # the proxy writes a record before the end of its stream goes out: let the last land
    logged = sum(1 for _ in read_records(log)) - before
    offered = len(specs)
    return {
        "offered": offered,
        "client_records": dict(Counter(r.status.value for r in result.records)),
        "proxy_records": logged,
        "lost": max(0, offered - len(result.records)) + abs(offered - logged),
        "ttft_ms": _ttft_ms(result.records),
        "lateness_p99_ms": result.lateness_p99_s * 1e3,
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration-s", type=float, default=60.0, help="each phase's schedule (and the attack)")
    ap.add_argument("--rate", type=float, default=5.0, help="legitimate requests/s (Poisson)")
    ap.add_argument("--prefill", type=int, default=1)
    ap.add_argument("--decode", type=int, default=2)
    ap.add_argument("--time-scale", type=float, default=1.0, help="engine durations and arrival gaps x S")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--workdir", type=Path, help="keep engine, proxy and attacker logs here")
    ap.add_argument("--attacker", type=int, metavar="PORT", help=argparse.SUPPRESS)  # the attacking process
    args = ap.parse_args()
    if args.attacker is not None:
        print(json.dumps(aio.run(attack(args.attacker, args.duration_s))), flush=True)
        return
    scale = args.time_scale
    if not scale > 0 or not args.duration_s > 0 or not args.rate > 0:
        ap.error("--time-scale, --duration-s and --rate must be > 0")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = args.workdir or Path(tmp_name)
        tmp.mkdir(parents=True, exist_ok=True)
        report = run(args, tmp)
    if args.json:
        print(json.dumps(report))
    else:
        print(json.dumps(report, indent=2))
    if report["lost"]:
        sys.exit(1)


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    scale = args.time_scale
    launched = up_emulated(
        args.prefill, args.decode, tmp / "engines", process_per_engine=True, time_scale=scale
    )
    cluster = launched.file
    cluster_path = tmp / "cluster.yaml"
    cluster.save(cluster_path)
    port = free_port()
    log = tmp / "proxy.jsonl"
    argv = [sys.executable, "-m", "calroute", "serve", "--cluster", str(cluster_path)]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--log", str(log)]
    proxy = start_process_group(argv, None, tmp / "proxy.log")
    attacker = None
    bad = BadEngine(cluster.decode[0].url)
    stop = threading.Event()
    sampler = Sampler(proxy.pid, stop)
    url = f"http://127.0.0.1:{port}"
    specs = _schedule(args.rate, args.duration_s, scale, args.seed)
    schedule_s = (specs[-1].arrival_s if specs else 0.0) + 1.0
    try:
        wait_http_ready(f"{url}/health", 30, proc=proxy)
        time.sleep(1.0)
        idle_rss, idle_fds = sampler.sample()
        sampler.start()
        sampler.phase = "baseline"
        baseline = _phase(url, specs, cluster.model, log)
        sampler.phase = "attack"
        attack_s = RAMP_S + schedule_s + 2.0
        here = Path(__file__).resolve()
        attacker = start_process_group(
            [sys.executable, str(here), "--attacker", str(port), "--duration-s", repr(attack_s)],
            None,
            tmp / "attacker.log",
            cwd=here.parents[1],
        )
        time.sleep(RAMP_S)
        bad.start()
        attacked = _phase(url, specs, cluster.model, log)
        bad.stop()
        counters = proxy_counters(url)
        with contextlib.suppress(Exception):
            attacker.wait(timeout=attack_s + 30)  # it ends by itself at its deadline
        sampler.phase = "after"
        time.sleep(SETTLE_S)
        after_rss, after_fds = sampler.sample()
    finally:
        stop.set()
        if bad.is_alive():
            bad.stop()
        for p in (attacker, proxy, *launched.procs):
            if p is not None:
                stop_process_group(p.pid)
                if p.poll() is None:
                    p.wait(timeout=10)
    lines = (tmp / "attacker.log").read_text().strip().splitlines() if attacker is not None else []
    try:
        attacker_counts = json.loads(lines[-1])
    except (IndexError, ValueError):
        attacker_counts = {"error": "the attacker printed no counts: see attacker.log", "tail": lines[-5:]}
    b, a = baseline["ttft_ms"], attacked["ttft_ms"]
    return {
        "duration_s": args.duration_s,
        "rate_rps": args.rate,
        "time_scale": scale,
        "cluster": f"{args.prefill}P+{args.decode}D emulated",
        "attack": {
            "slow_head_connections": SLOW_HEADS,
            "slow_body_connections": SLOW_BODIES,
            "large_body_connections": LARGE_BODIES,
            "large_body_bytes": LARGE_BODY_BYTES,
            "garbage_workers": GARBAGE_WORKERS,
            "bad_engine": {
                "engine": cluster.decode[0].id,
                "bad_answer_rate": BAD_ENGINE_RATE,
                "bad_answer": list(BAD_ANSWER_KINDS),
                "switch_s": BAD_SWITCH_S,
            },
        },
        "baseline": baseline,
        "under_attack": attacked,
        "ttft_ratio": {"p50": _ratio(a["p50"], b["p50"]), "p99": _ratio(a["p99"], b["p99"])},
        "proxy_rss_kb": {
            "idle": idle_rss,
            "peak_baseline": sampler.peak_rss_kb.get("baseline"),
            "peak_attack": sampler.peak_rss_kb.get("attack"),
            "after": after_rss,
        },
        "proxy_fds": {
            "idle": idle_fds,
            "peak_baseline": sampler.peak_fds.get("baseline"),
            "peak_attack": sampler.peak_fds.get("attack"),
            "after": after_fds,
        },
        "attacker": attacker_counts,
        "bad_engine": {
            "injected": bad.injected,
            "switches": bad.switches,
            **({"errors": bad.errors[:5]} if bad.errors else {}),
            "proxy": counters,
        },
        "lost": baseline["lost"] + attacked["lost"],
    }


if __name__ == "__main__":
    run_script(main)  # a timeout or kill stops the engines, proxy and attacker this started, too
