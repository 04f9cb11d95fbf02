"""`calroute simulate` and `calroute profile`: policy comparisons on the simulated cluster."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from calroute.cli import limits
from calroute.cli.common import (
    PARAMS_HELP,
    SLO_DEFAULT,
    SLO_HELP,
    err,
    exit_on_error,
    load_profile,
    policy_params,
    print_table,
    progress_bar,
    slo_option,
)
from calroute.costmodel.calibration import Calibration
from calroute.costmodel.predictors import PREDICTOR_NAMES
from calroute.costmodel.profiles import DEFAULT_PROFILE, get_profile, profile_names
from calroute.errors import ConfigError
from calroute.experiments.kit.cells import Run
from calroute.experiments.kit.comparison import comparison_summary, write_comparison
from calroute.experiments.kit.saturation import Probe
from calroute.experiments.kit.sim_backend import SimSetup, compare, saturate
from calroute.policies import ALL_POLICIES, expand_policy_list, policy_names, unknown_policy
from calroute.sim.simulator import ClusterShape
from calroute.workload.source import WORKLOADS, FamilyWorkload, TraceWorkload, WorkloadSource

DEFAULT_POLICIES = "round_robin,least_loaded,length_heuristic,marginal_cost"
Workload = Enum("Workload", {f: f for f in WORKLOADS}, type=str)  # type: ignore[misc]


def run_simulation(
    setup: SimSetup,
    workload: WorkloadSource,
    policies: list[str],
    seeds: list[int],
    rate_rps: float | None,
    saturate_target: float | None,
    out_dir: Path | None,
    saturate_on: str = "round_robin",
    slo_spec: str = SLO_DEFAULT,
) -> tuple[list[Run], dict[str, Any]]:
    """The body of `calroute simulate`: the runs, and the summary object, written with table.md and the
    records under ``out_dir`` as `calroute run` writes them (kit/comparison.py). The setup's profile already
    judges by the SLO spec; ``slo_spec`` names it in the summary."""
    saturation: dict[str, Any] | None = None
    if saturate_target is not None:
        with progress_bar() as progress:
            task = progress.add_task(f"saturation search ({saturate_on})", total=None)

            def on_probe(p: Probe) -> None:
                progress.advance(task)
                progress.update(
                    task, description=f"saturation search: {p.rate_rps:.2f} req/s -> {p.goodput:.3f}"
                )

            sat = saturate(
                setup,
                workload,
                target=saturate_target,
                reference_policy=saturate_on,
                seeds=seeds,
                on_probe=on_probe,
            )
        rate_rps = sat.rate_rps
        saturation = {
            "target": sat.target,
            "reference_policy": saturate_on,
            "probes": [{"rate_rps": p.rate_rps, "goodput": p.goodput} for p in sat.probes],
        }
        err.print(f"saturation: {saturate_on} goodput crosses {sat.target} at {sat.rate_rps:.2f} req/s")
    with progress_bar() as progress:
        task = progress.add_task("simulating", total=len(policies) * len(seeds))

        def on_run(r: Run) -> None:
            progress.advance(task)
            progress.update(task, description=f"{r.label} seed {r.seed}: goodput {r.summary.goodput:.3f}")

        records_dir = None if out_dir is None else out_dir / "records"
        runs = compare(setup, workload, policies, seeds, rate_rps, records_dir, on_run)
    context = {
        "workload": workload.describe(),
        "cluster": {"prefill": setup.shape.prefill, "decode": setup.shape.decode},
        "profile": setup.profile.name,
        "engine_limits": asdict(setup.profile.limits),
        "router_calibration": setup.router_calibration.provenance.get("source"),
        "predictor": {"name": setup.predictor, "noise": setup.predictor_noise},
        "sample_interval_s": setup.sample_interval_s,
        "prefix_source": setup.prefix_source,
        "kv_event_delay_s": setup.kv_event_delay_s,
        # the paper's three fields always; per-token and explicit loose targets only when the spec sets them
        "slo": {"spec": slo_spec, **setup.profile.calibration.slo.to_dict()},
        "saturation": saturation,
    }
    if out_dir is None:
        return runs, comparison_summary(runs, rate_rps, "sim", None, None, context)
    return runs, write_comparison(out_dir, runs, rate_rps, "sim", records_dir, context)


def simulate(
    workload: Annotated[Workload | None, typer.Option(help="a synthetic workload family")] = None,
    trace: Annotated[
        Path | None, typer.Option(help="a trace file: Azure CSV, Mooncake JSONL, lengths CSV")
    ] = None,
    prefill: Annotated[
        int,
        typer.Option(min=0, help="prefill instances (0: an aggregated cluster, for --policies aggregated)"),
    ] = 2,
    decode: Annotated[int, typer.Option(min=1, help="decode instances")] = 4,
    policies: Annotated[
        str,
        typer.Option(
            help=f"comma-separated, from: {ALL_POLICIES} (every policy but simulator-only ones), "
            f"{', '.join(policy_names())}"
        ),
    ] = DEFAULT_POLICIES,
    seeds: Annotated[int, typer.Option(min=1, help="runs per policy: seeds S..S+K-1")] = 3,
    first_seed: Annotated[
        int, typer.Option(min=0, help="S, the first seed (validation apart from training)")
    ] = 0,
    rate: Annotated[float | None, typer.Option(help="arrival rate, requests/s")] = None,
    saturate_: Annotated[
        bool, typer.Option("--saturate", help="run at the rate where round_robin is mid-collapse")
    ] = False,
    saturation_target: Annotated[float, typer.Option(help="goodput defining saturation")] = 0.85,
    saturate_on: Annotated[
        str, typer.Option(help="the policy whose goodput crossing the target defines saturation")
    ] = "round_robin",
    prefix_source: Annotated[
        str,
        typer.Option(
            help="what the router's prefix index learns from: approximate (its own placements) "
            "or precise (the engines' KV events)"
        ),
    ] = "approximate",
    kv_event_delay_s: Annotated[
        float, typer.Option(min=0.0, help="how late KV events reach the router (precise source)")
    ] = 0.01,
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
    params_file: Annotated[Path | None, typer.Option("--params", help=PARAMS_HELP)] = None,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="write records, summary.json, table.md")
    ] = None,
    json_: Annotated[bool, typer.Option("--json", help="print one JSON object to stdout")] = False,
    slo: Annotated[str, typer.Option(help=SLO_HELP)] = SLO_DEFAULT,
    kv_capacity_tokens: limits.KvCapacity = None,
    max_model_len: limits.MaxModelLen = None,
    max_batched_tokens: limits.MaxBatchedTokens = None,
    max_num_seqs: limits.MaxNumSeqs = None,
) -> None:
    """Compare routing policies on the simulated prefill/decode cluster."""
    with exit_on_error():
        if (workload is None) == (trace is None):
            raise ConfigError("give exactly one of --workload and --trace")
        if rate is not None and saturate_:
            raise ConfigError("give at most one of --rate and --saturate")
        if rate is not None and rate <= 0:
            raise ConfigError(f"--rate must be > 0, got {rate}")
        if not sample_interval_s > 0:
            raise ConfigError(f"--sample-interval-s must be > 0, got {sample_interval_s}")
        try:
            policy_list = expand_policy_list(policies)
        except ConfigError as e:
            raise ConfigError(f"--policies: {e}") from e
        searched = [saturate_on] if saturate_ else []
        disaggregating = [p for p in dict.fromkeys([*policy_list, *searched]) if p != "aggregated"]
        if prefill == 0 and disaggregating:
            raise ConfigError(
                f"--prefill 0: an aggregated cluster takes only the policy aggregated (--policies, "
                f"--saturate-on), which keeps every prefill on its decode engine; "
                f"{', '.join(disaggregating)} need prefill instances"
            )
        if saturate_on not in policy_names():
            unknown = unknown_policy(saturate_on, ", ".join(policy_names()))
            raise ConfigError(f"--saturate-on: {unknown}")
        if trace is not None and not trace.is_file():
            raise ConfigError(f"--trace {trace}: no such file")
        slo_spec = slo_option(slo)
        given = limits.overrides(kv_capacity_tokens, max_model_len, max_batched_tokens, max_num_seqs)
        hw = load_profile(profile, calibration, slo_spec, given)
        router_cal = Calibration.load(router_calibration) if router_calibration else hw.calibration
        setup = SimSetup(
            profile=hw,
            shape=ClusterShape(prefill, decode),
            router_calibration=router_cal,
            predictor=predictor,
            predictor_noise=predictor_noise,
            sample_interval_s=sample_interval_s,
            policy_params=policy_params(param or [], policy_list, params_file),
            prefix_source=prefix_source,
            kv_event_delay_s=kv_event_delay_s,
        )
        source: WorkloadSource = (
            FamilyWorkload(workload.value, requests, tight_fraction)
            if workload is not None
            else TraceWorkload(trace, requests, tight_fraction)  # type: ignore[arg-type]
        )
        runs, result = run_simulation(
            setup,
            source,
            policy_list,
            list(range(first_seed, first_seed + seeds)),
            rate,
            saturation_target if saturate_ else None,
            out_dir,
            saturate_on=saturate_on,
            slo_spec=slo_spec.name,
        )
    if json_:
        sys.stdout.write(json.dumps(result) + "\n")
        return
    rate_s = "native" if result["rate_rps"] is None else f"{result['rate_rps']:.2f} req/s"
    slo_s = "" if slo_spec.is_paper else f", SLO {slo_spec.name}"
    print_table(runs, f"{source.name}, {prefill}P+{decode}D, {rate_s}, {hw.name}{slo_s}")
    if out_dir is not None:
        err.print(f"wrote {out_dir}/summary.json, {out_dir}/table.md and {out_dir}/records/")


def profile_cmd(
    name: Annotated[str, typer.Argument(help=f"one of: {', '.join(profile_names())}")] = DEFAULT_PROFILE,
    out_file: Annotated[
        Path | None, typer.Option("--out", help="write the profile as a calibration file")
    ] = None,
) -> None:
    """Show a hardware profile's constants (or save them as a calibration file)."""
    with exit_on_error():
        hw = get_profile(name)
    if out_file is not None:
        hw.calibration.save(out_file)
        err.print(f"wrote {out_file}")
    else:
        sys.stdout.write(hw.calibration.to_json())
