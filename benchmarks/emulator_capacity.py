"""Emulator capacity on this machine: how many concurrent streams (and tokens/s) emulated decode engines
serve while their timing stays within 10 % of the hardware profile.

Engines run in one child process (as `calroute engines up` starts them), the client in this one, so the
two use the machine's two cores. For each stream interval and time scale, concurrency doubles until the
median client-measured TPOT strays more than 10 % from the profile's step time for that batch. The ratio
recorded against the baseline is measured / modelled TPOT (1.0 = perfect timing).
Usage: python benchmarks/emulator_capacity.py [--engines 4] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from calroute.cluster.launch import up_emulated
from calroute.cluster.procs import run_script
from calroute.costmodel.profiles import get_profile
from calroute.emulator.tokens import text_of_tokens

PROMPT_TOKENS = 256
OUTPUT_TOKENS = 128
TOLERANCE = 0.10


SKIP_TOKENS = 8  # the first and last tokens share steps with other streams' prefills and departures


async def one_stream(session: aiohttp.ClientSession, url: str, salt: int) -> tuple[float, int]:
    """(client-side TPOT in the steady middle of the stream, tokens) of one streamed request."""
    body = {
        "prompt": text_of_tokens(PROMPT_TOKENS - 1, salt),
        "max_tokens": OUTPUT_TOKENS,
        "ignore_eos": True,
        "stream": True,
        "return_token_ids": True,
    }
    marks = []  # (arrival time, tokens received so far)
    received = 0
    async with session.post(f"{url}/v1/completions", json=body) as r:
        async for line in r.content:
            if line.startswith(b"data: {"):
                received += len(json.loads(line[6:])["choices"][0]["token_ids"])
                marks.append((time.monotonic(), received))
    mid = [m for m in marks if SKIP_TOKENS <= m[1] <= OUTPUT_TOKENS - SKIP_TOKENS]
    (t0, n0), (t1, n1) = mid[0], mid[-1]
    return (t1 - t0) / (n1 - n0), received


async def drive(urls: list[str], per_engine: int) -> tuple[float, float]:
    """(median TPOT, tokens/s) with ``per_engine`` concurrent streams on every engine."""
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as s:
        t0 = time.monotonic()
        results = await asyncio.gather(
            *(one_stream(s, url, i * 1000 + j) for i, url in enumerate(urls) for j in range(per_engine))
        )
        wall = time.monotonic() - t0
    return statistics.median(r[0] for r in results), sum(r[1] for r in results) / wall


def measure(engines: int, time_scale: float, stream_interval: int) -> list[dict[str, Any]]:
    hw = get_profile("a40-qwen2.5-3b")
    cal = hw.calibration
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        launched = up_emulated(
            0 + 1, engines, Path(tmp), time_scale=time_scale, stream_interval=stream_interval
        )
        try:
            urls = [e.url for e in launched.file.decode]
            per_engine = 4
            # beyond what fits in KV (or max_num_seqs) the batch is smaller than the streams: stop there
            fits = min(
                hw.limits.max_num_seqs, hw.limits.kv_capacity_tokens // (PROMPT_TOKENS + OUTPUT_TOKENS)
            )
            while per_engine <= fits:
                tpot, tok_s = asyncio.run(drive(urls, per_engine))
                ctx = per_engine * (PROMPT_TOKENS + OUTPUT_TOKENS // 2)
                modelled = cal.decode.step_s(per_engine, ctx) * time_scale
                ratio = tpot / modelled
                rows.append(
                    {
                        "engines": engines,
                        "time_scale": time_scale,
                        "stream_interval": stream_interval,
                        "streams": per_engine * engines,
                        "tokens_per_s": tok_s,
                        "tpot_ms": tpot * 1e3,
                        "modelled_tpot_ms": modelled * 1e3,
                        "ratio": ratio,
                        "within_tolerance": abs(ratio - 1) <= TOLERANCE,
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
                if abs(ratio - 1) > TOLERANCE:
                    break
                per_engine *= 2
        finally:
            launched.stop()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for time_scale, interval in ((1.0, 1), (1.0, 8), (4.0, 1), (4.0, 8)):
        rows += measure(args.engines, time_scale, interval)
    best: dict[str, Any] = {}
    for r in rows:
        key = f"time_scale={r['time_scale']:g},stream_interval={r['stream_interval']}"
        if r["within_tolerance"] and r["streams"] >= best.get(key, {}).get("streams", 0):
            best[key] = r
    summary = {
        k: {"streams": v["streams"], "tokens_per_s": v["tokens_per_s"], "ratio": v["ratio"]}
        for k, v in best.items()
    }
    print(json.dumps({"max_within_10pct": summary}) if args.json else json.dumps(summary, indent=2))


if __name__ == "__main__":
    run_script(main)  # a timeout or kill stops the engines and proxies this started, too
