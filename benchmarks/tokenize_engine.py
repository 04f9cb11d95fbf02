"""What the engines' /tokenize costs the proxy as its tokenizer (the cluster file's ``tokenizer: engine``),
against the model's own files in the proxy (``tokenizer: FOLDER``), on real vLLM serving the tiny model.

Cases, interleaved call by call, each timed from the proxy's side (`--calls` after `--warmup`):
  (a) chat_8k_local: the ~8k-token chat of tokenize_speed.py (a ~7k-token system prompt repeated, a ~1k-token
      user turn new each call) through HfTokenizer.prompt_ids, its prefix store as by default;
  (b) chat_8k_engine: the same bodies through EngineTokenizer.prompt_ids_async: an HTTP round trip to the
      prefill engine's /tokenize, which renders and tokenizes the whole prompt every time;
  (c) chat_short_local and (d) chat_short_engine: a ~100-token chat, a different one each call.
Also: whether (b)'s ids equal (a)'s on every body (exactness), and the engine's own CPU time per (b) call
(its API server's process, from /proc: the work the engine spends for the proxy, beside its serving).

Starts 1 prefill + 1 decode vLLM engine (`make vllm` first) unless `--cluster FILE` names running ones.
Writes benchmarks/results/tokenize_engine_DATE.json (`--out`, `--no-write`).
Usage: python benchmarks/tokenize_engine.py [--calls N] [--cluster cluster.yaml] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from calroute.cluster import launch
from calroute.cluster.file import ClusterFile
from calroute.proxy.engine_tokenizer import EngineTokenizer
from calroute.tokenizer.hf import HfTokenizer

if __package__ in (None, ""):  # run as a script (python benchmarks/NAME.py): the benchmarks package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.machine import report_head, save_report  # noqa: E402
from benchmarks.tokenize_speed import (  # noqa: E402
    SHORT_TOKENS,
    SYSTEM_TOKENS,
    TINY_MODEL,
    USER_TOKENS,
    chat,
    percentiles,
    text_of_tokens,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its children that ended (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(fields[i]) for i in (11, 12))  # utime, stime (fields 14, 15 of the full line)
    return ticks / 100.0


async def measure(args: argparse.Namespace, c: ClusterFile, pid: int | None) -> dict[str, Any]:
    local = HfTokenizer(TINY_MODEL)
    engine = EngineTokenizer({c.prefill[0].id: c.prefill[0].url}, max_model_len=1 << 20, timeout_s=30.0)
    raw = Tokenizer.from_file(str(TINY_MODEL / "tokenizer.json"))
    rng = random.Random(0)
    system = text_of_tokens(raw, rng, SYSTEM_TOKENS)
    n = args.warmup + args.calls
    longs = [{**chat(system, text_of_tokens(raw, rng, USER_TOKENS)), "model": c.model} for _ in range(n)]
    shorts = [{**chat(None, text_of_tokens(raw, rng, SHORT_TOKENS)), "model": c.model} for _ in range(n)]
    times: dict[str, list[float]] = {k: [] for k in ("chat_8k_local", "chat_8k_engine")}
    times |= {k: [] for k in ("chat_short_local", "chat_short_engine")}
    equal = True
    engine_cpu_s = 0.0
    for i in range(n):
        for size, bodies in (("8k", longs), ("short", shorts)):
            t0 = time.perf_counter_ns()
            ours = local.prompt_ids(bodies[i], True)
            t1 = time.perf_counter_ns()
            cpu0 = process_cpu_s(pid) if pid is not None else 0.0
            t2 = time.perf_counter_ns()
            theirs = await engine.prompt_ids_async(bodies[i], True)
            t3 = time.perf_counter_ns()
            if pid is not None and i >= args.warmup and size == "8k":
                engine_cpu_s += process_cpu_s(pid) - cpu0
            equal = equal and ours == theirs
            if i >= args.warmup:
                times[f"chat_{size}_local"].append((t1 - t0) / 1e3)
                times[f"chat_{size}_engine"].append((t3 - t2) / 1e3)
    engine.close()
    result: dict[str, Any] = {name: percentiles(us) for name, us in times.items()}
    result["ids_equal"] = equal
    result["tokens_8k"] = len(local.prompt_ids(longs[0], True))
    result["tokens_short"] = len(local.prompt_ids(shorts[0], True))
    if pid is not None:
        result["engine_cpu_ms_per_8k_call"] = engine_cpu_s * 1e3 / args.calls
    return result


def api_server_pid(c: ClusterFile) -> int | None:
    """The prefill engine's API server: its process group's leader (the launcher starts it so)."""
    return c.pgids[0] if c.pgids else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--cluster", type=Path, help="a running real-vLLM cluster file (default: start one)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.calls < 2:
        raise SystemExit("--calls must be at least 2")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        launched = None
        if args.cluster is not None:
            c = ClusterFile.load(args.cluster)
        else:
            print("starting 1 prefill + 1 decode vLLM engine ...", file=sys.stderr)
            launched = launch.up_vllm(1, 1, Path(tmp), repo_root=ROOT)
            c = launched.file
        try:
            result = asyncio.run(measure(args, c, api_server_pid(c)))
        finally:
            if launched is not None:
                launched.stop()
    report = {
        **report_head("tokenize_engine"),
        "calls": args.calls,
        "warmup": args.warmup,
        "wall_s": time.perf_counter() - t0,
        **result,
    }
    if not args.no_write:
        save_report(report, RESULTS, args.out)
    if args.json:
        print(json.dumps(report))
        return
    for name in ("chat_8k_local", "chat_8k_engine", "chat_short_local", "chat_short_engine"):
        r = result[name]
        print(
            f"{name:>18}: p50 {r['p50_us']:9.1f} us, p99 {r['p99_us']:9.1f} us, mean {r['mean_us']:9.1f} us"
        )
    print(f"tokens: {result['tokens_8k']} and {result['tokens_short']}; ids equal: {result['ids_equal']}")
    if "engine_cpu_ms_per_8k_call" in result:
        print(f"engine API server CPU per 8k call: {result['engine_cpu_ms_per_8k_call']:.2f} ms")


if __name__ == "__main__":
    main()
