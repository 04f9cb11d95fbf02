"""Proxy overhead: the TTFT a proxy adds, and the request rate it sustains, against emulated engines.

One emulated cluster (``--prefill 1 --decode 1`` by default; a40-qwen2.5-3b timing at time scale 1, all
engines in one process) serves three modes in the same run:

- ``direct`` (the baseline, no proxy): the benchmark client does the NixlConnector handoff itself, as
  vLLM's toy proxy does: POST a prefill engine with ``max_tokens=1``, ``stream=false`` and
  ``kv_transfer_params.do_remote_decode``, then POST a decode engine, streaming, with the returned
  ``kv_transfer_params`` (round-robin over each pool).
- ``calroute``: the same requests, as plain streaming OpenAI completions, through ``python -m calroute
  serve`` with policy round_robin (``--calroute-policy`` to change it), as ``direct`` and vllm-router
  route, so that what differs between the modes is the proxy and not where requests go. With
  marginal_cost the engines themselves are slower on this workload (every request alike, all engines
  busy): it joins the prefill engine with the fewest prompts in flight, which costs about 3 ms of prefill
  time at p50 here against round-robin's even rotation; that is the policy's effect, not the proxy's.
- ``vllm-router``: PyPI ``vllm-router==0.1.17`` (a Rust proxy) in its prefill/decode mode
  (``--vllm-pd-disaggregation``, round_robin), installed on first use into ``.venv-bench``. If it cannot
  be installed, the run says so and measures the other two modes; no figure is made up for it.

A proxy runs only while its mode is measured (started afresh for every step or round, then stopped), so
its background work is charged to it alone: e.g. calroute's 20 Hz /metrics polling of every engine, which
it does only with a policy that reads the samples (marginal_cost, not the default round_robin here).
Every request: a unique 128-token prompt (no prefix-cache hits), 16 output tokens with ``ignore_eos``,
``stream_options.include_usage`` (so every mode's decode body is the same), one SSE event per token. The
client is asyncio + aiohttp on uvloop (as the project's load generator), open loop: Poisson arrivals on a
schedule fixed in advance, sent whatever the responses, a fresh connection pool per mode and step. TTFT
runs from the scheduled send to the first content chunk (time.perf_counter), so client lateness counts
too (its p99 is reported as "lag99"). Every response is checked (HTTP 200, exactly 16 completion tokens,
no error event), and the emulator's and vllm-router's logs are checked for failed KV handoffs.

1. Unloaded: ``--unloaded`` (200) sequential requests per mode, in ``--rounds`` rounds with the mode order
   rotated; 10x the p50 TTFT of ``direct`` is the TTFT bound of the ramp.
2. Sustainable rate, per mode: offered rate from 10 req/s, x1.5 per step, each step ``--duration-s``
   (10 s) of Poisson arrivals; after the first failure, x1.5^(1/3) steps from the last sustained rate
   (about 15 % resolution). The modes' steps are interleaved (one step of each mode per round), so drifts
   in the machine's load hit them alike, and every mode gets the same arrival schedule at a given rate
   (common random numbers; the retry of a failed step gets another, again the same for every mode). A
   step is sustained when every request completes without error, the achieved rate (completions / (last
   completion - step start - the mode's unloaded p50 latency)) is at least 95 % of the offered rate
   (requests scheduled / duration), and p99 TTFT is under the bound. A failing step is run once more
   before it counts.
3. Added TTFT at half of ``direct``'s sustainable rate, the same rate for every mode: ``--requests``
   (12,000) per mode in ``--rounds`` (16) rounds, mode order rotated, each round after 2 s of discarded
   warm-up at the rate. Within a round every mode gets the same arrival schedule (common random numbers),
   so the i-th request of a mode and of ``direct`` arrive at the same offset and make a pair. Added p50/p99
   = mode - direct over all pairs, with a 95 % bootstrap interval that resamples whole rounds: the
   machine's state drifts between rounds and moves a round's pairs together, which an interval over
   independent pairs (kept in the JSON as ``*_ci95_pairs_ms``, with the pairing ignored as
   ``*_unpaired_ms``) does not see. The ratio is mode / direct. When a proxy's own sustainable rate
   differs from ``direct``'s, this is repeated at half of the proxy's own rate, with ``direct`` beside it.
   A latency target counts as met only when its whole 95 % interval is under the limit, missed when all
   of it is over, and "not resolved" otherwise. Each round's p50, p99 and added p50/p99 are reported too.

Other jobs share this VM and come in bursts. A failed ramp step during which they used more than 0.25 cores,
or a fixed-rate round during which they did or the client's send lag p99 passed 20 ms, is set aside
(reported, with its figures) and run again, at most 3 times. A ramp step's last run counts whatever it
shows; a fixed-rate round still disturbed on its last run is reported but left out of the added TTFT of
every pair of modes it belongs to (a disturbed ``direct`` round would flatter every proxy). With fewer
than half the rounds left to compare, the latency targets are "not judged".

CPU per request is reported per part (engines, proxy, client), and the cores used by everything else on
the machine ("others": this VM is shared with other jobs, which were running during the recorded runs).
The machine has 2 cores shared by the engines, the proxy and the client: sustainable rates are those of
the whole system, not of a proxy alone. With 1P+1D the emulated prefill GPU saturates first (about 110
req/s of 128-token prompts, whatever the proxy); with ``--prefill 4 --decode 2`` the emulated engines
still set the limit (every mode, ``direct`` included, completes about 460 req/s however many are offered,
with a quarter of the cores idle), and a proxy's own cost shows in its added latency under load and its CPU
per request. ``direct``'s client makes two HTTP requests per request where a proxy's client makes one, so
the baseline's client costs a little more CPU.

Targets (issue): added p50 < 1 ms and p99 < 5 ms at half the sustainable rate; sustainable rate not below
vllm-router's. Baseline in the same run: ``direct`` (no proxy); comparison: vllm-router.
Usage: python benchmarks/proxy_overhead.py [--prefill 1 --decode 1] [--quick] [--duration-s 10]
       [--requests 12000] [--rounds 16] [--log-dir DIR] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import numpy as np

from calroute import aio
from calroute.engines.launch import LaunchedCluster, up_emulated
from calroute.engines.procs import (
    free_port,
    run_script,
    start_process_group,
    stop_process_group,
    wait_http_ready,
)
from calroute.engines.tokens import text_of_tokens
from calroute.proxy.pd import PREFILL_KV_PARAMS

REPO = Path(__file__).resolve().parents[1]
BENCH_VENV = REPO / ".venv-bench"
VLLM_ROUTER_VERSION = "0.1.17"

PROMPT_TOKENS = 128  # including the BOS
OUTPUT_TOKENS = 16
MODEL = "emulated"
REQUEST_TIMEOUT_S = 30.0
START_RATE = 10.0
COARSE_FACTOR = 1.5
FINE_FACTOR = 1.5 ** (1 / 3)
MAX_RATE = 5000.0
ACHIEVED_MIN = 0.95
TTFT_BOUND_X = 10.0
WARMUP_S = 2.0
# Other jobs share this VM. A failed ramp step during which they used more than OTHERS_LIMIT_CORES, or a
# fixed-rate round during which they did or our client's send lag p99 passed LAG_LIMIT_S, is disturbed:
# it is set aside (and reported) and run again, at most MAX_REDO times per step or round.
# Quiet rounds show 0.00 - 0.05 cores of others; with a limit of 1.0, rounds beside 0.4 - 0.7 counted.
OTHERS_LIMIT_CORES = 0.25
LAG_LIMIT_S = 0.020
MAX_REDO = 3
MODES = ("direct", "calroute", "vllm-router")
PARTS = ("engines", "proxy", "client", "others")
T = TypeVar("T")


# ---- the client ---------------------------------------------------------------------------------------


def now() -> float:
    """The client's clock. Not ``loop.time()``: uvloop's is libuv's cached loop time, whole milliseconds,
    taken at the start of the loop iteration."""
    return time.perf_counter()


@dataclass
class Outcome:
    """One request, times on the ``now()`` clock."""

    scheduled_s: float
    sent_s: float = math.nan
    ttft_s: float = math.nan
    done_s: float = math.nan
    error: str | None = None


@dataclass
class Target:
    """Where a mode sends its requests: a proxy URL, or the engines themselves (``direct``)."""

    mode: str
    url: str | None = None  # the proxy
    pgid: int | None = None  # the proxy's process group
    prefill: list[str] = field(default_factory=list)  # direct: engine URLs
    decode: list[str] = field(default_factory=list)
    _rr: int = 0

    def pick(self) -> tuple[str, str]:
        self._rr += 1
        return self.prefill[self._rr % len(self.prefill)], self.decode[self._rr % len(self.decode)]


class Salts:
    """Unique prompts across the whole run: no request ever hits another's prefix cache."""

    def __init__(self) -> None:
        self.n = 0

    def next(self) -> int:
        self.n += 1
        return self.n


