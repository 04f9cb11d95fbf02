"""`make demo`: the paper's main experiment, live, in a few minutes on this machine.

Bring up an emulated 2P+4D cluster (A40-like timing, run at twice the speed so a run's longest requests,
thousands of tokens, finish in minutes), pass the correctness gates, calibrate it (which measures exactly
that speed: the router's prices and the SLO targets follow), find the saturation rate on the simulator
calibrated to it, run the four policies through the proxy at that rate, run the same comparison on the
calibrated simulator on the same arrival traces (like with like: one live trace is not set beside a mean
over other traces), print both tables, write a report with plots, and stop every process started.
"""

from __future__ import annotations

import time
from pathlib import Path

from calroute.calibrate.run import calibrate_cluster
from calroute.cli.common import err, load_profile, print_table
from calroute.cluster.launch import up_emulated
from calroute.experiments.backends import SimBackend
from calroute.experiments.base import goodput_table, latency_cdfs
from calroute.experiments.cells import Cell, CellResult, Run, SaturationQuery, baselines_and_product
from calroute.experiments.compare import RunResult
from calroute.experiments.live import LiveBackend
from calroute.experiments.report import PAIRED_NOTE
from calroute.harness.gates import require_gates
from calroute.harness.live import LiveSetup
from calroute.report import plots
from calroute.sim.simulator import SimStats

LIVE_REQUESTS = 300
TIME_SCALE = 0.5  # every modelled duration halved: a GPU twice as fast as an A40
CALIBRATION_BUDGET_S = 25.0
COMMAND = "calroute demo --out DIR [--seeds N]"


def _table(result: CellResult, title: str) -> None:
    stats = SimStats(0, 0, 0.0, 0, {})
    print_table(
        [RunResult(r.label, r.seed, result.rate_rps, r.summary, stats, None) for r in result.runs], title
    )


def run_demo(out_dir: Path, live_seeds: int = 1) -> Path:
    """``live_seeds`` arrival traces (seeds 0 ..), about four minutes each live; the simulator runs the same
    traces."""
    started = time.monotonic()

    def say(msg: str) -> None:
        err.print(f"[{time.monotonic() - started:4.0f} s] {msg}")

    out_dir.mkdir(parents=True, exist_ok=True)
    say(f"bringing up an emulated 2 prefill + 4 decode cluster (a40-qwen2.5-3b timing x {TIME_SCALE:g})")
    launched = up_emulated(2, 4, out_dir / "engines", time_scale=TIME_SCALE)
    try:
        cluster = launched.file
        cluster_path = out_dir / "cluster.yaml"
        cluster.save(cluster_path)
        gates = require_gates(cluster)
        say("gates: " + ", ".join(f"{g.name} ok" for g in gates))
        cal, cal_report = calibrate_cluster(cluster, CALIBRATION_BUDGET_S, lambda m: None)
        cal.save(out_dir / "calibration.json")
        profile = load_profile().calibration
        say(
            f"calibrated: tau_pre {cal.tau_pre_s * 1e6:.1f} us, tau_dec {cal.tau_dec_s * 1e3:.2f} ms "
            f"(the profile x {TIME_SCALE:g}: {TIME_SCALE * profile.tau_pre_s * 1e6:.1f} us, "
            f"{TIME_SCALE * profile.tau_dec_s * 1e3:.2f} ms)"
        )
        sim = SimBackend(load_profile(calibration=cal))
        # the live runs' length: saturation depends on how long bursts have to build queues
        rate = sim.saturation_rate(SaturationQuery(2, 4, "mixed-bursty", LIVE_REQUESTS))
        say(f"saturation on the calibrated simulator: round_robin crosses 0.85 at {rate:.2f} req/s")
        cell = Cell("2P4D", 2, 4, "mixed-bursty", baselines_and_product())
        seeds = tuple(range(live_seeds))
        sim_runs = sim.run_cell(
            cell, rate, seeds, LIVE_REQUESTS, out_dir / "sim" / "records" / "2P4D", lambda r: None
        )
        live = LiveBackend("emulated", out_dir / "live", say, fixed=LiveSetup(cluster, cluster_path, cal))

        def on_run(run: Run) -> None:
            say(f"live {run.label}: goodput {run.summary.goodput:.3f}")

        live_runs = live.run_cell(
            cell, rate, seeds, LIVE_REQUESTS, out_dir / "live" / "records" / "2P4D", on_run
        )
    finally:
        launched.stop()
    live_result = CellResult("2P4D", "emulated", rate, tuple(live_runs))
    sim_result = CellResult("2P4D", "sim", rate, tuple(sim_runs))
    _table(live_result, f"live, emulated 2P+4D, mixed-bursty, {rate:.2f} req/s, {LIVE_REQUESTS} requests")
    _table(sim_result, f"calibrated simulator, the same rate, requests and seeds {list(seeds)}")
    report = _write_report(
        out_dir, cal_report, live_result, sim_result, cal.slo.tight_ttft_s, cal.slo.tight_tpot_s
    )
    say(f"report: {report} (every process stopped)")
    return report


