"""The benchmark's client: request bodies, one request in each mode, open-loop schedules.

Not the package's load generator (``calroute.harness.loadgen.drive``), for three reasons that are the
measurement itself: ``direct``, the baseline every proxy is paired with, is two requests per request (the
prefill engine, then the decode engine with its ``kv_transfer_params``), where ``drive`` sends one to one
URL; the added TTFT is a fraction of a millisecond, below the resolution of ``drive``'s clock (the event
loop's, whole milliseconds on uvloop) and read here on ``time.perf_counter``; and every mode must meet the
same client (the same text prompts, the same stream reading), or the pairs would differ by the client too.
The schedules are the package's (``calroute.workload.arrivals``); what is kept here is the sending.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from benchmarks.overhead.method import MODEL, OUTPUT_TOKENS, PROMPT_TOKENS, REQUEST_TIMEOUT_S
from calroute.contract.handoff import PREFILL_KV_PARAMS
from calroute.emulator.tokens import text_of_tokens


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


def as_columns(outs: list[Outcome]) -> dict[str, list[Any]]:
    """A round's requests as columns for its line in requests.jsonl (ms; None where a request failed)."""

    def ms(x: float) -> float | None:
        return None if math.isnan(x) else round(x * 1e3, 3)

    return {
        "scheduled_s": [round(o.scheduled_s, 6) for o in outs],
        "send_lag_ms": [ms(o.sent_s - o.scheduled_s) for o in outs],
        "ttft_ms": [ms(o.ttft_s) if o.error is None else None for o in outs],
        "e2e_ms": [ms(o.done_s - o.scheduled_s) if o.error is None else None for o in outs],
        "error": [o.error for o in outs],
    }


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


LOOP_LAG_METRIC = "calroute_event_loop_lag_seconds"


def late_timers(exposition: str, over_s: float) -> float | None:
    """How many of calroute's event-loop timers have fired more than ``over_s`` late (a bucket bound of
    the histogram), from its /metrics text; None if the text has no such histogram or bucket."""
    count = under = None
    for line in exposition.splitlines():
        if line.startswith(f"{LOOP_LAG_METRIC}_count "):
            count = float(line.rsplit(" ", 1)[1])
        elif line.startswith(f'{LOOP_LAG_METRIC}_bucket{{le="'):
            if math.isclose(float(line.split('"')[1]), over_s):
                under = float(line.rsplit(" ", 1)[1])
    return None if count is None or under is None else count - under


async def proxy_late_timers(s: aiohttp.ClientSession, target: Target, over_s: float) -> float | None:
    """``late_timers`` of a calroute target so far (None for the other modes: no such metric)."""
    if target.mode != "calroute":
        return None
    async with s.get(f"{target.url}/metrics") as r:
        return late_timers(await r.text(), over_s) if r.status == 200 else None


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
