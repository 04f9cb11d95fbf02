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
   With ``--log-dir``, every round's requests (every try, its disturbance and whether it counted) are kept
   in requests.jsonl there, for analysis afterwards: ``python -m benchmarks.overhead.bursts
   DIR/requests.jsonl`` tells, per round, whether the pairs a mode lost were spread or one burst.

Other jobs share this VM and come in bursts. A failed ramp step during which they used more than 0.25 cores
over the step or 0.5 cores in any 0.5 s window of it, or a fixed-rate round during which they used more than
0.10 cores over the round or 0.25 in any 0.5 s window, or the client's send lag p99 passed 20 ms, is set
aside (reported, with its figures) and run again, at most 3 times (method.py says why these limits). A
ramp step's last run counts whatever it shows; a fixed-rate round still disturbed on its last run is
reported but left out of the added TTFT of every pair of modes it belongs to (a disturbed ``direct`` round
would flatter every proxy). With fewer than half the rounds left to compare, the latency targets are "not
judged".

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
The code: this file runs the phases of benchmarks/overhead/ (method: the parameters above; client, stats,
cpu, bench, phases, report).

Usage: python benchmarks/proxy_overhead.py [--prefill 1 --decode 1] [--quick] [--duration-s 10]
       [--requests 12000] [--rounds 16] [--log-dir DIR] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from calroute.cluster.launch import up_emulated
from calroute.cluster.procs import run_script
from calroute.results.provenance import git_commit

if __package__ in (None, ""):  # run as a script (python benchmarks/proxy_overhead.py): its parts' package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.overhead.bench import Bench, ensure_vllm_router, source_fingerprint
from benchmarks.overhead.method import MODES, OUTPUT_TOKENS, PROMPT_TOKENS, REPO, TTFT_BOUND_X
from benchmarks.overhead.phases import fixed_rate, ramp, unloaded
from benchmarks.overhead.report import print_table, targets

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
            "git_head": git_commit(REPO, short=True),
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
    ap.add_argument(
        "--log-dir",
        type=Path,
        help="keep the engine and proxy logs here, and requests.jsonl: every fixed-rate round's requests, "
        "one line per mode, round and try (default: a temporary directory, deleted at the end)",
    )
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
