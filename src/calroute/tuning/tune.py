"""A tuning session, start to end: the stored study opened (or created), the training workload's saturation
found once, the trials run, the best parameters validated against the hand-set ones, the params file and
its report written."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from calroute.costmodel.profiles import HardwareProfile
from calroute.errors import ConfigError
from calroute.executors import Executor
from calroute.experiments.runner import git_commit
from calroute.tuning import output
from calroute.tuning.config import TuneConfig
from calroute.tuning.jobs import SaturationJob, find_rate
from calroute.tuning.study import (
    Saturation,
    best_trial,
    done_trials,
    handset_trial,
    open_study,
    record_saturation,
    run_study,
    stored_saturation,
)
from calroute.tuning.validation import (
    FamilyResult,
    validate,
    validation_seeds,
    validation_steps,
    validation_workloads,
)

_REPO = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class Hooks:
    """Progress callbacks (the CLI's bars); every one optional."""

    on_phase: Callable[[str, int | None], None] | None = None  # a phase starts: its name, its steps
    on_step: Callable[[], None] | None = None  # one run or search of the phase finished
    on_trial: Callable[[int, float | None], None] | None = None  # trials done, best value so far


@dataclass(frozen=True)
class TuneResult:
    out: Path
    report: Path
    doc: dict[str, Any]
    families: tuple[FamilyResult, ...]


def saturation(study: optuna.Study, config: TuneConfig, profile: HardwareProfile, ex: Executor) -> Saturation:
    """The study's saturation rate: stored in it, or found now (for the hand-set parameters, over the
    training seeds) and stored."""
    sat = stored_saturation(study)
    if sat is None:
        job = SaturationJob(
            config.setup(profile, config.handset), config.policy, config.workload, config.train_seeds
        )
        (found,) = ex.map(find_rate, [job])
        probes = tuple((p.rate_rps, p.goodput) for p in found.probes)
        sat = Saturation(found.rate_rps, found.target, found.relative, probes)
        record_saturation(study, sat)
    return sat


def tune(
    config: TuneConfig,
    profile: HardwareProfile,
    trials: int,
    storage: Path,
    out: Path,
    executor: Executor,
    validation_seed_count: int = 10,
    validate_on: Sequence[str] = (),
    hooks: Hooks = Hooks(),
) -> TuneResult:
    if trials < 1:
        raise ConfigError(f"--trials must be >= 1, got {trials}")
    if validation_seed_count < 0:
        raise ConfigError(f"--validation-seeds must be >= 0, got {validation_seed_count}")
    output.check_out(out, config.policy)
    study = open_study(storage, config)

    def phase(name: str, steps: int | None) -> None:
        if hooks.on_phase is not None:
            hooks.on_phase(name, steps)

    phase("saturation search", None)
    sat = saturation(study, config, profile, executor)
    rates = [sat.rate_rps * f for f in config.rate_factors]
    phase("trials", trials)

    def on_trial(done: int, best: optuna.trial.FrozenTrial | None) -> None:
        if hooks.on_trial is not None:
            hooks.on_trial(done, None if best is None else best.value)

    run_study(study, config, profile, rates, trials, executor, on_trial, hooks.on_step)
    best = best_trial(study)
    if best is None:
        raise ConfigError("no trial completed: every trial's parameters were refused by the policy")
    tuned = config.full_params(best.params)
    handset = config.full_params({})
    hand_trial = handset_trial(study, config)
    families: list[FamilyResult] = []
    seeds = validation_seeds(config, validation_seed_count)
    if validation_seed_count:
        workloads = validation_workloads(config, validate_on)
        phase("validation", validation_steps(len(workloads), len(seeds), len(config.rate_factors)))
        families = validate(
            config, profile, handset, tuned, seeds, workloads, sat.rate_rps, executor, hooks.on_step
        )
    training = {
        "workload": config.workload.name,
        "trace": config.workload.is_trace,
        "trace_windows": config.workload.windows,
        "prefill": config.prefill,
        "decode": config.decode,
        "requests": config.workload.requests,
        "seeds": list(config.train_seeds),
        "rate_factors": list(config.rate_factors),
        "saturation": sat.to_dict(),
        "rates_rps": rates,
        "objective": "mean goodput over the training seeds x rates",
        "space": {n: r.to_dict() for n, r in config.space.items()},
        "fixed": dict(config.fixed),
        "calibration": config.calibration_source,
        "calibration_sha256": config.calibration_sha256,
        "profile": profile.name,
        "trials": trials,
        "complete_trials": len(done_trials(study)),
        "study_seed": config.study_seed,
        "batch_size": config.batch_size,
        "storage": str(storage),
        "executor": {"kind": executor.kind, "workers": executor.workers},
        "best_trial": best.number,
        "best_objective": best.value,
        "handset_objective": None if hand_trial is None else hand_trial.value,
        "git_commit": git_commit(_REPO),
    }
    validation = (
        output.validation_section(seeds, config.rate_factors, families) if validation_seed_count else None
    )
    doc = output.document(config.policy, tuned, handset, training, validation)
    report = output.report_path(out)
    output.write_atomic(report, output.markdown(doc, families))
    output.write_atomic(out, output.json_text(doc))
    return TuneResult(out, report, doc, tuple(families))
