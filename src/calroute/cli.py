"""The calroute command line: thin wrappers over library functions; logging and output live here only."""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from calroute.cli_bench import bench
from calroute.cli_calibrate import calibrate
from calroute.cli_engines import engines_app
from calroute.cli_experiment import experiment, report
from calroute.cli_run import run
from calroute.cli_serve import serve
from calroute.costmodel.calibration import Calibration
from calroute.costmodel.predictors import PREDICTOR_NAMES
from calroute.costmodel.profiles import (
    DEFAULT_PROFILE,
    HardwareProfile,
    get_profile,
    profile_from_calibration,
    profile_names,
)
from calroute.engines.procs import stop_on_sigterm
from calroute.errors import CalrouteError, ConfigError
from calroute.policies import policy_names
from calroute.saturation import Probe
from calroute.sim.compare import RunResult, SimSetup, compare, saturate
from calroute.sim.simulator import ClusterShape
from calroute.tables import RunRow, by_policy, markdown_table
from calroute.workload.families import FAMILIES
from calroute.workload.source import FamilyWorkload, TraceWorkload, WorkloadSource

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
app.add_typer(engines_app, name="engines")
app.command()(serve)
app.command()(experiment)
app.command()(run)
app.command()(bench)
app.command()(calibrate)
app.command("report")(report)
err = Console(stderr=True)
# Piped output (logs, CI) would otherwise be cut at 80 columns, which truncates the comparison table.
out = Console() if Console().is_terminal else Console(width=120)

DEFAULT_POLICIES = "round_robin,least_loaded,length_heuristic,marginal_cost"
Workload = Enum("Workload", {f: f for f in FAMILIES}, type=str)  # type: ignore[misc]


def parse_param_options(items: list[str], policies: list[str]) -> dict[str, dict[str, str]]:
    params: dict[str, dict[str, str]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        policy, dot, name = key.partition(".")
        if not sep or not dot or not name:
            raise ConfigError(f"--param {item!r}: expected POLICY.NAME=VALUE, e.g. marginal_cost.rho=2")
        if policy not in policies:
            raise ConfigError(
                f"--param {item!r}: policy {policy!r} is not in --policies ({','.join(policies)})"
            )
        params.setdefault(policy, {})[name] = value
    return params


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    )


def run_simulation(
    setup: SimSetup,
    workload: WorkloadSource,
    policies: list[str],
    seeds: list[int],
    rate_rps: float | None,
    saturate_target: float | None,
    out_dir: Path | None,
) -> tuple[list[RunResult], dict[str, Any]]:
    """The body of `calroute simulate` (and of the demo): the runs, and the JSON summary object."""
    saturation: dict[str, Any] | None = None
    if saturate_target is not None:
        with _progress() as progress:
            task = progress.add_task("saturation search (round_robin)", total=None)

            def on_probe(p: Probe) -> None:
                progress.advance(task)
                progress.update(
                    task, description=f"saturation search: {p.rate_rps:.2f} req/s -> {p.goodput:.3f}"
                )

            sat = saturate(setup, workload, target=saturate_target, seeds=seeds, on_probe=on_probe)
        rate_rps = sat.rate_rps
        saturation = {
            "target": sat.target,
            "reference_policy": "round_robin",
            "probes": [{"rate_rps": p.rate_rps, "goodput": p.goodput} for p in sat.probes],
        }
        err.print(f"saturation: round_robin goodput crosses {sat.target} at {sat.rate_rps:.2f} req/s")
    with _progress() as progress:
        task = progress.add_task("simulating", total=len(policies) * len(seeds))

        def on_run(r: RunResult) -> None:
            progress.advance(task)
            progress.update(task, description=f"{r.policy} seed {r.seed}: goodput {r.summary.goodput:.3f}")

        results = compare(setup, workload, policies, seeds, rate_rps, out_dir, on_run)
    result = {
        "rate_rps": rate_rps,
        "runs": [
            {
                "policy": r.policy,
                "seed": r.seed,
                "requests": r.summary.requests,
                "goodput": r.summary.goodput,
                "ttft_p50_s": r.summary.ttft_p50_s,
                "ttft_p99_s": r.summary.ttft_p99_s,
                "tpot_p50_s": r.summary.tpot_p50_s,
                "tpot_p99_s": r.summary.tpot_p99_s,
                "status_counts": r.summary.status_counts,
                "records": None if r.records_path is None else str(r.records_path),
            }
            for r in results
        ],
        "workload": workload.describe(),
        "cluster": {"prefill": setup.shape.prefill, "decode": setup.shape.decode},
        "profile": setup.profile.name,
        "router_calibration": setup.router_calibration.provenance.get("source"),
        "predictor": {"name": setup.predictor, "noise": setup.predictor_noise},
        "sample_interval_s": setup.sample_interval_s,
        "slo": {
            "tight_ttft_s": setup.profile.calibration.slo.tight_ttft_s,
            "tight_tpot_s": setup.profile.calibration.slo.tight_tpot_s,
            "loose_factor": setup.profile.calibration.slo.loose_factor,
        },
        "saturation": saturation,
    }
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
        rows = [RunRow(r.policy, r.seed, r.summary) for r in results]
        (out_dir / "table.md").write_text(markdown_table(rows))
    return results, result