def client_body(salt: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "prompt": text_of_tokens(PROMPT_TOKENS - 1, salt),
        "max_tokens": OUTPUT_TOKENS,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def direct_prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The prefill request as vLLM's toy proxy makes it (tests/v1/kv_connector/nixl_integration)."""
    p = dict(body)
    p["kv_transfer_params"] = dict(PREFILL_KV_PARAMS)
    p["stream"] = False
    p["max_tokens"] = 1
    for key in ("stream_options", "min_tokens", "min_completion_tokens"):
        p.pop(key, None)
    return p


async def read_stream(r: aiohttp.ClientResponse, out: Outcome) -> None:
    if r.status != 200:
        out.error = f"HTTP {r.status}: {(await r.read())[:200].decode(errors='replace')}"
        return
    tokens = None
    async for line in r.content:
        if not line.startswith(b"data: {"):
            continue
        if b'"choices":[]' in line:
            tokens = json.loads(line[6:])["usage"]["completion_tokens"]
        elif line.startswith(b'data: {"error"'):
            out.error = line[6:206].decode(errors="replace")
        elif math.isnan(out.ttft_s):
            out.ttft_s = now() - out.scheduled_s
    out.done_s = now()
    if out.error is None and tokens != OUTPUT_TOKENS:
        out.error = f"expected {OUTPUT_TOKENS} completion tokens, usage says {tokens}"
    if out.error is None and math.isnan(out.ttft_s):
        out.error = "no content chunk"


async def one_request(s: aiohttp.ClientSession, target: Target, salt: int, out: Outcome) -> None:
    out.sent_s = now()
    body = client_body(salt)
    try:
        if target.url is not None:
            async with s.post(f"{target.url}/v1/completions", json=body) as r:
                await read_stream(r, out)
            return
        prefill, decode = target.pick()
        headers = {"X-Request-Id": uuid.uuid4().hex}
        async with s.post(f"{prefill}/v1/completions", json=direct_prefill_body(body), headers=headers) as r:
            if r.status != 200:
                out.error = f"prefill HTTP {r.status}"
                return
            kv = (await r.json()).get("kv_transfer_params")
        if kv:
            body["kv_transfer_params"] = kv
        else:
            out.error = "prefill returned no kv_transfer_params"
            return
        async with s.post(f"{decode}/v1/completions", json=body, headers=headers) as r:
            await read_stream(r, out)
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as e:
        out.error = f"{type(e).__name__}: {e}"


def new_session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
    )


