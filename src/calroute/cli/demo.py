"""`make demo`: what calroute is for, live, in about five minutes on this machine.

Routing matters where prompts share long prefixes: the engine that already holds a prompt's leading blocks
computes only the rest. So the demo runs the shared-prefix family (docs/workloads.md) and sets least_loaded
and the prefix-aware peers (docs/prefix.md) beside marginal_cost. Bring up an emulated 2P+4D cluster that
publishes vLLM's KV events (A40-like timing, run at twice the speed), pass the correctness gates, calibrate
it, pick the rate on the simulator calibrated to it, run every policy through the proxy with its precise
prefix index (fed by those events), run the same policies on the calibrated simulator (its index fed by the
simulated engines' events) on the same arrival traces and on ten, print the tables and what they show,
write a report with plots, and stop every process started.

The paper's mixed-bursty comparison is not here: on one short live trace its four policies scored alike
(0.930 each at 15.16 req/s), which shows a newcomer nothing; `calroute experiment mixed-bursty` runs it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from calroute.calibrate.run import calibrate_cluster
from calroute.cli.common import err, load_profile, out, print_table
from calroute.cluster.launch import up_emulated
from calroute.costmodel.calibration import SloTargets
from calroute.costmodel.slo import LONG_CONTEXT, PRESETS, describe_slo, with_slo
from calroute.experiments.kit.cells import Cell, CellResult, Run
from calroute.experiments.kit.comparison import comparison_table
from calroute.experiments.kit.live_backend import LiveBackend
from calroute.experiments.kit.report import latency_cdfs, paired_gap
from calroute.experiments.kit.sim_backend import SATURATION_SEEDS, SimSetup, compare, saturate
from calroute.experiments.prefix import PEERS
from calroute.harness.gates import require_gates
from calroute.harness.live import LiveSetup
from calroute.report import plots
from calroute.routing.variant import Variant
from calroute.sim.simulator import ClusterShape
from calroute.workload.source import workload_source

LIVE_REQUESTS = 300
TIME_SCALE = 0.5  # every modelled duration halved: a GPU twice as fast as an A40
CALIBRATION_BUDGET_S = 25.0
COMMAND = "calroute demo --out DIR [--seeds N]"
WORKLOAD = "shared-prefix"
POLICIES = ("least_loaded", *PEERS, "marginal_cost")
# Long prompts are judged by what their prefill must cost (docs/calibration.md), as in the prefix experiment:
# under the paper's fixed TTFT target a long uncached prompt fails whatever its placement.
SLO = PRESETS[LONG_CONTEXT]
# The rate: where least_loaded, the best router blind to prefixes, starts to fail (its goodput crosses 0.85
# on the calibrated simulator). Loaded enough that where a prompt goes decides what it computes, not so loaded
# that every policy collapses: at the peers' own crossings least_loaded falls to about 0.5, and a live cluster
# sharing its cores runs slower than the calibration says, so the demo keeps that margin.
RATE_REFERENCE = "least_loaded"
RATE_TARGET = 0.85
SIM_SEEDS = 10  # the simulator is cheap: ten traces at the live rate give the intervals one trace cannot


def run_demo(out_dir: Path, live_seeds: int = 1) -> Path:
    """``live_seeds`` arrival traces (seeds 0 ..), about two minutes each live; the simulator runs the same
    traces, and seeds 0-9 besides."""
    started = time.monotonic()

    def say(msg: str) -> None:
        err.print(f"[{time.monotonic() - started:4.0f} s] {msg}")

    out_dir.mkdir(parents=True, exist_ok=True)
    say(f"bringing up an emulated 2 prefill + 4 decode cluster (a40-qwen2.5-3b timing x {TIME_SCALE:g})")
    # KV events on: the proxy's prefix index learns from them what each engine caches
    launched = up_emulated(2, 4, out_dir / "engines", time_scale=TIME_SCALE, kv_events=True)
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
        hardware = load_profile(calibration=cal, slo=SLO)
        # the index fed by the simulated engines' KV events, as the live proxy's is by the emulator's
        setup = SimSetup(hardware, ClusterShape(2, 4), hardware.calibration, prefix_source="precise")
        # the live runs' length: saturation depends on how long the caches have to warm and queues to build
        source = workload_source(WORKLOAD, LIVE_REQUESTS)
        rate = saturate(setup, source, RATE_TARGET, RATE_REFERENCE, SATURATION_SEEDS).rate_rps
        say(
            f"rate on the calibrated simulator: {RATE_REFERENCE} crosses {RATE_TARGET:.2f} at {rate:.2f} "
            f"req/s ({WORKLOAD}, {LIVE_REQUESTS} requests, seeds {list(SATURATION_SEEDS)})"
        )
        sim_runs = compare(
            setup,
            source,
            POLICIES,
            range(max(live_seeds, SIM_SEEDS)),
            rate,
            out_dir / "sim" / "records" / WORKLOAD,
        )
        cell = Cell(WORKLOAD, 2, 4, WORKLOAD, tuple(Variant(p, p) for p in POLICIES))
        live = LiveBackend(
            "emulated", out_dir / "live", say, fixed=LiveSetup(cluster, cluster_path, cal), slo=SLO
        )

        def on_run(run: Run) -> None:
            say(f"live {run.label}: goodput {run.summary.goodput:.3f}")

        load_before = os.getloadavg()[0]
        live_runs = live.run_cell(
            cell,
            rate,
            tuple(range(live_seeds)),
            LIVE_REQUESTS,
            out_dir / "live" / "records" / WORKLOAD,
            on_run,
        )
        machine = _machine(load_before, os.getloadavg()[0])
    finally:
        launched.stop()
    live_result = CellResult(WORKLOAD, "emulated", rate, tuple(live_runs))
    sim_result = CellResult(WORKLOAD, "sim", rate, tuple(sim_runs))
    same = _on_seeds(sim_result, live_result.seeds())
    print_table(
        live_result.runs, f"live, emulated 2P+4D, {WORKLOAD}, {rate:.2f} req/s, {LIVE_REQUESTS} requests"
    )
    print_table(same.runs, f"calibrated simulator, the same rate, requests and seeds {same.seeds()}")
    # the ten traces' table is too wide for a terminal: the report has it, the finding its intervals
    finding = _finding(live_result, sim_result)
    out.print(f"{finding}\n{machine}")
    report = _write_report(
        out_dir, cal_report, live_result, sim_result, with_slo(cal, SLO).slo, f"{finding}\n\n{machine}"
    )
    say(f"report: {report} (every process stopped)")
    return report


def _on_seeds(result: CellResult, seeds: list[int]) -> CellResult:
    """The runs of ``result`` on these arrival traces; refused unless it ran every one (like with like: one
    live trace is not set beside a mean over other traces)."""
    if not set(seeds) <= set(result.seeds()):
        raise ValueError(
            f"live seeds {seeds} are not all among the simulated seeds {result.seeds()}: not like with like"
        )
    runs = tuple(r for r in result.runs if r.seed in seeds)
    return CellResult(result.cell_key, result.backend, result.rate_rps, runs)


def _machine(load_before: float, load_after: float) -> str:
    """The live runs hold only on a machine that gives the cluster the cores it was calibrated on: say how
    busy this one was."""
    cores = os.cpu_count() or 1
    note = (
        ": more runnable processes than cores, so the engines, the proxy and the load generator shared them "
        "with other work, and the live runs are slower than the calibrated cluster the simulator models"
        if max(load_before, load_after) > cores
        else ""
    )
    return (
        f"This machine's load average (1 min) was {load_before:.1f} before the live runs and "
        f"{load_after:.1f} after, on {cores} cores{note}."
    )


def _traces(seeds: list[int]) -> str:
    return f"one trace (seed {seeds[0]})" if len(seeds) == 1 else f"{len(seeds)} traces (seeds {seeds})"


def _finding(live: CellResult, sim: CellResult) -> str:
    """What the comparison shows, in two sentences: marginal_cost against least_loaded and against the best
    prefix-aware peer, live and on the simulator's ten traces, each difference as the tables give it (one
    trace's has no interval, and is called no win)."""

    def versus(c: CellResult) -> str:
        peer = max(PEERS, key=c.mean_goodput)
        return (
            f"marginal_cost {c.mean_goodput('marginal_cost'):.3f}, least_loaded "
            f"{c.mean_goodput('least_loaded'):.3f}, the best prefix-aware peer ({peer}) "
            f"{c.mean_goodput(peer):.3f}; marginal_cost minus them, in goodput points: "
            f"{paired_gap(c, 'marginal_cost', 'least_loaded')} and {paired_gap(c, 'marginal_cost', peer)}"
        )

    seeds = live.seeds()
    caveat = " (one trace: no interval, so neither difference is called a win)" if len(seeds) == 1 else ""
    return (
        f"Live, {_traces(seeds)} of {WORKLOAD} at {live.rate_rps:.2f} req/s: {versus(live)}{caveat}. "
        f"On the calibrated simulator, {len(sim.seeds())} traces at the same rate: {versus(sim)}."
    )