def print_table(results: list[RunResult], title: str) -> None:
    rows = [RunRow(r.policy, r.seed, r.summary) for r in results]
    policies = by_policy(rows)
    seeds = sorted({r.seed for r in rows})
    caption = "goodput per seed s0.., mean, spread (max - min); P99 latencies: mean over seeds"
    table = Table(title=title, caption=caption)
    table.add_column("policy", no_wrap=True)
    for s in seeds:
        table.add_column(f"s{s}", justify="right", no_wrap=True, min_width=5)
    for col in ("mean", "spread", "P99 TTFT s", "P99 TPOT s"):
        table.add_column(col, justify="right", no_wrap=True)
    best = max(p.mean_goodput for p in policies)
    for p in policies:
        mean = f"{p.mean_goodput:.3f}"
        table.add_row(
            p.policy,
            *[f"{g:.3f}" for g in p.goodputs],
            f"[bold green]{mean}[/]" if p.mean_goodput == best else mean,
            f"{p.spread:.3f}",
            "-" if p.ttft_p99_s is None else f"{p.ttft_p99_s:.3f}",
            "-" if p.tpot_p99_s is None else f"{p.tpot_p99_s:.4f}",
        )
    out.print(table)


def _profile(profile: str, calibration: Path | None) -> HardwareProfile:
    if calibration is not None:
        return profile_from_calibration(Calibration.load(calibration), get_profile(profile).limits)
    return get_profile(profile)