async def run_schedule(
    s: aiohttp.ClientSession, target: Target, arrivals: list[float], salts: Salts
) -> tuple[list[Outcome], float]:
    """Send one request at each arrival offset (open loop); (outcomes, ``now()`` at offset 0)."""
    t0 = now() + 0.05
    tasks = []
    outs = []
    for a in arrivals:
        delay = t0 + a - now()
        if delay > 0:
            await asyncio.sleep(delay)
        out = Outcome(scheduled_s=t0 + a)
        outs.append(out)
        tasks.append(asyncio.create_task(one_request(s, target, salts.next(), out)))
    await asyncio.gather(*tasks)
    return outs, t0


async def run_sequential(s: aiohttp.ClientSession, target: Target, n: int, salts: Salts) -> list[Outcome]:
    outs = []
    for _ in range(n):
        out = Outcome(scheduled_s=now())
        await one_request(s, target, salts.next(), out)
        outs.append(out)
    return outs


def poisson(rate: float, duration_s: float, rng: random.Random) -> list[float]:
    t, out = 0.0, list[float]()
    while True:
        t += rng.expovariate(rate)
        if t >= duration_s:
            return out
        out.append(t)


def poisson_n(rate: float, n: int, rng: random.Random) -> list[float]:
    t, out = 0.0, list[float]()
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


# ---- statistics ---------------------------------------------------------------------------------------


def pct(values: list[float] | np.ndarray[Any, Any], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else math.nan


def ok_ttfts(outs: list[Outcome]) -> list[float]:
    return [o.ttft_s for o in outs if o.error is None]


def errors_of(outs: list[Outcome]) -> list[str]:
    return [o.error for o in outs if o.error is not None]


def bootstrap_diff(a: list[float], b: list[float], q: float, rng: np.random.Generator) -> tuple[float, float]:
    """95 % bootstrap interval of percentile q of ``a`` minus that of ``b`` (independent resamples)."""
    xa, xb = np.asarray(a), np.asarray(b)
    reps = 2000
    da = np.percentile(xa[rng.integers(0, len(xa), (reps, len(xa)))], q, axis=1)
    db = np.percentile(xb[rng.integers(0, len(xb), (reps, len(xb)))], q, axis=1)
    lo, hi = np.percentile(da - db, [2.5, 97.5])
    return float(lo), float(hi)


def bootstrap_paired_diff(
    a: list[float], b: list[float], q: float, rng: np.random.Generator
) -> tuple[float, float]:
    """95 % bootstrap interval of percentile q of ``a`` minus that of ``b``, where ``a[i]`` and ``b[i]`` are
    one pair (the same scheduled arrival in both modes): pairs are resampled whole, so what the arrival
    pattern does to both (a burst queues both modes' requests alike) does not widen the interval."""
    xa, xb = np.asarray(a), np.asarray(b)
    idx = rng.integers(0, len(xa), (2000, len(xa)))
    d = np.percentile(xa[idx], q, axis=1) - np.percentile(xb[idx], q, axis=1)
    lo, hi = np.percentile(d, [2.5, 97.5])
    return float(lo), float(hi)


def bootstrap_rounds_diff(
    rounds: list[tuple[list[float], list[float]]], q: float, rng: np.random.Generator
) -> tuple[float, float]:
    """95 % bootstrap interval of percentile q of the pooled ``a`` minus that of the pooled ``b``, resampling
    whole rounds (each round: its aligned pairs ``a``, ``b``). The machine's state drifts between rounds
    (other jobs, cache and scheduler state), moving a round's pairs together; resampling pairs treats them
    as independent and gives an interval narrower than the rounds' spread, so the verdict uses this one."""
    arrays = [(np.asarray(a), np.asarray(b)) for a, b in rounds if a]
    if len(arrays) < 2:
        return (math.nan, math.nan)
    d = np.empty(2000)
    for i, pick in enumerate(rng.integers(0, len(arrays), (len(d), len(arrays)))):
        xa = np.concatenate([arrays[k][0] for k in pick])
        xb = np.concatenate([arrays[k][1] for k in pick])
        d[i] = np.percentile(xa, q) - np.percentile(xb, q)
    lo, hi = np.percentile(d, [2.5, 97.5])
    return float(lo), float(hi)


def paired_ttfts(
    rounds_a: list[list[Outcome]], rounds_b: list[list[Outcome]]
) -> tuple[list[float], list[float]]:
    """TTFTs of the arrivals both modes served without error, aligned pair by pair, round by round."""
    a, b = [], []
    for ra, rb in zip(rounds_a, rounds_b, strict=True):
        for oa, ob in zip(ra, rb, strict=True):
            if oa.error is None and ob.error is None:
                a.append(oa.ttft_s)
                b.append(ob.ttft_s)
    return a, b


# ---- CPU accounting -----------------------------------------------------------------------------------

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


# ---- processes ----------------------------------------------------------------------------------------


def ensure_vllm_router(log: Path) -> tuple[Path | None, str]:
    """(path of the vllm-router executable, note); None when it is not installed and cannot be."""
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
        return exe, f"vllm-router {VLLM_ROUTER_VERSION} from {BENCH_VENV}"
    print(f"installing vllm-router=={VLLM_ROUTER_VERSION} into {BENCH_VENV} ...", file=sys.stderr, flush=True)
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(BENCH_VENV)],
        [str(py), "-m", "pip", "install", "--quiet", f"vllm-router=={VLLM_ROUTER_VERSION}"],
    ]
    with log.open("ab") as f:
        for argv in steps:
            try:
                r = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, timeout=600)
            except (OSError, subprocess.TimeoutExpired) as e:
                return None, f"vllm-router NOT MEASURED, not installed ({' '.join(argv[-3:])}: {e})"
            if r.returncode != 0:
                return (
                    None,
                    f"vllm-router not installed: `{' '.join(argv)}` exited {r.returncode} (see {log})",
                )
    if not installed():
        return (
            None,
            f"vllm-router NOT MEASURED, not installed: {exe} missing or the wrong version after pip install",
        )
    return exe, f"vllm-router {VLLM_ROUTER_VERSION} installed into {BENCH_VENV}"


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


