"""`calroute experiment NAME` and `calroute report DIR`."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from calroute.cli import limits
from calroute.cli.common import (
    PARAMS_HELP,
    SLO_DEFAULT,
    SLO_HELP,
    err,
    exit_on_error,
    load_profile,
    slo_option,
)
from calroute.errors import ConfigError

if TYPE_CHECKING:
    from calroute.experiments.kit.cells import Experiment


class ExecutorKind(StrEnum):
    local = "local"
    ray = "ray"


class BackendKind(StrEnum):
    sim = "sim"
    emulated = "emulated"
    vllm = "vllm"


def experiment(
    name: Annotated[
        str, typer.Argument(help="an experiment name, or all: the paper's (prefix, headroom, tuned by name)")
    ],
    backend: Annotated[BackendKind, typer.Option(help="where to run it")] = BackendKind.sim,
    quick: Annotated[bool, typer.Option(help="small and fast: one seed, fewer points and requests")] = False,
    out: Annotated[Path, typer.Option(help="results directory (resumable: finished cells are kept)")] = Path(
        "out/experiments"
    ),
    requests: Annotated[
        int | None, typer.Option(help="requests per run (default: by backend and --quick)")
    ] = None,
    seeds: Annotated[int | None, typer.Option(help="seeds per variant (default: 3, --quick 1)")] = None,
    first_seed: Annotated[
        int,
        typer.Option(min=0, help="S: runs use seeds S..S+K-1 (validation apart from training)"),
    ] = 0,
    time_scale: Annotated[
        float, typer.Option(help="emulated engines: modelled durations times this (0.5: a GPU twice as fast)")
    ] = 1.0,
    saturation: Annotated[
        str,
        typer.Option(
            help="live backends: find the saturation rate live, or on the calibrated simulator (sim)"
        ),
    ] = "live",
    slo: Annotated[str, typer.Option(help=SLO_HELP)] = SLO_DEFAULT,
    executor: Annotated[
        ExecutorKind,
        typer.Option(help="sim: where the runs and saturation searches go (docs/experiments.md)"),
    ] = ExecutorKind.local,
    workers: Annotated[
        int | None, typer.Option(help="sim: parallel runs (default: the machine's cores)")
    ] = None,
    address: Annotated[
        str | None,
        typer.Option(help="--executor ray: join the Ray cluster at HOST:PORT instead of starting one"),
    ] = None,
    params_file: Annotated[Path | None, typer.Option("--params", help=PARAMS_HELP)] = None,
    cell: Annotated[
        list[str] | None,
        typer.Option(
            help="run only this cell (repeatable; its report covers the cells run); an unknown key "
            "is an error listing the experiment's"
        ),
    ] = None,
    kv_capacity_tokens: limits.KvCapacity = None,
    max_model_len: limits.MaxModelLen = None,
    max_batched_tokens: limits.MaxBatchedTokens = None,
    max_num_seqs: limits.MaxNumSeqs = None,
) -> None:
    """Run one of the paper's experiments (or all) and write its results and report section. The engine
    limits (sim only) replace the profile's; results are kept apart by them."""
    from calroute.executors import Executor, make_executor
    from calroute.experiments import EXPERIMENTS, PAPER_EXPERIMENTS, get_experiment
    from calroute.experiments.kit.report import write_report
    from calroute.experiments.kit.runner import Backend, Scale, run_experiment, scale_for
    from calroute.experiments.kit.sim_backend import SimBackend

    with exit_on_error():
        slo_spec = slo_option(slo)
        given = limits.overrides(kv_capacity_tokens, max_model_len, max_batched_tokens, max_num_seqs)
        names = list(PAPER_EXPERIMENTS) if name == "all" else [get_experiment(name).name]
        if cell and len(names) > 1:
            raise ConfigError("--cell names cells of one experiment, not of all")
        experiments = [get_experiment(n) for n in names]
        if params_file is not None:
            experiments = with_params_file(experiments, params_file, quick)
        default = scale_for(backend.value, quick)
        if (requests is not None and requests < 1) or (seeds is not None and seeds < 1):
            raise ConfigError(f"--requests and --seeds must be >= 1, got {requests}, {seeds}")
        count = seeds or len(default.seeds)
        scale = Scale(requests or default.requests, tuple(range(first_seed, first_seed + count)))
        pool: Executor | None = None
        if backend is not BackendKind.sim:
            # Refused rather than ignored: a live backend runs one cluster at a time, so they could only
            # mislead (the runs would not be spread anywhere).
            if executor is not ExecutorKind.local or workers is not None or address is not None:
                raise ConfigError("--executor, --workers and --address apply to --backend sim only")
            if given:
                raise ConfigError(
                    "--kv-capacity-tokens, --max-model-len, --max-batched-tokens and --max-num-seqs apply "
                    "to --backend sim only (live clusters are the experiment's own)"
                )
            from calroute.experiments.kit.live_backend import live_backend

            be: Backend = live_backend(
                backend.value,
                out / backend.value / "_clusters",
                err.print,
                quick,
                time_scale,
                saturation,
                slo_spec,
            )
        else:
            if time_scale != 1.0 or saturation != "live":
                raise ConfigError("--time-scale and --saturation apply to live backends only")
            profile = load_profile(limits=given)
            # Before anything is written: a Ray address that does not answer fails here.
            pool = make_executor(executor.value, workers, address)
            be = SimBackend(profile, slo_spec, pool)
        try:
            for exp in experiments:
                run_experiment(
                    exp,
                    be,
                    quick,
                    out / backend.value,
                    progress=err.print,
                    scale=scale,
                    # "out": the report's command line names the --out given, wherever the results are moved
                    extra_manifest={
                        "time_scale": time_scale,
                        "saturation": saturation,
                        "out": str(out),
                        # where the runs ran (their results are the same on every executor)
                        **({"executor": f"{pool.kind}:{pool.workers}"} if pool is not None else {}),
                    },
                    slo=slo_spec,
                    engine_limits=given,
                    only_cells=tuple(cell or ()),
                )
        finally:
            close = getattr(be, "close", None)
            if close is not None:
                close()
            if pool is not None:
                pool.close()
        report = write_report(out / backend.value, EXPERIMENTS)
    err.print(f"report: {report}")


def with_params_file(experiments: list[Experiment], path: Path, quick: bool) -> list[Experiment]:
    """Each experiment with the file's parameters on its variants of the file's policy; the file must be for
    a policy that at least one of them runs."""
    from calroute.experiments.kit.params_files import WithParams, experiment_policies
    from calroute.policies.params_file import check_runs_policy, load_params_file

    pf = load_params_file(path)
    runs = set().union(*(experiment_policies(e, quick) for e in experiments))
    check_runs_policy(pf, sorted(runs))
    return [
        WithParams(e, pf.policy, pf.params) if pf.policy in experiment_policies(e, quick) else e
        for e in experiments
    ]


def report(
    directory: Annotated[Path, typer.Argument(help="a results directory (calroute experiment --out)")],
) -> None:
    """Assemble every experiment's results under DIR into one Markdown report with plots."""
    from calroute.experiments import EXPERIMENTS
    from calroute.experiments.kit.report import write_report

    with exit_on_error():
        path = write_report(directory, EXPERIMENTS)
    err.print(f"wrote {path}")
