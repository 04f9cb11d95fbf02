"""A tuning session, start to end: the stored study opened (or created), each training workload's saturation
found once, the trials run, the best parameters validated against the hand-set ones, the params file and
its report written."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from calroute.costmodel.profiles import HardwareProfile
from calroute.errors import ConfigError
from calroute.executors import Executor
from calroute.experiments.kit.saturation import SaturationResult
from calroute.results.provenance import git_commit
from calroute.tuning import output
from calroute.tuning.config import TuneConfig
from calroute.tuning.jobs import SaturationJob, find_rate
from calroute.tuning.study import (
    PER_WORKLOAD,
    Saturation,
    best_trial,
    done_trials,
    handset_trial,
    open_study,
    record_saturation,
    run_study,
    stored_saturations,
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


def saturations(
    study: optuna.Study,
    config: TuneConfig,
    profile: HardwareProfile,
    ex: Executor,
    on_step: Callable[[], None] | None = None,
) -> dict[str, Saturation]:
    """Each training workload's saturation rate, by name: stored in the study, or found now (for the
    hand-set parameters, over the training seeds; the workloads missing one side by side on ``ex``) and
    stored as each is found, so that a stopped search keeps what it found. ``on_step()`` once per
    workload (at once for those stored)."""
    sats = stored_saturations(study, config)
    for _ in sats:
        if on_step is not None:
            on_step()
    missing = [w for w in config.workloads if w.name not in sats]
    setup = config.setup(profile, config.handset)
    jobs = [SaturationJob(setup, config.policy, w, config.train_seeds) for w in missing]

    def found(i: int, result: SaturationResult) -> None:
        probes = tuple((p.rate_rps, p.goodput) for p in result.probes)
        sat = Saturation(result.rate_rps, result.target, result.relative, probes)
        record_saturation(study, config, missing[i].name, sat)
        sats[missing[i].name] = sat
        if on_step is not None:
            on_step()

    ex.map(find_rate, jobs, found)
    return {n: sats[n] for n in config.names}


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

    phase("saturation search", len(config.workloads))
    sats = saturations(study, config, profile, executor, hooks.on_step)
    rates = {n: [sat.rate_rps * f for f in config.rate_factors] for n, sat in sats.items()}
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
        steps = validation_steps(len(workloads), len(seeds), len(config.rate_factors), len(config.workloads))
        phase("validation", steps)
        known = {n: sat.rate_rps for n, sat in sats.items()}
        families = validate(config, profile, handset, tuned, seeds, workloads, known, executor, hooks.on_step)
    training = {
        **_trained_on(config, sats, rates, best, hand_trial),
        "trace": config.workloads[0].is_trace,
        "trace_windows": config.workloads[0].windows,
        "prefill": config.prefill,
        "decode": config.decode,
        "requests": config.requests,
        "seeds": list(config.train_seeds),
        "rate_factors": list(config.rate_factors),
        **_rates(config, sats, rates),
        "objective": _OBJECTIVE_MANY if config.several else _OBJECTIVE_ONE,
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


_OBJECTIVE_ONE = "mean goodput over the training seeds x rates"
_OBJECTIVE_MANY = (
    "mean over the workloads (equal weight) of each one's mean goodput over the training seeds x its rates"
)


def _trained_on(
    config: TuneConfig,
    sats: Mapping[str, Saturation],
    rates: Mapping[str, Sequence[float]],
    best: FrozenTrial,
    hand_trial: FrozenTrial | None,
) -> dict[str, Any]:
    """What the study trained on: one workload by name (the fields a single-workload study always had), or
    several, each with its saturation, its rates, and the best and hand-set trials' mean goodput there."""
    if not config.several:
        return {"workload": config.names[0]}
    hand = {} if hand_trial is None else hand_trial.user_attrs.get(PER_WORKLOAD, {})
    best_means = best.user_attrs.get(PER_WORKLOAD, {})
    return {
        "workloads": list(config.names),
        "per_workload": {
            n: {
                "saturation": sats[n].to_dict(),
                "rates_rps": list(rates[n]),
                "best_objective": best_means.get(n),
                "handset_objective": hand.get(n),
            }
            for n in config.names
        },
    }


def _rates(
    config: TuneConfig, sats: Mapping[str, Saturation], rates: Mapping[str, Sequence[float]]
) -> dict[str, Any]:
    """One workload's saturation and rates, where a single-workload study always had them (several
    workloads keep theirs in ``per_workload``)."""
    if config.several:
        return {}
    (name,) = config.names
    return {"saturation": sats[name].to_dict(), "rates_rps": list(rates[name])}
