"""`calroute tune`: search a policy's declared parameters on the calibrated simulator (docs/tuning.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from calroute.cli import limits
from calroute.cli.common import (
    err,
    exit_on_error,
    load_profile,
    out,
    parse_param_options,
    progress_bar,
)
from calroute.costmodel.profiles import DEFAULT_PROFILE, profile_names
from calroute.errors import ConfigError
from calroute.executors import EXECUTORS
from calroute.policies import params_class, policy_names
from calroute.workload.source import WORKLOADS


def _names(spec: str, option: str, known: tuple[str, ...] | None = None) -> list[str]:
    names = list(dict.fromkeys(n.strip() for n in spec.split(",") if n.strip()))
    if known is not None:
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ConfigError(f"{option}: unknown {', '.join(unknown)}; known: {', '.join(known)}")
    return names


def training_families(spec: str) -> list[str]:
    """``--workload``: one family, several (comma-separated; a name given twice counts once), or all."""
    if spec == "all":
        return list(WORKLOADS)
    names = _names(spec, "--workload", WORKLOADS)
    if not names:
        raise ConfigError(f"--workload: no family given; known: {', '.join(WORKLOADS)}")
    return names


def _factors(spec: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in _names(spec, "--rate-factors"))
    except ValueError as e:
        raise ConfigError(f"--rate-factors {spec!r}: expected numbers, e.g. 0.9,1.0,1.1") from e


def tune(
    out_file: Annotated[
        Path, typer.Option("--out", help="the params file to write (JSON; a .md report beside)")
    ],
    prefill: Annotated[int, typer.Option(min=1, help="prefill instances")],
    decode: Annotated[int, typer.Option(min=1, help="decode instances")],
    workload: Annotated[
        str | None,
        typer.Option(
            help="a workload family, several (comma-separated: trained on together), or all: "
            + ", ".join(WORKLOADS)
        ),
    ] = None,
    trace: Annotated[
        Path | None, typer.Option(help="a trace file, cut into training and validation windows")
    ] = None,
    policy: Annotated[str, typer.Option(help=f"the policy to tune: {', '.join(policy_names())}")] = (
        "marginal_cost"
    ),
    trials: Annotated[
        int, typer.Option(help="trials in the study (a rerun continues it to this many)")
    ] = 200,
    executor: Annotated[str, typer.Option(help=f"where runs go: {', '.join(EXECUTORS)}")] = "local",
    workers: Annotated[
        int | None, typer.Option(help="worker processes (default: the machine's cores)")
    ] = None,
    address: Annotated[str | None, typer.Option(help="a Ray cluster to join (--executor ray)")] = None,
    seed: Annotated[int, typer.Option(help="the study's seed (TPE's draws)")] = 0,
    storage: Annotated[
        Path | None, typer.Option(help="the study's SQLite file (default: beside --out, NAME.study.db)")
    ] = None,
    calibration: Annotated[
        Path | None, typer.Option(help="calibration JSON: the simulated hardware (default: the profile)")
    ] = None,
    profile: Annotated[str, typer.Option(help=f"hardware profile: {', '.join(profile_names())}")] = (
        DEFAULT_PROFILE
    ),
    requests: Annotated[int, typer.Option(min=1, help="requests per run (a trace: per window)")] = 3000,
    seeds: Annotated[
        int, typer.Option(min=1, help="training seeds 0..K-1 (a trace: its first K windows)")
    ] = 4,
    rate_factors: Annotated[
        str, typer.Option(help="training rates, as multiples of the hand-set saturation rate")
    ] = "0.9,1.0,1.1",
    search: Annotated[
        str | None, typer.Option(help="comma-separated parameters to search (default: every declared one)")
    ] = None,
    param: Annotated[
        list[str] | None, typer.Option(help="a parameter set, not searched: NAME=VALUE (repeatable)")
    ] = None,
    validation_seeds: Annotated[
        int, typer.Option(help="held-out seeds after the training ones (0: no validation)")
    ] = 10,
    validate_on: Annotated[
        str, typer.Option(help="families validated on besides the training workload: all, none, or a list")
    ] = "all",
    batch_size: Annotated[
        int, typer.Option(help="trials asked at once (part of the study: independent of --workers)")
    ] = 8,
    kv_capacity_tokens: limits.KvCapacity = None,
    max_model_len: limits.MaxModelLen = None,
    max_batched_tokens: limits.MaxBatchedTokens = None,
    max_num_seqs: limits.MaxNumSeqs = None,
) -> None:
    """Tune a policy's parameters on the simulator: TPE over their declared ranges, maximising mean goodput
    around saturation; writes the parameters and a validation on held-out seeds and every family."""
    import optuna

    from calroute.executors import make_executor
    from calroute.tuning.config import TuneConfig, WorkloadSpec, file_sha256, typed_params
    from calroute.tuning.tune import Hooks
    from calroute.tuning.tune import tune as run_tune

    with exit_on_error():
        if (workload is None) == (trace is None):
            raise ConfigError("give exactly one of --workload and --trace")
        if trace is not None and not trace.is_file():
            raise ConfigError(f"--trace {trace}: no such file")
        if trials < 1:
            raise ConfigError(f"--trials must be >= 1, got {trials}")
        if validation_seeds < 0:
            raise ConfigError(f"--validation-seeds must be >= 0, got {validation_seeds}")
        given = limits.overrides(kv_capacity_tokens, max_model_len, max_batched_tokens, max_num_seqs)
        params_class(policy)  # an unknown policy, named
        fixed = typed_params(
            policy, parse_param_options(param or [], [policy], qualified=False).get(policy, {})
        )
        presets: dict[str, list[str]] = {"all": list(WORKLOADS), "none": []}
        if validate_on in presets:
            families = presets[validate_on]
        else:
            families = _names(validate_on, "--validate-on", WORKLOADS)
        if workload is not None:
            specs = tuple(WorkloadSpec(n, requests) for n in training_families(workload))
        else:
            # a trace: one window per training and validation seed, so the two never share a stretch of it
            specs = (WorkloadSpec(str(trace), requests, seeds + validation_seeds),)
        config = TuneConfig(
            policy=policy,
            workloads=specs,
            prefill=prefill,
            decode=decode,
            train_seeds=tuple(range(seeds)),
            rate_factors=_factors(rate_factors),
            search=None if search is None else tuple(_names(search, "--search")),
            fixed=fixed,
            study_seed=seed,
            batch_size=batch_size,
            # the engine limits are part of what was tuned on: a study resumed with others is another study
            calibration_source=(str(calibration) if calibration is not None else f"profile {profile}")
            + "".join(f", {k}={v}" for k, v in sorted(given.items())),
            calibration_sha256=None if calibration is None else file_sha256(calibration),
        )
        hw = load_profile(profile, calibration, limits=given)
        db = storage or out_file.with_name(f"{out_file.stem}.study.db")
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        with make_executor(executor, workers, address) as ex, progress_bar() as progress:
            task = progress.add_task("starting", total=None)

            # Without a terminal the bar is off (common.progress_bar): a line per phase and per batch instead,
            # for logs of long studies.
            log = not err.is_terminal

            phase = ""

            def on_phase(name: str, steps: int | None) -> None:
                nonlocal phase
                phase = name
                progress.reset(task, total=steps, description=name)
                if log:
                    err.print(name)

            def on_trial(done: int, best: float | None) -> None:
                best_s = "-" if best is None else f"{best:.4f}"
                progress.update(task, completed=done, description=f"trials (best goodput {best_s})")
                if log and (done % batch_size == 0 or done == trials):
                    err.print(f"trials {done}/{trials}, best goodput {best_s}")

            def on_step() -> None:
                # a step of the trials phase is one run: its bar counts trials (on_trial)
                if phase != "trials":
                    progress.advance(task)

            try:
                result = run_tune(
                    config,
                    hw,
                    trials,
                    db,
                    out_file,
                    ex,
                    validation_seeds,
                    families,
                    Hooks(on_phase, on_step, on_trial),
                )
            except KeyboardInterrupt:
                err.print(f"interrupted: the study is kept in {db}; rerun the same command to resume it")
                raise typer.Exit(130) from None
    out.print(result.report.read_text(), markup=False, highlight=False)
    err.print(f"wrote {result.out} and {result.report} (study: {db})")