def _write_report(
    out_dir: Path,
    cal_report: dict[str, object],
    live: CellResult,
    sim: CellResult,
    ttft_s: float,
    tpot_s: float,
) -> Path:
    if live.seeds() != sim.seeds():
        raise ValueError(
            f"live seeds {live.seeds()} and simulated seeds {sim.seeds()} differ: not like with like"
        )
    labels = live.labels()
    seeds = live.seeds()
    bars = plots.grouped_bars(
        out_dir / "goodput.png",
        labels,
        {
            "live (emulated)": [live.mean_goodput(lb) for lb in labels],
            "calibrated simulator": [sim.mean_goodput(lb) for lb in labels],
        },
        {},
        "goodput",
        f"Mixed bursty, 2P+4D: live vs calibrated simulator, seeds {seeds}",
    )
    cdfs = latency_cdfs(live, out_dir / "live", ttft_s, tpot_s)
    constants = cal_report.get("constants", {})
    assert isinstance(constants, dict)
    report = out_dir / "report.md"
    report.write_text(
        "# calroute demo: the paper's main comparison, live\n\n"
        f"Command: `{COMMAND}`. An emulated cluster of 2 prefill and 4 decode vLLM-compatible engines "
        f"with A40 + Qwen2.5-3B timing (docs/hardware-profile.md) x {TIME_SCALE:g} (a GPU twice as fast, so "
        "the longest requests finish in minutes) on this machine; the correctness gates passed; the cluster "
        "was calibrated (`calroute calibrate`); the rate is where round-robin's goodput "
        "crosses 0.85 on the simulator calibrated to this cluster; each policy then ran through the proxy "
        f"(`calroute serve`) on the same {LIVE_REQUESTS} mixed-bursty requests per arrival trace "
        f"(seeds {seeds}; `calroute demo --seeds N` runs more), and the calibrated simulator ran the same "
        "traces at the same rate, so the two are compared like with like.\n\n"
        "Calibrated constants (this cluster, measured):\n\n| constant | value |\n|---|---|\n"
        + "".join(f"| {k} | {v:.4g} |\n" for k, v in constants.items() if isinstance(v, float))
        + "\n"
        f"SLO targets: tight TTFT {ttft_s * 1e3:.0f} ms, TPOT {tpot_s * 1e3:.1f} ms; loose 3x.\n\n"
        "## Live (emulated cluster, through the proxy)\n\n"
        + goodput_table([live], "cluster")
        + f"\n## Calibrated simulator (the same seeds, {seeds})\n\n"
        + goodput_table([sim], "cluster")
        + "\n"
        + PAIRED_NOTE
        + (
            " One trace gives no interval, so no difference above is a win or a loss."
            if len(seeds) < 2
            else ""
        )
        + f"\n\n![goodput]({bars})\n\n"
        + "".join(f"![{c}](live/{c})\n" for c in cdfs)
        + "\nPer-request records: `live/runs/`, `sim/records/`; the calibration: `calibration.json`.\n"
    )
    return report
