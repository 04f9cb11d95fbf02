"""Simulator throughput: simulated requests per wall-second, 2P+4D, mixed-bursty, 50,000 requests.

Each run streams its records to a temporary JSONL file (as `calroute simulate --out` does) in a fresh child
process, which reports its own peak RSS. Two builds of the same code are timed, alternately, `--repeats`
times each (medians reported): the compiled build (setup.py, `make compiled`, which this script runs first)
and the pure-Python sources. `requests_per_s` is the compiled build's: the fast path the project ships.
Baseline in the same script: the sources with decode advanced one event per step (iteration-level, like
Vidur or SplitwiseSim) on the first 5,000 requests; the ratio is what the closed-form stretches buy. The
rate is round-robin's saturation point (found first, not timed).
Targets (issue 2): >= 50,000 requests/s on one core, peak memory < 500 MB.
Usage: python benchmarks/sim_speed.py [--requests N] [--repeats K] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from calroute.costmodel.profiles import get_profile
from calroute.experiments.kit.sim_backend import SimSetup, saturate
from calroute.sim.simulator import ClusterShape
from calroute.workload.source import FamilyWorkload

if __package__ in (None, ""):  # run as a script (python benchmarks/NAME.py): the benchmarks package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.machine import machine  # noqa: E402


def timed_run(
    setup: SimSetup, requests: int, rate: float, stretch: int | None, out: Path
) -> tuple[float, int]:
    from calroute.costmodel.predictors import make_predictor
    from calroute.policies import make_policy
    from calroute.results.metrics import RunSink, SummaryAccumulator
    from calroute.results.records import RecordWriter
    from calroute.routing.ledger import Ledger
    from calroute.routing.router import Router
    from calroute.sim.simulator import ClusterSim

    reqs = FamilyWorkload("mixed-bursty", requests).requests(rate, seed=0)
    cal = setup.router_calibration
    ledger = Ledger(setup.shape.instances(setup.profile.limits.kv_capacity_tokens), cal)
    router = Router(make_policy("marginal_cost", {}, cal), make_predictor("bucket"), ledger)
    sim = ClusterSim(setup.profile, setup.shape, router, "marginal_cost", max_stretch_steps=stretch)
    acc = SummaryAccumulator(setup.profile.calibration.slo)
    with out.open("w") as f:
        sink = RunSink(acc, RecordWriter(f, flush_every=1024))
        t0 = time.perf_counter()
        stats = sim.run(reqs, sink)
        elapsed = time.perf_counter() - t0
    return stats.requests / elapsed, stats.events


ROOT = Path(__file__).resolve().parents[1]
COMPILED = ROOT / "build" / "compiled"


def child(requests: int, rate: float, stretch: int | None) -> None:
    """One timed run in this process; prints its figures as one JSON line."""
    import calroute.sim.decode

    hw = get_profile("a40-qwen2.5-3b")
    setup = SimSetup(profile=hw, shape=ClusterShape(2, 4), router_calibration=hw.calibration)
    with tempfile.TemporaryDirectory() as tmp:
        rps, events = timed_run(setup, requests, rate, stretch, Path(tmp) / "records.jsonl")
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    compiled = not calroute.sim.decode.__file__.endswith(".py")
    print(json.dumps({"rps": rps, "events": events, "peak_mb": peak_mb, "compiled": compiled}))


def run_child(requests: int, rate: float, stretch: int | None, compiled: bool) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OPENBLAS_NUM_THREADS"] = "1"  # one core: numpy's BLAS threads would spin beside the run
    if compiled:
        env["PYTHONPATH"] = str(COMPILED)
    cmd = [sys.executable, __file__, "--child", "--requests", str(requests), "--rate", repr(rate)]
    if stretch is not None:
        cmd += ["--stretch", str(stretch)]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, timeout=1800).stdout
    doc: dict[str, float] = json.loads(out.splitlines()[-1])
    if doc["compiled"] != compiled:
        raise SystemExit(f"expected a {'compiled' if compiled else 'source'} run, got the other")
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=50_000)
    ap.add_argument("--baseline-requests", type=int, default=5_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rate", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--stretch", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.requests, args.rate, args.stretch)
        return
    # a no-op when the build is newer than every source; otherwise about a minute
    print("make compiled (the compiled simulator, rebuilt when src/ changed)...", file=sys.stderr)
    subprocess.run(["make", "-s", "compiled"], cwd=ROOT, check=True)
    hw = get_profile("a40-qwen2.5-3b")
    setup = SimSetup(profile=hw, shape=ClusterShape(2, 4), router_calibration=hw.calibration)
    rate = saturate(setup, FamilyWorkload("mixed-bursty", 2000)).rate_rps
    fast: list[dict[str, float]] = []
    source: list[dict[str, float]] = []
    for i in range(args.repeats):
        print(f"repeat {i + 1}/{args.repeats}", file=sys.stderr)
        fast.append(run_child(args.requests, rate, None, compiled=True))
        source.append(run_child(args.requests, rate, None, compiled=False))
    base = run_child(args.baseline_requests, rate, 1, compiled=False)
    fast_rps = statistics.median(r["rps"] for r in fast)
    source_rps = statistics.median(r["rps"] for r in source)
    result = {
        "requests": args.requests,
        "rate_rps": rate,
        "requests_per_s": fast_rps,
        "requests_per_s_runs": [round(r["rps"]) for r in fast],
        "source_requests_per_s": source_rps,
        "source_requests_per_s_runs": [round(r["rps"]) for r in source],
        "compiled_vs_source": fast_rps / source_rps,
        "events_per_request": fast[0]["events"] / args.requests,
        "peak_rss_mb": max(r["peak_mb"] for r in fast + source),
        "baseline_iteration_level_requests_per_s": base["rps"],
        "baseline_events_per_request": base["events"] / args.baseline_requests,
        "source_vs_iteration_level": source_rps / base["rps"],
        "machine": machine(),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>42}: {v:,.2f}" if isinstance(v, float) else f"{k:>42}: {v}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