def _write_report(
    out_dir: Path,
    cal_report: dict[str, object],
    live: CellResult,
    sim: CellResult,
    slo: SloTargets,
    finding: str,
) -> Path:
    same = _on_seeds(sim, live.seeds())
    seeds = live.seeds()
    bars = plots.grouped_bars(
        out_dir / "goodput.png",
        list(POLICIES),
        {
            f"live, {_traces(seeds)}": [live.mean_goodput(p) for p in POLICIES],
            f"calibrated simulator, the same trace{'s' if len(seeds) > 1 else ''}": [
                same.mean_goodput(p) for p in POLICIES
            ],
            f"calibrated simulator, {len(sim.seeds())} traces": [sim.mean_goodput(p) for p in POLICIES],
        },
        {},
        "goodput (mean over traces)",
        f"{WORKLOAD}, 2P+4D, {live.rate_rps:.2f} req/s: live vs calibrated simulator",
    )
    cdfs = latency_cdfs(live, out_dir / "live", slo)
    constants = cal_report.get("constants", {})
    assert isinstance(constants, dict)
    report = out_dir / "report.md"
    report.write_text(
        "# calroute demo: routing on shared prefixes, live\n\n"
        f"{finding}\n\n"
        f"Command: `{COMMAND}`. An emulated cluster of 2 prefill and 4 decode vLLM-compatible engines "
        f"with A40 + Qwen2.5-3B timing (docs/hardware-profile.md) x {TIME_SCALE:g} (a GPU twice as fast) "
        "on this machine, each engine publishing vLLM's KV events; the correctness gates passed; the "
        "cluster was calibrated (`calroute calibrate`). The workload is the shared-prefix family "
        "(docs/workloads.md): one of 16 long system prompts, Zipf-popular, then the request's own suffix, "
        "so an engine that holds a prompt's system prompt computes only its suffix, and where a request "
        f"goes decides what it computes. The rate is where {RATE_REFERENCE}'s goodput crosses "
        f"{RATE_TARGET:.2f} on the simulator calibrated to this cluster (seeds {list(SATURATION_SEEDS)}). "
        "Each policy then ran through the proxy (`calroute serve --prefix-index`, its index fed by the "
        f"engines' KV events) on the same {LIVE_REQUESTS} requests per arrival trace (seeds {seeds}; "
        "`calroute demo --seeds N` runs more), and the calibrated simulator (its index fed by the simulated "
        "engines' events, `calroute simulate --prefix-source precise`) ran the same traces at the same "
        f"rate, so the two are compared like with like, and seeds 0-{max(sim.seeds())} besides, for "
        "intervals. least_loaded balances load and ignores prefixes; prefix_scorer_mix (llm-d's default "
        "scorers), kv_overlap_cost (NVIDIA Dynamo's KV router) and cache_aware (vllm-router's and SGLang's) "
        "are the prefix-aware peers (docs/prefix.md); marginal_cost prices a cached prefix as prefill "
        "seconds not spent, against the queue the request would wait in.\n\n"
        "Calibrated constants (this cluster, measured):\n\n| constant | value |\n|---|---|\n"
        + "".join(f"| {k} | {v:.4g} |\n" for k, v in constants.items() if isinstance(v, float))
        + f"\nSLO targets ({SLO.name}, docs/calibration.md): {describe_slo(slo)}.\n\n"
        "## Live (emulated cluster, through the proxy)\n\n"
        + comparison_table(live.runs)
        + f"\n## Calibrated simulator (the same seeds, {seeds})\n\n"
        + comparison_table(same.runs)
        + f"\n## Calibrated simulator, {len(sim.seeds())} traces (seeds 0-{max(sim.seeds())})\n\n"
        + comparison_table(sim.runs)
        + "\nThe paired column is each policy's goodput minus marginal_cost's, paired by arrival trace, with "
        "its 95 % bootstrap interval, and a win or loss only where the interval excludes zero "
        "(results/stats.py); one trace gives no interval."
        + f"\n\n![goodput]({bars})\n\n"
        + "".join(f"![{c}](live/{c})\n" for c in cdfs)
        + "\nPer-request records: `live/runs/`, `sim/records/`; the calibration: `calibration.json`.\n"
    )
    return report