# ---- phases -------------------------------------------------------------------------------------------


def rotated(items: list[T], k: int) -> list[T]:
    return items[k % len(items) :] + items[: k % len(items)]


def unloaded(bench: Bench, modes: list[str], requests: int, rounds: int) -> dict[str, dict[str, Any]]:
    """Sequential requests (one at a time), in rounds with the mode order rotated."""
    per_round = max(1, requests // rounds)
    outs: dict[str, list[Outcome]] = {m: [] for m in modes}

    async def one(mode: str) -> list[Outcome]:
        with bench.serving(mode) as target:
            async with new_session() as s:
                return (await run_sequential(s, target, per_round + 2, bench.salts))[2:]  # 2 warm-ups

    for k in range(rounds):
        for mode in rotated(modes, k):
            outs[mode] += aio.run(one(mode))
    res = {}
    for mode in modes:
        t = ok_ttfts(outs[mode])
        e2e = [o.done_s - o.scheduled_s for o in outs[mode] if o.error is None]
        res[mode] = {
            "requests": len(outs[mode]),
            "errors": len(errors_of(outs[mode])),
            "first_errors": errors_of(outs[mode])[:3],
            "ttft_p50_ms": pct(t, 50) * 1e3,
            "ttft_p90_ms": pct(t, 90) * 1e3,
            "ttft_p99_ms": pct(t, 99) * 1e3,
            "e2e_p50_ms": pct(e2e, 50) * 1e3,
        }
        if mode != "direct":
            base = ok_ttfts(outs["direct"])
            brng = np.random.default_rng(0)
            for q in (50, 99):
                res[mode][f"added_p{q}_ms"] = (pct(t, q) - pct(base, q)) * 1e3
                lo, hi = bootstrap_diff(t, base, q, brng)
                res[mode][f"added_p{q}_ci95_ms"] = [lo * 1e3, hi * 1e3]
    return res


def summarize_step(
    outs: list[Outcome], t0: float, rate: float, duration_s: float, e2e0_s: float, bound_s: float
) -> dict[str, Any]:
    errs = errors_of(outs)
    done = [o for o in outs if o.error is None]
    t = ok_ttfts(outs)
    last = max((o.done_s for o in done), default=t0)
    span = max(duration_s, last - t0 - e2e0_s)
    offered = len(outs) / duration_s
    achieved = len(done) / span
    p99 = pct(t, 99)
    reasons = []
    if errs:
        reasons.append(f"{len(errs)} errors (first: {errs[0]})")
    if achieved < ACHIEVED_MIN * offered:
        reasons.append(f"achieved {achieved:.1f} < {ACHIEVED_MIN:.0%} of offered {offered:.1f}")
    if not p99 < bound_s:
        reasons.append(f"p99 TTFT {p99 * 1e3:.0f} ms over the {bound_s * 1e3:.0f} ms bound")
    return {
        "rate": rate,
        "requests": len(outs),
        "offered_rps": offered,
        "achieved_rps": achieved,
        "errors": len(errs),
        "ttft_p50_ms": pct(t, 50) * 1e3,
        "ttft_p99_ms": p99 * 1e3,
        "send_lag_p99_ms": pct([o.sent_s - o.scheduled_s for o in outs], 99) * 1e3,
        "sustained": not reasons,
        "why_not": "; ".join(reasons),
    }


@dataclass
class RampState:
    """One mode's search for its highest sustained rate."""

    mode: str
    rate: float = START_RATE
    factor: float = COARSE_FACTOR
    best: float | None = None
    failed_at: float = math.inf
    retrying: bool = False
    done: bool = False
    steps: list[dict[str, Any]] = field(default_factory=list)
    redos: int = 0  # disturbed runs of the current step
    disturbed: list[dict[str, Any]] = field(default_factory=list)

    def record(self, res: dict[str, Any]) -> None:
        res["retry"] = self.retrying
        self.steps.append(res)
        if res["sustained"]:
            self.best, self.retrying = self.rate, False
            self.rate *= self.factor
        elif not self.retrying:
            self.retrying = True  # once more at the same rate: one bad step on a shared VM may be noise
            return
        else:
            self.retrying = False
            self.failed_at = min(self.failed_at, self.rate)
            if self.factor == COARSE_FACTOR and self.best is not None:
                self.factor = FINE_FACTOR
                self.rate = self.best * self.factor
            else:
                self.done = True
        if self.rate > MAX_RATE or self.rate >= self.failed_at * 0.999:
            self.done = True


def step_arrivals(seed: int, rate: float, duration_s: float, retry: bool) -> list[float]:
    """A ramp step's arrival schedule: the same for every mode at a given rate and try (common random
    numbers). Near saturation, p99 TTFT depends on the arrivals' bursts more than on anything else, so
    with a schedule of its own each mode's last steps were a draw of its own luck."""
    return poisson(rate, duration_s, random.Random(f"{seed}/{rate:.3f}/{int(retry)}"))


def ramp(
    bench: Bench, modes: list[str], duration_s: float, e2e0_s: dict[str, float], bound_s: float, seed: int
) -> dict[str, dict[str, Any]]:
    """Every mode's rate search, interleaved: each round runs the next step of every mode not yet done,
    each step with its proxy started afresh, so slow drifts in the machine's load hit all modes alike."""
    states = [RampState(m) for m in modes]
    warnings = {m: 0 for m in modes}

    async def step(st: RampState) -> dict[str, Any]:
        arrivals = step_arrivals(seed, st.rate, duration_s, st.retrying)
        with bench.serving(st.mode) as target:
            async with new_session() as s:  # the proxy's first requests, and ours, are not measured
                await run_sequential(s, target, 3, bench.salts)
            meter = bench.meter(target)
            async with new_session() as s:
                meter.start()
                outs, t0 = await run_schedule(s, target, arrivals, bench.salts)
                used = meter.stop()
        res = summarize_step(outs, t0, st.rate, duration_s, e2e0_s[st.mode], bound_s)
        res["cpu"] = cpu_summary(used, len(outs))
        await asyncio.sleep(0.5)
        return res

    k = 0
    while not all(st.done for st in states):
        for st in rotated(states, k):
            if st.done:
                continue
            before = bench.handoff_warnings()
            res = aio.run(step(st))
            warnings[st.mode] += bench.handoff_warnings() - before
            disturbed = (
                not res["sustained"]
                and res["cpu"]["others_cores"] > OTHERS_LIMIT_CORES
                and st.redos < MAX_REDO
            )
            note = " (disturbed: run again)" if disturbed else " (retry)" if st.retrying else ""
            print(f"  {st.mode:>11} {_step_line(res)}{note}", file=sys.stderr, flush=True)
            if disturbed:
                st.redos += 1
                st.disturbed.append(res)
            else:
                st.redos = 0
                st.record(res)
        k += 1
    return {
        st.mode: {
            "steps": st.steps,
            "sustained_rps": st.best,
            "handoff_warnings": warnings[st.mode],
            "disturbed_steps_set_aside": st.disturbed,
        }
        for st in states
    }


def _step_line(r: dict[str, Any]) -> str:
    return (
        f"rate {r['rate']:7.1f}: offered {r['offered_rps']:7.1f} achieved {r['achieved_rps']:7.1f} "
        f"p50 {r['ttft_p50_ms']:7.1f} p99 {r['ttft_p99_ms']:7.1f} ms lag99 {r['send_lag_p99_ms']:6.1f} ms "
        f"cores e/p/c/o {_cores(r['cpu'])} "
        f"{'ok' if r['sustained'] else 'FAIL ' + r['why_not']}"
    )


def _cores(cpu: dict[str, float]) -> str:
    return "/".join(f"{cpu[f'{k}_cores']:.2f}" for k in PARTS)


def added_ttft(
    mine: list[list[Outcome]],
    my_rounds: list[dict[str, Any]],
    base: list[list[Outcome]],
    base_rounds: list[dict[str, Any]],
    rng: np.random.Generator,
) -> dict[str, Any]:
    """A mode's added TTFT over ``direct``, from the rounds neither ran disturbed; every round's own added
    p50/p99 is written into its entry of ``my_rounds``."""
    by_round: list[tuple[list[float], list[float]]] = []
    for stats, base_stats, got, got_base in zip(my_rounds, base_rounds, mine, base, strict=True):
        ra, rb = paired_ttfts([got], [got_base])
        if ra:
            stats["added_p50_ms"] = (pct(ra, 50) - pct(rb, 50)) * 1e3
            stats["added_p99_ms"] = (pct(ra, 99) - pct(rb, 99)) * 1e3
        if not (stats["disturbed"] or base_stats["disturbed"]):
            by_round.append((ra, rb))
    row: dict[str, Any] = {"rounds_compared": len(by_round)}
    a = [x for ra, _ in by_round for x in ra]
    b = [x for _, rb in by_round for x in rb]
    if not a:
        return row
    row["pairs"] = len(a)
    row["pair_correlation"] = float(np.corrcoef(a, b)[0, 1])
    for q in (50, 99):
        row[f"added_p{q}_ms"] = (pct(a, q) - pct(b, q)) * 1e3
        lo, hi = bootstrap_rounds_diff(by_round, q, rng)
        row[f"added_p{q}_ci95_ms"] = [lo * 1e3, hi * 1e3]
        # the interval of runs 5 - 8 (pairs resampled as if independent), for comparison with them
        lo, hi = bootstrap_paired_diff(a, b, q, rng)
        row[f"added_p{q}_ci95_pairs_ms"] = [lo * 1e3, hi * 1e3]
        # what the interval would be with the pairing ignored, for comparison with earlier runs
        lo, hi = bootstrap_diff(a, b, q, rng)
        row[f"added_p{q}_ci95_unpaired_ms"] = [lo * 1e3, hi * 1e3]
        row[f"ratio_p{q}"] = pct(a, q) / pct(b, q)
    return row


def fixed_rate(
    bench: Bench, modes: list[str], rate: float, requests: int, rounds: int, seed: int
) -> dict[str, Any]:
    """TTFT of each mode at one rate, interleaved in rounds; added p50/p99 against ``direct``.

    Every mode gets the same arrival schedule in a round (common random numbers), so request i of a
    mode and request i of ``direct`` make a pair; the added-TTFT interval resamples those pairs."""
    rng = random.Random(seed)
    per_round = max(1, requests // rounds)
    schedules = [(poisson(rate, WARMUP_S, rng), poisson_n(rate, per_round, rng)) for _ in range(rounds)]
    outs: dict[str, list[list[Outcome]]] = {m: [] for m in modes}
    warnings: dict[str, int] = {m: 0 for m in modes}
    cpu: dict[str, dict[str, float]] = {m: {} for m in modes}
    set_aside: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    round_stats: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}

    async def one(mode: str, k: int) -> tuple[list[Outcome], dict[str, float]]:
        warmup, arrivals = schedules[k]
        with bench.serving(mode) as target:
            meter = bench.meter(target)
            async with new_session() as s:
                await run_schedule(s, target, warmup, bench.salts)
                meter.start()
                got, _ = await run_schedule(s, target, arrivals, bench.salts)
                used = meter.stop()
        await asyncio.sleep(0.5)
        return got, used

    for k in range(rounds):
        for mode in rotated(modes, k):
            for attempt in range(MAX_REDO + 1):
                before = bench.handoff_warnings()
                got, used = aio.run(one(mode, k))
                warnings[mode] += bench.handoff_warnings() - before
                others = cpu_summary(used, len(got))["others_cores"]
                lag = pct([o.sent_s - o.scheduled_s for o in got], 99)
                t = ok_ttfts(got)
                line = (
                    f"  rate {rate:.1f} round {k + 1}/{rounds} {mode}: p50 {pct(t, 50) * 1e3:.1f} "
                    f"p99 {pct(t, 99) * 1e3:.1f} ms, lag99 {lag * 1e3:.1f} ms, others {others:.2f} cores"
                )
                if (others > OTHERS_LIMIT_CORES or lag > LAG_LIMIT_S) and attempt < MAX_REDO:
                    print(line + " (disturbed: run again)", file=sys.stderr, flush=True)
                    set_aside[mode].append(
                        {
                            "round": k + 1,
                            "others_cores": others,
                            "send_lag_p99_ms": lag * 1e3,
                            "ttft_p50_ms": pct(t, 50) * 1e3,
                            "ttft_p99_ms": pct(t, 99) * 1e3,
                        }
                    )
                    continue
                disturbed = others > OTHERS_LIMIT_CORES or lag > LAG_LIMIT_S
                print(line + (" (disturbed: left out)" if disturbed else ""), file=sys.stderr, flush=True)
                outs[mode].append(got)
                round_stats[mode].append(
                    {
                        "round": k + 1,
                        "ttft_p50_ms": pct(t, 50) * 1e3,
                        "ttft_p99_ms": pct(t, 99) * 1e3,
                        "send_lag_p99_ms": lag * 1e3,
                        "others_cores": others,
                        "disturbed": disturbed,
                    }
                )
                for key, v in used.items():
                    cpu[mode][key] = cpu[mode].get(key, 0.0) + v
                break
    brng = np.random.default_rng(seed)
    res: dict[str, Any] = {"rate": rate, "modes": {}}
    for mode in modes:
        every = [o for got in outs[mode] for o in got]
        t = ok_ttfts(every)
        row: dict[str, Any] = {
            "requests": len(every),
            "errors": len(errors_of(every)),
            "first_errors": errors_of(every)[:3],
            "handoff_warnings": warnings[mode],
            "ttft_p50_ms": pct(t, 50) * 1e3,
            "ttft_p99_ms": pct(t, 99) * 1e3,
            "send_lag_p99_ms": pct([o.sent_s - o.scheduled_s for o in every], 99) * 1e3,
            "cpu": cpu_summary(cpu[mode], len(every)),
            "disturbed_rounds_set_aside": set_aside[mode],
            "rounds": round_stats[mode],
        }
        if mode != "direct":
            row.update(added_ttft(outs[mode], row["rounds"], outs["direct"], round_stats["direct"], brng))
        res["modes"][mode] = row
    return res


def source_fingerprint() -> str:
    """A hash of calroute's sources: others edit the tree while benchmarks run, so say which code ran."""
    h = hashlib.sha256()
    for f in sorted((REPO / "src" / "calroute").rglob("*.py")):
        h.update(f.relative_to(REPO).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def git_head() -> str | None:
    try:
        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    except OSError:
        return None
    return r.stdout.strip() or None


# ---- main ---------------------------------------------------------------------------------------------


def run(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    router_exe, router_note = (None, "vllm-router NOT MEASURED (--no-vllm-router)")
    if not args.no_vllm_router:
        router_exe, router_note = ensure_vllm_router(log_dir / "vllm-router-install.log")
    print(router_note, file=sys.stderr, flush=True)
    modes = [m for m in MODES if m != "vllm-router" or router_exe is not None]
    result: dict[str, Any] = {
        "config": {
            "prefill": args.prefill,
            "decode": args.decode,
            "prompt_tokens": PROMPT_TOKENS,
            "output_tokens": OUTPUT_TOKENS,
            "time_scale": 1.0,
            "duration_s": args.duration_s,
            "requests": args.requests,
            "unloaded_requests": args.unloaded,
            "rounds": args.rounds,
            "calroute_policy": args.calroute_policy,
            "vllm_router": router_note,
            "cpus": os.cpu_count(),
            "git_head": git_head(),
            "calroute_sources_at_start": source_fingerprint(),
        },
        "modes_measured": modes,
    }
    cluster = up_emulated(args.prefill, args.decode, log_dir, time_scale=1.0, stream_interval=1)
    try:
        cluster_path = log_dir / "cluster.yaml"
        cluster.file.save(cluster_path)
        bench = Bench(cluster, cluster_path, log_dir, router_exe, args.calroute_policy)
        print("unloaded (sequential requests)", file=sys.stderr, flush=True)
        result["load_average_at_start"] = list(os.getloadavg())
        result["unloaded"] = unloaded(bench, modes, args.unloaded, args.rounds)
        for m in modes:
            print(f"  {m:>11}: {json.dumps(result['unloaded'][m])}", file=sys.stderr, flush=True)
        bound_s = TTFT_BOUND_X * result["unloaded"]["direct"]["ttft_p50_ms"] / 1e3
        result["ttft_bound_ms"] = bound_s * 1e3
        print(f"sustainable rate (p99 TTFT bound {bound_s * 1e3:.0f} ms)", file=sys.stderr, flush=True)
        e2e0_s = {m: result["unloaded"][m]["e2e_p50_ms"] / 1e3 for m in modes}
        result["ramp"] = ramp(bench, modes, args.duration_s, e2e0_s, bound_s, args.seed)
        direct_best = result["ramp"]["direct"]["sustained_rps"]
        result["at_rate"] = []
        if direct_best is None:
            return result
        rates = [direct_best / 2]
        for m in modes[1:]:
            own = result["ramp"][m]["sustained_rps"]
            # proxies that sustain the same rate share one block at its half
            if own is not None and not any(math.isclose(own / 2, r) for r in rates):
                rates.append(own / 2)
        for k, rate in enumerate(rates):
            which = (
                modes
                if k == 0
                else ["direct"]
                + [m for m in modes[1:] if math.isclose(result["ramp"][m]["sustained_rps"] or 0.0, rate * 2)]
            )
            print(f"TTFT at {rate:.1f} req/s ({', '.join(which)})", file=sys.stderr, flush=True)
            result["at_rate"].append(
                fixed_rate(bench, which, rate, args.requests, args.rounds, args.seed + 100 + k)
            )
    finally:
        cluster.stop()
        result["load_average_at_end"] = list(os.getloadavg())
        result["calroute_sources_at_end"] = source_fingerprint()
    return result


def verdict(added_ms: float, ci_ms: list[float], limit_ms: float) -> str:
    """Met only when the whole 95 % interval is under the limit; missed when all of it is at or over."""
    where = f"{added_ms:+.2f} ms (95 % CI {ci_ms[0]:+.2f} .. {ci_ms[1]:+.2f}) vs < {limit_ms:g} ms"
    if ci_ms[1] < limit_ms:
        return f"met: {where}"
    if ci_ms[0] >= limit_ms:
        return f"missed: {where}"
    return f"not resolved: {where}"


def targets(result: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for at in result.get("at_rate", []):
        cr = at["modes"].get("calroute", {})
        key = f"at {at['rate']:.1f} req/s"
        rounds = len(cr.get("rounds", []))
        if "rounds_compared" in cr and cr["rounds_compared"] * 2 < rounds:
            why = f"not judged: only {cr['rounds_compared']} of {rounds} rounds undisturbed in both modes"
            out[f"added p50 < 1 ms {key}"] = out[f"added p99 < 5 ms {key}"] = why
        elif "added_p50_ms" in cr:
            out[f"added p50 < 1 ms {key}"] = verdict(cr["added_p50_ms"], cr["added_p50_ci95_ms"], 1.0)
            out[f"added p99 < 5 ms {key}"] = verdict(cr["added_p99_ms"], cr["added_p99_ci95_ms"], 5.0)
    ramp_ = result.get("ramp", {})
    if "vllm-router" in ramp_ and "calroute" in ramp_:
        mine, theirs = ramp_["calroute"]["sustained_rps"] or 0.0, ramp_["vllm-router"]["sustained_rps"] or 0.0
        where = f"calroute {mine:.1f} vs vllm-router {theirs:.1f} req/s"
        if mine > 0 and theirs > 0:
            where += (
                f" ({math.log(mine / theirs) / math.log(FINE_FACTOR):+.1f} fine steps of x{FINE_FACTOR:.3f})"
            )
        out["sustainable rate >= vllm-router's"] = f"{'met' if mine >= theirs else 'missed'}: {where}"
    elif "calroute" in ramp_:
        out["sustainable rate >= vllm-router's"] = "not measured: vllm-router unavailable"
    return out


def print_table(result: dict[str, Any]) -> None:
    cfg = result["config"]
    print(
        f"proxy overhead: {cfg['prefill']}P+{cfg['decode']}D emulated, {cfg['prompt_tokens']}-token prompts, "
        f"{cfg['output_tokens']} output tokens, {cfg['cpus']} CPUs; {cfg['vllm_router']}"
    )
    print("\nunloaded (sequential requests):")
    print(
        f"{'mode':>12} {'n':>5} {'err':>4} {'TTFT p50':>9} {'p90':>8} {'p99':>8} "
        f"{'added p50':>10} {'added p99':>10}"
    )
    for m, u in result.get("unloaded", {}).items():
        line = f"{m:>12} {u['requests']:5d} {u['errors']:4d} {u['ttft_p50_ms']:9.2f} {u['ttft_p90_ms']:8.2f}"
        line += f" {u['ttft_p99_ms']:8.2f}"
        if "added_p50_ms" in u:
            lo, hi = u["added_p50_ci95_ms"]
            line += f" {u['added_p50_ms']:+10.2f} {u['added_p99_ms']:+10.2f}  (p50 CI {lo:+.2f} .. {hi:+.2f})"
        print(line)
    if "ramp" in result:
        print(f"\nsustainable rate (p99 TTFT bound {result['ttft_bound_ms']:.0f} ms):")
        for m, r in result["ramp"].items():
            best = r["sustained_rps"]
            # the step that ended the search: failed, and failed again on its retry
            stops = [st for st in r["steps"] if st.get("retry") and not st["sustained"]]
            last = stops[-1] if stops else None
            line = f"{m:>12} {'-' if best is None else f'{best:.1f}':>7} req/s"
            line += f", handoff warnings {r['handoff_warnings']}"
            line += f", disturbed steps set aside {len(r.get('disturbed_steps_set_aside', []))}"
            if last is not None:
                line += f"; stopped at {last['rate']:.1f}: {last['why_not']}"
                line += f" (cores e/p/c/o {_cores(last['cpu'])})"
            print(line)
    for at in result.get("at_rate", []):
        print(f"\nTTFT at {at['rate']:.1f} req/s (ms; CI: 95 % bootstrap):")
        print(
            f"{'mode':>12} {'n':>5} {'err':>4} {'p50':>8} {'p99':>8} {'added p50 (CI)':>27} "
            f"{'added p99 (CI)':>27} {'p50 x':>6} {'p99 x':>6} {'lag99':>6}  cpu ms/req e/p/c, others cores"
        )
        for m, r in at["modes"].items():
            line = (
                f"{m:>12} {r['requests']:5d} {r['errors']:4d} {r['ttft_p50_ms']:8.2f} {r['ttft_p99_ms']:8.2f}"
            )
            if "added_p50_ms" in r:
                for q in (50, 99):
                    lo, hi = r[f"added_p{q}_ci95_ms"]
                    line += f" {r[f'added_p{q}_ms']:+8.2f} ({lo:+7.2f}, {hi:+7.2f})"
                line += f" {r['ratio_p50']:6.3f} {r['ratio_p99']:6.3f}"
            else:
                line += f" {'(baseline)':>27} {'':>27} {'':>6} {'':>6}"
            c = r["cpu"]
            cpu = "/".join(f"{c[f'{k}_cpu_ms_per_req']:.2f}" for k in PARTS[:3])
            aside = len(r.get("disturbed_rounds_set_aside", []))
            if "rounds_compared" in r:
                aside_note = f", rounds compared {r['rounds_compared']}/{len(r['rounds'])}"
            else:
                aside_note = (
                    f", disturbed rounds {sum(x.get('disturbed', False) for x in r.get('rounds', []))}"
                )
            p50s = [x["ttft_p50_ms"] for x in r.get("rounds", [])]
            spread = f"; round p50s {min(p50s):.1f} .. {max(p50s):.1f}" if p50s else ""
            added = [x["added_p50_ms"] for x in r.get("rounds", []) if "added_p50_ms" in x]
            if added:
                spread += f", round added p50s {min(added):+.2f} .. {max(added):+.2f}"
            print(
                line
                + f" {r['send_lag_p99_ms']:6.1f}  {cpu}, {c['others_cores']:.2f}; set aside {aside}"
                + aside_note
                + spread
            )
    print("\ntargets:")
    for k, v in result.get("targets", {}).items():
        print(f"  {k}: {v}")
    print(
        f"load average at start {result.get('load_average_at_start')}, "
        f"at end {result.get('load_average_at_end')}"
    )
    print(
        f"calroute sources: {cfg.get('calroute_sources_at_start')} at start, "
        f"{result.get('calroute_sources_at_end')} at end"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefill", type=int, default=1)
    ap.add_argument("--decode", type=int, default=1)
    ap.add_argument("--duration-s", type=float, default=10.0, help="length of each ramp step")
    ap.add_argument("--requests", type=int, default=12000, help="measured requests per mode at a fixed rate")
    ap.add_argument("--unloaded", type=int, default=200, help="sequential requests per mode, unloaded")
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument(
        "--calroute-policy",
        default="round_robin",
        help="calroute's policy (default: the routing of the other modes)",
    )
    ap.add_argument("--no-vllm-router", action="store_true", help="measure direct and calroute only")
    ap.add_argument("--quick", action="store_true", help="smoke run: 3 s steps, 200 requests, 2 rounds")
    ap.add_argument("--log-dir", type=Path, help="keep engine and proxy logs here (default: a temp dir)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.duration_s, args.requests, args.unloaded, args.rounds = 3.0, 200, 20, 2
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        if args.log_dir is None:
            log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="proxy-overhead-")))
        else:
            log_dir = args.log_dir
            log_dir.mkdir(parents=True, exist_ok=True)
        result = run(args, log_dir)
    result["targets"] = targets(result)
    result["wall_s"] = time.monotonic() - started
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)
    sys.stdout.flush()


if __name__ == "__main__":
    run_script(main)  # a timeout or kill stops the engines and proxies this started, too
