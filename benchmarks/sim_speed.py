"""Simulator throughput: simulated requests per wall-second, 2P+4D, mixed-bursty, 50,000 requests.

The run streams its records to a temporary JSONL file (as `calroute simulate --out` does) and reports the
process's peak RSS. Baseline in the same script: the same simulator with decode advanced one event per
step (iteration-level, like Vidur or SplitwiseSim) on the first 5,000 requests; the ratio is what the
closed-form stretches buy. The rate is round-robin's saturation point (found first, not timed).
Targets (issue 2): >= 50,000 requests/s on one core, peak memory < 500 MB.
Usage: python benchmarks/sim_speed.py [--requests N] [--json]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

from calroute.costmodel.profiles import get_profile
from calroute.sim.compare import SimSetup, saturate
from calroute.sim.simulator import ClusterShape
from calroute.workload.source import FamilyWorkload


def timed_run(
    setup: SimSetup, requests: int, rate: float, stretch: int | None, out: Path
) -> tuple[float, int]:
    from calroute.costmodel.predictors import make_predictor
    from calroute.ledger import Ledger
    from calroute.metrics import SummaryAccumulator
    from calroute.policies import make_policy
    from calroute.records import RecordWriter
    from calroute.router import Router
    from calroute.sim.simulator import ClusterSim

    reqs = FamilyWorkload("mixed-bursty", requests).requests(rate, seed=0)
    cal = setup.router_calibration
    ledger = Ledger(setup.shape.instances(setup.profile.limits.kv_capacity_tokens), cal)
    router = Router(make_policy("marginal_cost", {}, cal), make_predictor("bucket"), ledger)
    sim = ClusterSim(setup.profile, setup.shape, router, "marginal_cost", max_stretch_steps=stretch)
    acc = SummaryAccumulator(setup.profile.calibration.slo)
    with out.open("w") as f:
        writer = RecordWriter(f, flush_every=1024)

        def sink(rec: object) -> None:
            acc.add(rec)  # type: ignore[arg-type]
            writer.write(rec)  # type: ignore[arg-type]

        t0 = time.perf_counter()
        stats = sim.run(reqs, sink)
        elapsed = time.perf_counter() - t0
    return stats.requests / elapsed, stats.events


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=50_000)
    ap.add_argument("--baseline-requests", type=int, default=5_000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    hw = get_profile("a40-qwen2.5-3b")
    setup = SimSetup(profile=hw, shape=ClusterShape(2, 4), router_calibration=hw.calibration)
    rate = saturate(setup, FamilyWorkload("mixed-bursty", 2000)).rate_rps
    with tempfile.TemporaryDirectory() as tmp:
        fast_rps, fast_events = timed_run(setup, args.requests, rate, None, Path(tmp) / "fast.jsonl")
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        base_rps, base_events = timed_run(setup, args.baseline_requests, rate, 1, Path(tmp) / "base.jsonl")
    result = {
        "requests": args.requests,
        "rate_rps": rate,
        "requests_per_s": fast_rps,
        "events_per_request": fast_events / args.requests,
        "peak_rss_mb": peak_mb,
        "baseline_iteration_level_requests_per_s": base_rps,
        "baseline_events_per_request": base_events / args.baseline_requests,
        "speedup_vs_iteration_level": fast_rps / base_rps,
    }
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>42}: {v:,.2f}" if isinstance(v, float) else f"{k:>42}: {v}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
