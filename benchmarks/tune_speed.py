"""Tuning speed: the same study (mixed-bursty 2P+4D, seed 0, K trials, `calroute tune`'s defaults otherwise,
no validation) timed on each executor given, each from an empty study in a fresh temporary directory.

Reports wall time per executor (the saturation search and the trials apart), the ratio of each to the run
with one worker of the same kind (else the first run), and whether every run found the same best parameters
(the study is deterministic across executors and worker counts: a mismatch is a bug, not noise).
Targets (issue 26): 200 trials in under 15 minutes on this 2-core machine; Ray with 2 workers at least 1.6x
faster than with 1. The simulator runs as the environment gives it: PYTHONPATH=build/compiled for the
compiled build (the workers inherit it).
Usage: python benchmarks/tune_speed.py [--trials K] [--executors local:1,local:2,ray:1,ray:2] [--json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import calroute.sim.decode
from calroute.costmodel.profiles import DEFAULT_PROFILE, get_profile
from calroute.errors import ConfigError
from calroute.executors import make_executor
from calroute.tuning.config import TuneConfig, WorkloadSpec
from calroute.tuning.tune import Hooks, tune

if __package__ in (None, ""):  # run as a script (python benchmarks/NAME.py): the benchmarks package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.machine import dated_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def parse_executors(spec: str) -> list[tuple[str, int]]:
    out = []
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        kind, _, workers = item.partition(":")
        try:
            out.append((kind, int(workers or "1")))
        except ValueError as e:
            raise SystemExit(f"--executors: {item!r} is not KIND:WORKERS, e.g. local:2") from e
    return out


def cpu_s() -> float:
    """User and system CPU seconds of this process and its reaped children (spawned pool workers)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def time_study(
    config: TuneConfig, trials: int, kind: str, workers: int, address: str | None
) -> dict[str, Any]:
    marks: dict[str, float] = {}

    def on_phase(name: str, _: int | None) -> None:
        marks[name] = time.perf_counter()

    profile = get_profile(DEFAULT_PROFILE)
    with tempfile.TemporaryDirectory() as tmp:
        cpu0 = cpu_s()
        t0 = time.perf_counter()
        try:
            with make_executor(kind, workers, address if kind == "ray" else None) as ex:
                result = tune(
                    config,
                    profile,
                    trials,
                    Path(tmp) / "p.study.db",
                    Path(tmp) / "p.json",
                    ex,
                    validation_seed_count=0,
                    hooks=Hooks(on_phase=on_phase),
                )
        except ConfigError as e:
            return {"executor": kind, "workers": workers, "error": str(e)}
        end = time.perf_counter()
        cpu = cpu_s() - cpu0  # the pool's workers are reaped when the executor closes: counted
    t = result.doc["training"]
    return {
        "executor": kind,
        "workers": workers,
        "wall_s": end - t0,
        "saturation_s": marks["trials"] - t0,
        "trials_s": end - marks["trials"],
        # CPU seconds of this process and its workers, and the cores' worth it got: on a shared machine a
        # wall time means little without them
        "cpu_s": cpu,
        "cores_used": cpu / (end - t0),
        "best_objective": t["best_objective"],
        "best_trial": t["best_trial"],
        "params": {n: result.doc["params"][n] for n in t["space"]},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--executors", default="local:1,local:2")
    ap.add_argument("--address", default=None, help="a Ray cluster to join for the ray runs")
    ap.add_argument("--requests", type=int, default=3000, help="requests per run (calroute tune's default)")
    ap.add_argument("--seeds", type=int, default=4, help="training seeds (calroute tune's default)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args()
    config = TuneConfig(
        "marginal_cost",
        (WorkloadSpec("mixed-bursty", args.requests),),
        prefill=2,
        decode=4,
        train_seeds=tuple(range(args.seeds)),
        calibration_source=f"profile {DEFAULT_PROFILE}",
    )
    runs = []
    for kind, workers in parse_executors(args.executors):
        print(f"{kind}:{workers} ...", file=sys.stderr, flush=True)
        r = time_study(config, args.trials, kind, workers, args.address)
        print(f"  {json.dumps(r)}", file=sys.stderr, flush=True)
        runs.append(r)
    timed = [r for r in runs if "error" not in r]
    for r in timed:
        base = next((b for b in timed if b["executor"] == r["executor"] and b["workers"] == 1), timed[0])
        r["speedup_vs_1_worker"] = base["wall_s"] / r["wall_s"]
        r["baseline"] = f"{base['executor']}:{base['workers']}"
    result = {
        "benchmark": "tune_speed",
        "date": datetime.date.today().isoformat(),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "compiled": not calroute.sim.decode.__file__.endswith(".py"),
        "study": {**config.key(), "trials": args.trials},
        "runs": runs,
        "same_best_params": len({json.dumps(r["params"], sort_keys=True) for r in timed}) <= 1,
        "loadavg_after": os.getloadavg(),
    }
    path = dated_path(RESULTS, "tune_speed", str(result["date"]))
    path.write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result))
    else:
        for r in runs:
            if "error" in r:
                print(f"{r['executor']}:{r['workers']}: {r['error']}")
            else:
                name = f"{r['executor']}:{r['workers']}"
                print(
                    f"{name}: {r['wall_s']:.1f} s (saturation {r['saturation_s']:.1f} s, trials "
                    f"{r['trials_s']:.1f} s), {r['speedup_vs_1_worker']:.2f}x vs {r['baseline']}, "
                    f"{r['cores_used']:.2f} cores used"
                )
        print(f"same best parameters on every executor: {result['same_best_params']}")
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
