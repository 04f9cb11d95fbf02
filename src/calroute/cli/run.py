"""`calroute run`: compare policies live on a running cluster (the paper's measurement protocol)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from calroute.cli.common import (
    PARAMS_HELP,
    SLO_DEFAULT,
    SLO_HELP,
    err,
    exit_on_error,
    load_profile,
    policy_params,
    print_table,
    slo_option,
)
from calroute.errors import ConfigError
from calroute.workload.source import WORKLOADS


def run(
    cluster: Annotated[Path, typer.Option(help="cluster file (calroute engines up)")],
    workload: Annotated[str, typer.Option(help=f"workload family: {', '.join(WORKLOADS)}")] = "mixed-bursty",
    policies: Annotated[str, typer.Option(help="comma-separated policies")] = (
        "round_robin,least_loaded,length_heuristic,marginal_cost"
    ),
    seeds: Annotated[int, typer.Option(min=1, help="runs per policy, seeds 0..K-1")] = 3,
    rate: Annotated[float | None, typer.Option(help="arrival rate, requests/s")] = None,
    saturate_: Annotated[
        bool, typer.Option("--saturate", help="probe rates until round_robin is mid-collapse")
    ] = (False),
    requests: Annotated[int, typer.Option(min=1, help="requests per run")] = 600,
    calibration: Annotated[
        Path | None, typer.Option(help="the cluster's calibration (default: calibrate it first, about 60 s)")
    ] = None,
    out: Annotated[Path, typer.Option(help="results directory (resumable: finished runs are kept)")] = Path(
        "out/run"
    ),
    param: Annotated[
        list[str] | None, typer.Option(help="policy parameter, POLICY.NAME=VALUE (repeatable)")
    ] = None,
    params_file: Annotated[Path | None, typer.Option("--params", help=PARAMS_HELP)] = None,
    slo: Annotated[str, typer.Option(help=SLO_HELP)] = SLO_DEFAULT,
) -> None:
    """Gate, calibrate, then for each policy and seed: fresh proxy, reset caches, warm up, drive, collect."""
    from calroute.cluster.file import ClusterFile
    from calroute.costmodel.calibration import Calibration
    from calroute.experiments.kit.comparison import Comparison, write_comparison
    from calroute.experiments.kit.live_backend import LiveBackend
    from calroute.experiments.kit.runner import Scale, run_experiment
    from calroute.harness.gates import require_gates
    from calroute.harness.live import LiveSetup
    from calroute.policies import check_live_policy, make_policy

    with exit_on_error():
        if (rate is None) == (not saturate_):
            raise ConfigError("give exactly one of --rate and --saturate")
        if workload not in WORKLOADS:
            raise ConfigError(f"unknown workload {workload!r}; known: {', '.join(WORKLOADS)}")
        slo_spec = slo_option(slo)  # a bad file fails here, before the gates and calibration
        names = tuple(p.strip() for p in policies.split(",") if p.strip())
        params = policy_params(param or [], list(names), params_file)
        for name in names:  # a bad policy, parameter or value fails here, before the gates and calibration
            check_live_policy(name)
            make_policy(name, params.get(name, {}), load_profile().calibration)
        c = ClusterFile.load(cluster)
        require_gates(c)
        err.print("correctness gates passed")
        out.mkdir(parents=True, exist_ok=True)
        if calibration is not None:
            cal = Calibration.load(calibration)
        elif (out / "calibration.json").exists():
            cal = Calibration.load(out / "calibration.json")
        else:
            from calroute.calibrate.run import calibrate_cluster

            cal, _ = calibrate_cluster(c, 60.0, err.print)
            cal.save(out / "calibration.json")
        # calibration.json keeps the measured constants and the paper's targets; the runs judge by --slo
        backend = LiveBackend(c.kind, out, err.print, fixed=LiveSetup(c, cluster, cal), slo=slo_spec)
        comparison = Comparison(len(c.prefill), len(c.decode), workload, names, rate, params=params)
        (result,) = run_experiment(
            comparison,
            backend,
            False,
            out,
            progress=err.print,
            scale=Scale(requests, tuple(range(seeds))),
            extra_manifest={"cluster": str(cluster), "calibration": cal.provenance},
            slo=slo_spec,
        )
    # as `calroute simulate` names them: the spec, and the targets it set on this cluster's calibration
    slo_json = {"spec": slo_spec.name, **slo_spec.resolve(cal).to_dict()}
    context = {
        "workload": {"workload": workload, "requests": requests},
        "cluster": {"prefill": len(c.prefill), "decode": len(c.decode), "kind": c.kind, "file": str(cluster)},
        "slo": slo_json,
        "saturation": None if rate is not None else {"reference_policy": "round_robin"},
    }
    records_dir = out / comparison.name / "records" / result.cell_key
    write_comparison(out, result.runs, result.rate_rps, result.backend, records_dir, context)
    print_table(
        result.runs,
        f"{workload}, {len(c.prefill)}P+{len(c.decode)}D live ({c.kind}), {result.rate_rps:.2f} req/s"
        + ("" if slo_spec.is_paper else f", SLO {slo_spec.name}"),
    )
    err.print(f"wrote {out}/summary.json, {out}/table.md and per-run records under {out}/comparison/")
