"""Experiment wall time by executor: `calroute experiment NAME` (sim) on local:1, local:2, ray:1, ray:2.

Each run is a fresh `python -m calroute experiment ... --executor K --workers N` process into a fresh results
directory, so its wall time includes everything a user waits for: imports, the process pool's or Ray's start
and stop, the saturation searches and the runs. The configurations alternate, ``--repeats`` times each
(medians reported); the ratio is local:1's median over each configuration's (> 1: faster). Ray's fixed cost
(start and stop, nothing run, ray:2) is timed apart. Every run's results.json and saturation.json must be the
same as local:1's (the executors' contract), or the script fails.
Default: heterogeneity (four families on 2P+4D, each saturated on its own: four searches, 32 runs) at 2,000
requests and 2 seeds a run.
Usage: python benchmarks/executor_speed.py [--experiment NAME] [--requests N] [--seeds K] [--quick]
       [--repeats R] [--configs local:1,local:2,ray:1,ray:2] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from calroute.results.provenance import git_commit

if __package__ in (None, ""):  # run as a script (python benchmarks/NAME.py): the benchmarks package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.machine import machine  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def run_once(args: argparse.Namespace, config: str, out: Path) -> tuple[float, dict[str, Any]]:
    """One experiment in a fresh process: its wall time and what it wrote (results and saturation rates)."""
    kind, workers = config.split(":")
    cmd = [sys.executable, "-m", "calroute", "experiment", args.experiment, "--out", str(out)]
    cmd += ["--executor", kind, "--workers", workers]
    if args.quick:
        cmd.append("--quick")
    if args.requests is not None:
        cmd += ["--requests", str(args.requests)]
    if args.seeds is not None:
        cmd += ["--seeds", str(args.seeds)]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=3600)
    wall_s = time.perf_counter() - t0
    exp_dir = out / "sim" / args.experiment
    written = {
        "results": json.loads((exp_dir / "results.json").read_text()),
        "saturation": json.loads((exp_dir / "saturation.json").read_text()),
    }
    return wall_s, written


def ray_start_stop_s(workers: int) -> float:
    """A local Ray instance started and stopped, nothing run: the fixed cost in every ray:N figure."""
    code = (
        "import time; t = time.perf_counter(); from calroute.executors import make_executor; "
        f"make_executor('ray', {workers}).close(); print(time.perf_counter() - t)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=600
    )
    return float(out.stdout.split()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experiment", default="heterogeneity")
    ap.add_argument("--requests", type=int, help="requests a run (default 2,000; --quick: the quick scale's)")
    ap.add_argument("--seeds", type=int, help="seeds a variant (default 2; --quick: the quick scale's)")
    ap.add_argument("--quick", action="store_true", help="the experiment's --quick scale")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--configs", default="local:1,local:2,ray:1,ray:2")
    ap.add_argument("--out", type=Path, help="also write the JSON here (e.g. benchmarks/results/...json)")
    args = ap.parse_args()
    if not args.quick:
        args.requests = args.requests or 2000
        args.seeds = args.seeds or 2
    configs = args.configs.split(",")
    if configs[0] != "local:1":
        raise SystemExit("--configs must start with local:1, the baseline the ratios are against")
    walls: dict[str, list[float]] = {c: [] for c in configs}
    baseline: dict[str, Any] | None = None
    load_before = machine()["load_1m"]
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for config in configs:
                wall_s, written = run_once(args, config, Path(tmp) / f"{config.replace(':', '-')}-{r}")
                if baseline is None:
                    baseline = written
                elif written != baseline:
                    raise SystemExit(f"{config} wrote other results than local:1: the executors disagree")
                walls[config].append(wall_s)
                print(f"{config} repeat {r}: {wall_s:.1f} s", file=sys.stderr)
        ray_fixed_s = (
            [ray_start_stop_s(2) for _ in range(args.repeats)] if any("ray" in c for c in configs) else []
        )
    medians = {c: statistics.median(w) for c, w in walls.items()}
    report = {
        "benchmark": "executor_speed",
        "date": datetime.date.today().isoformat(),
        "git_commit": git_commit(ROOT),
        "machine": {**machine(), "load_1m_before": load_before},
        "experiment": args.experiment,
        "quick": args.quick,
        "requests": args.requests,
        "seeds": args.seeds,
        "repeats": args.repeats,
        "wall_s": walls,
        "median_wall_s": medians,
        "speedup_vs_local_1": {c: medians["local:1"] / m for c, m in medians.items()},
        "ray_start_stop_s": ray_fixed_s,
        "identical_results": True,  # checked above: the script stops otherwise
    }
    if "ray:1" in medians and "ray:2" in medians:
        report["ray_2_vs_ray_1"] = medians["ray:1"] / medians["ray:2"]
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