@app.command()
def simulate(
    workload: Annotated[Workload | None, typer.Option(help="a synthetic workload family")] = None,
    trace: Annotated[
        Path | None, typer.Option(help="a trace file: Azure CSV, Mooncake JSONL, lengths CSV")
    ] = None,
    prefill: Annotated[int, typer.Option(min=1, help="prefill instances")] = 2,
    decode: Annotated[int, typer.Option(min=1, help="decode instances")] = 4,
    policies: Annotated[str, typer.Option(help=f"comma-separated, from: {', '.join(policy_names())}")] = (
        DEFAULT_POLICIES
    ),
    seeds: Annotated[int, typer.Option(min=1, help="runs per policy, seeds 0..K-1")] = 3,
    rate: Annotated[float | None, typer.Option(help="arrival rate, requests/s")] = None,
    saturate_: Annotated[
        bool, typer.Option("--saturate", help="run at the rate where round_robin is mid-collapse")
    ] = False,
    saturation_target: Annotated[float, typer.Option(help="round_robin goodput defining saturation")] = 0.85,
    requests: Annotated[int, typer.Option(min=1, help="requests per run (a trace: the first N)")] = 2000,
    tight_fraction: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="share of tight-SLO requests")
    ] = 0.5,
    predictor: Annotated[str, typer.Option(help=f"output-length predictor: {', '.join(PREDICTOR_NAMES)}")] = (
        "bucket"
    ),
    predictor_noise: Annotated[float, typer.Option(min=0.0, help="relative error injected, e.g. 0.5")] = 0.0,
    sample_interval_s: Annotated[
        float, typer.Option(help="seconds between the engines' metrics samples (the proxy polls every 0.05)")
    ] = 0.05,
    profile: Annotated[
        str, typer.Option(help=f"hardware profile: {', '.join(profile_names())}")
    ] = DEFAULT_PROFILE,
    calibration: Annotated[
        Path | None, typer.Option(help="calibration JSON: the simulated hardware, SLOs and router constants")
    ] = None,
    router_calibration: Annotated[
        Path | None, typer.Option(help="calibration JSON for the router's constants only (a mismatch study)")
    ] = None,
    param: Annotated[
        list[str] | None, typer.Option(help="policy parameter, POLICY.NAME=VALUE (repeatable)")
    ] = None,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="write records, summary.json, table.md")
    ] = None,
    json_: Annotated[bool, typer.Option("--json", help="print one JSON object to stdout")] = False,
) -> None:
    """Compare routing policies on the simulated prefill/decode cluster."""
    try:
        if (workload is None) == (trace is None):
            raise ConfigError("give exactly one of --workload and --trace")
        if rate is not None and saturate_:
            raise ConfigError("give at most one of --rate and --saturate")
        if rate is not None and rate <= 0:
            raise ConfigError(f"--rate must be > 0, got {rate}")
        if not sample_interval_s > 0:
            raise ConfigError(f"--sample-interval-s must be > 0, got {sample_interval_s}")
        policy_list = [p.strip() for p in policies.split(",") if p.strip()]
        unknown = [p for p in policy_list if p not in policy_names()]
        if unknown or not policy_list:
            raise ConfigError(f"--policies: unknown {unknown}; known: {', '.join(policy_names())}")
        if trace is not None and not trace.is_file():
            raise ConfigError(f"--trace {trace}: no such file")
        hw = _profile(profile, calibration)
        router_cal = Calibration.load(router_calibration) if router_calibration else hw.calibration
        setup = SimSetup(
            profile=hw,
            shape=ClusterShape(prefill, decode),
            router_calibration=router_cal,
            predictor=predictor,
            predictor_noise=predictor_noise,
            sample_interval_s=sample_interval_s,
            policy_params=parse_param_options(param or [], policy_list),
        )
        source: WorkloadSource = (
            FamilyWorkload(workload.value, requests, tight_fraction)
            if workload is not None
            else TraceWorkload(trace, requests, tight_fraction)  # type: ignore[arg-type]
        )
        results, result = run_simulation(
            setup,
            source,
            policy_list,
            list(range(seeds)),
            rate,
            saturation_target if saturate_ else None,
            out_dir,
        )
    except CalrouteError as e:
        err.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from e
    if json_:
        sys.stdout.write(json.dumps(result) + "\n")
        return
    rate_s = "native" if result["rate_rps"] is None else f"{result['rate_rps']:.2f} req/s"
    print_table(results, f"{source.name}, {prefill}P+{decode}D, {rate_s}, {hw.name}")
    if out_dir is not None:
        err.print(f"wrote {out_dir}/summary.json, {out_dir}/table.md and {out_dir}/records/")


@app.command("profile")
def profile_cmd(
    name: Annotated[str, typer.Argument(help=f"one of: {', '.join(profile_names())}")] = DEFAULT_PROFILE,
    out_file: Annotated[
        Path | None, typer.Option("--out", help="write the profile as a calibration file")
    ] = None,
) -> None:
    """Show a hardware profile's constants (or save them as a calibration file)."""
    try:
        hw = get_profile(name)
    except CalrouteError as e:
        err.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from e
    if out_file is not None:
        hw.calibration.save(out_file)
        err.print(f"wrote {out_file}")
    else:
        sys.stdout.write(hw.calibration.to_json())


@app.command()
def demo(
    out_dir: Annotated[Path, typer.Option("--out", help="where the report goes")] = Path("out/demo"),
    seeds: Annotated[int, typer.Option(help="arrival traces run live (the simulator always runs 3)")] = 1,
) -> None:
    """The main job: a calibrated 2P+4D emulated cluster, the four policies live through the proxy."""
    from calroute.demo import run_demo

    try:
        if not 1 <= seeds <= 10:
            raise ConfigError(f"--seeds must be in [1, 10], got {seeds}")
        run_demo(out_dir, seeds)
    except CalrouteError as e:
        err.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from e


def main() -> None:
    # Long-running subcommands that serve (`serve`, `engines emulate`) install their own SIGTERM handlers.
    stop_on_sigterm()
    app()
