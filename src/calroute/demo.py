"""`make demo`: the paper's main experiment, live, in a few minutes on this machine.

Bring up an emulated 2P+4D cluster (A40-like timing), pass the correctness gates, calibrate it, find the
saturation rate on the simulator calibrated to it, run the four policies through the proxy at that rate,
run the same comparison on the calibrated simulator, print both tables, write a report with plots, and
stop every process started.
"""

from __future__ import annotations

import time
from pathlib import Path

from calroute.calibrate.run import calibrate_cluster
from calroute.cli import err, print_table
from calroute.costmodel.profiles import get_profile, profile_from_calibration
from calroute.engines.launch import up_emulated
from calroute.experiments.backends import SimBackend
from calroute.experiments.base import goodput_table, latency_cdfs
from calroute.experiments.cells import Cell, CellResult, Run, baselines_and_product
from calroute.experiments.live import LiveBackend
from calroute.harness.gates import require_gates
from calroute.harness.live import LiveSetup
from calroute.report import plots
from calroute.sim.compare import RunResult
from calroute.sim.simulator import SimStats

LIVE_REQUESTS = 400
SIM_REQUESTS = 2000
CALIBRATION_BUDGET_S = 40.0
COMMAND = "make demo   (calroute demo --out out/demo)"


def _table(result: CellResult, title: str) -> None:
    stats = SimStats(0, 0, 0.0, 0, {})
    print_table(
        [RunResult(r.label, r.seed, result.rate_rps, r.summary, stats, None) for r in result.runs], title
    )


def run_demo(out_dir: Path) -> Path:
    started = time.monotonic()
    out_dir.mkdir(parents=True, exist_ok=True)
    err.print("demo: bringing up an emulated 2 prefill + 4 decode cluster (a40-qwen2.5-3b timing)")
    launched = up_emulated(2, 4, out_dir / "engines")
    try:
        cluster = launched.file
        cluster_path = out_dir / "cluster.yaml"
        cluster.save(cluster_path)
        gates = require_gates(cluster)
        err.print("gates: " + ", ".join(f"{g.name} ok" for g in gates))
        cal, cal_report = calibrate_cluster(cluster, CALIBRATION_BUDGET_S, err.print)
        cal.save(out_dir / "calibration.json")
        profile = get_profile("a40-qwen2.5-3b").calibration
        err.print(
            f"calibrated: tau_pre {cal.tau_pre_s * 1e6:.1f} us (profile {profile.tau_pre_s * 1e6:.1f}), "
            f"tau_dec {cal.tau_dec_s * 1e3:.2f} ms (profile {profile.tau_dec_s * 1e3:.2f})"
        )
        sim = SimBackend(profile_from_calibration(cal))
        rate = sim.saturation_rate(2, 4, "mixed-bursty", SIM_REQUESTS)
        err.print(f"saturation on the calibrated simulator: round_robin crosses 0.85 at {rate:.2f} req/s")
        cell = Cell("2P4D", 2, 4, "mixed-bursty", baselines_and_product())
        sim_runs = sim.run_cell(
            cell, rate, (0, 1, 2), SIM_REQUESTS, out_dir / "sim" / "records" / "2P4D", lambda r: None
        )
        live = LiveBackend(
            "emulated", out_dir / "live", err.print, fixed=LiveSetup(cluster, cluster_path, cal)
        )

        def on_run(run: Run) -> None:
            err.print(f"  live {run.label}: goodput {run.summary.goodput:.3f}")

        live_runs = live.run_cell(
            cell, rate, (0,), LIVE_REQUESTS, out_dir / "live" / "records" / "2P4D", on_run
        )
    finally:
        launched.stop()
    live_result = CellResult("2P4D", "emulated", rate, tuple(live_runs))
    sim_result = CellResult("2P4D", "sim", rate, tuple(sim_runs))
    _table(live_result, f"live, emulated 2P+4D, mixed-bursty, {rate:.2f} req/s, {LIVE_REQUESTS} requests")
    _table(
        sim_result, f"calibrated simulator, 2P+4D, mixed-bursty, {rate:.2f} req/s, {SIM_REQUESTS} requests"
    )
    report = _write_report(
        out_dir, cal_report, live_result, sim_result, cal.slo.tight_ttft_s, cal.slo.tight_tpot_s
    )
    err.print(f"report: {report} ({time.monotonic() - started:.0f} s in all; every process stopped)")
    return report


def _write_report(
    out_dir: Path,
    cal_report: dict[str, object],
    live: CellResult,
    sim: CellResult,
    ttft_s: float,
    tpot_s: float,
) -> Path:
    labels = live.labels()
    bars = plots.grouped_bars(
        out_dir / "goodput.png",
        labels,
        {
            "live (emulated)": [live.mean_goodput(lb) for lb in labels],
            "calibrated simulator": [sim.mean_goodput(lb) for lb in labels],
        },
        {},
        "goodput",
        "Mixed bursty, 2P+4D: live vs calibrated simulator",
    )
    cdfs = latency_cdfs(live, out_dir / "live", ttft_s, tpot_s)
    constants = cal_report.get("constants", {})
    report = out_dir / "report.md"
    report.write_text(
        "# calroute demo: the paper's main comparison, live\n\n"
        f"Command: `{COMMAND}`. An emulated cluster of 2 prefill and 4 decode vLLM-compatible engines "
        "with A40 + Qwen2.5-3B timing (docs/hardware-profile.md) on this machine; the correctness gates "
        "passed; the cluster was calibrated (`calroute calibrate`); the rate is where round-robin's goodput "
        "crosses 0.85 on the simulator calibrated to this cluster; each policy then ran through the proxy "
        f"(`calroute serve`) on the same {LIVE_REQUESTS} mixed-bursty requests (one seed; the full "
        "experiment runs three).\n\n"
        f"Calibrated constants: {constants}\n\n"
        f"SLO targets: tight TTFT {ttft_s * 1e3:.0f} ms, TPOT {tpot_s * 1e3:.1f} ms; loose 3x.\n\n"
        "## Live (emulated cluster, through the proxy)\n\n"
        + goodput_table([live], "cluster")
        + "\n## Calibrated simulator (three seeds)\n\n"
        + goodput_table([sim], "cluster")
        + f"\n![goodput]({bars})\n\n"
        + "".join(f"![{c}](live/{c})\n" for c in cdfs)
        + "\nPer-request records: `live/runs/`, `sim/records/`; the calibration: `calibration.json`.\n"
    )
    return report
