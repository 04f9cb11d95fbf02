"""The Optuna study: TPE over the declared ranges, asked and told in fixed-size batches whose runs go through
an executor, stored in SQLite so that a rerun continues it.

Determinism: a batch's trials are asked before any of them runs, from a TPE sampler seeded by the study's
seed and the number of trials already done, and told in order. Nothing depends on which worker finishes
first or on how many there are, so the same seed gives the same study on every executor and worker count,
and a study resumed at a batch boundary takes the same course as one never stopped. A study stopped inside
a batch (Ctrl-C, a kill) leaves that batch's trials unfinished; a rerun marks them failed (they are not
counted) and asks afresh.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.exc import SQLAlchemyError

from calroute.costmodel.profiles import HardwareProfile
from calroute.errors import ConfigError
from calroute.executors import Executor
from calroute.policies import params_class
from calroute.policies.base import parse_params
from calroute.policies.search_space import Range
from calroute.splitmix import hash64
from calroute.tuning.config import TuneConfig
from calroute.tuning.jobs import RunJob, run_goodput

STUDY_NAME = "calroute-tune"
# Trials of the first batches are drawn at random before TPE models anything (Optuna's default).
STARTUP_TRIALS = 10
_FAILED_REASON = "reason"  # a trial's user attribute: why it failed ("invalid" counts as done)
PER_WORKLOAD = "per_workload"  # a trial's user attribute, with several workloads: each one's mean goodput


@dataclass(frozen=True)
class Saturation:
    """A training workload's saturation rate for the hand-set parameters, found once per study."""

    rate_rps: float
    target: float
    relative: bool
    probes: tuple[tuple[float, float], ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "rate_rps": self.rate_rps,
            "target": self.target,
            "relative": self.relative,
            "probes": [list(p) for p in self.probes],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Saturation:
        probes = tuple((float(r), float(g)) for r, g in d["probes"])
        return cls(float(d["rate_rps"]), float(d["target"]), bool(d["relative"]), probes)


def distribution(r: Range) -> BaseDistribution:
    if r.integer:
        return IntDistribution(int(r.low), int(r.high), log=r.log)
    return FloatDistribution(r.low, r.high, log=r.log)


def open_study(storage: Path, config: TuneConfig) -> optuna.Study:
    """The stored study for ``config``, created (with the hand-set parameters as its first trial) if the
    file holds none; a study stored under another configuration is a ConfigError naming what differs."""
    url = f"sqlite:///{storage.resolve()}"
    key = json.loads(json.dumps(config.key()))
    storage.parent.mkdir(parents=True, exist_ok=True)
    try:
        study = optuna.load_study(study_name=STUDY_NAME, storage=url)
    except SQLAlchemyError as e:
        why = getattr(e, "orig", None) or e
        raise ConfigError(f"--storage {storage}: not a study database SQLite can open ({why})") from e
    except KeyError:
        study = optuna.create_study(study_name=STUDY_NAME, storage=url, direction="maximize")
        study.set_user_attr("config", key)
        _enqueue_handset(study, config)
        return study
    stored = study.user_attrs.get("config")
    if stored != key:
        raise ConfigError(f"--storage {storage}: {_differences(stored, key)}")
    return study


def handset_values(config: TuneConfig) -> dict[str, Any]:
    """The searched parameters' hand-set values (their defaults)."""
    defaults = params_class(config.policy)()
    return {n: getattr(defaults, n) for n in config.space}


def handset_trial(study: optuna.Study, config: TuneConfig) -> FrozenTrial | None:
    """The complete trial of the hand-set values."""
    want = handset_values(config)
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return next((t for t in complete if t.params == want), None)


def _enqueue_handset(study: optuna.Study, config: TuneConfig) -> None:
    """The hand-set values as the next trial, unless done or waiting: TPE starts from a known point, and the
    best trial is never worse on the training objective than what the study set out to improve."""
    want = handset_values(config)
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    # a waiting trial has no params yet: what enqueue_trial fixed is in its system attributes (comparing
    # params enqueued the hand-set values twice, so every study ran them as trials 0 and 1)
    queued = any(t.system_attrs.get("fixed_params") == want for t in waiting)
    if handset_trial(study, config) is None and not queued:
        study.enqueue_trial(want)


def _differences(stored: Any, key: dict[str, Any]) -> str:
    if not isinstance(stored, dict):
        return "holds a study that calroute tune did not make; give another --storage"
    diff = [
        f"{k} {json.dumps(stored.get(k))} there, {json.dumps(key.get(k))} here"
        for k in sorted(set(stored) | set(key))
        if stored.get(k) != key.get(k)
    ]
    return (
        "holds a study of another configuration, so it cannot be resumed with this one ("
        + "; ".join(diff)
        + "); rerun with the same options, or give another --storage"
    )


# Where a study keeps its saturation rates: one workload's under "saturation" (as studies stored before
# several could be trained on have it), several families' under "saturations", by name.
_SATURATION = "saturation"
_SATURATIONS = "saturations"


def stored_saturations(study: optuna.Study, config: TuneConfig) -> dict[str, Saturation]:
    """The training workloads' saturation rates found so far, by name."""
    if not config.several:
        d = study.user_attrs.get(_SATURATION)
        return {} if d is None else {config.names[0]: Saturation.from_dict(d)}
    stored = study.user_attrs.get(_SATURATIONS, {})
    return {n: Saturation.from_dict(stored[n]) for n in config.names if n in stored}


def record_saturation(study: optuna.Study, config: TuneConfig, name: str, sat: Saturation) -> None:
    if not config.several:
        study.set_user_attr(_SATURATION, sat.to_dict())
        return
    stored = dict(study.user_attrs.get(_SATURATIONS, {}))
    stored[name] = sat.to_dict()
    study.set_user_attr(_SATURATIONS, stored)


def done_trials(study: optuna.Study) -> list[FrozenTrial]:
    """Trials that count toward the total: complete ones, and those whose parameters the policy refused."""
    return [
        t
        for t in study.get_trials(deepcopy=False)
        if t.state is TrialState.COMPLETE
        or (t.state is TrialState.FAIL and t.user_attrs.get(_FAILED_REASON) == "invalid")
    ]


def best_trial(study: optuna.Study) -> FrozenTrial | None:
    complete = [t for t in study.get_trials(deepcopy=False) if t.state is TrialState.COMPLETE]
    # the earliest of equal values: ties go to the hand-set trial, the first
    return max(complete, key=lambda t: (t.value, -t.number)) if complete else None


def _close_stale(study: optuna.Study) -> int:
    """Trials a stopped run left unfinished, marked failed; how many."""
    stale = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for t in stale:
        study.tell(t.number, state=TrialState.FAIL)
    return len(stale)


def _sampler(config: TuneConfig, done: int) -> optuna.samplers.BaseSampler:
    # Reseeded per batch from (study seed, trials done): a resumed study draws what an unbroken one would.
    seed = hash64(config.study_seed, done) % (1 << 32)
    return optuna.samplers.TPESampler(
        seed=seed, multivariate=True, constant_liar=True, n_startup_trials=STARTUP_TRIALS
    )


def trial_jobs(
    config: TuneConfig,
    profile: HardwareProfile,
    params: Mapping[str, Any],
    rates: Mapping[str, Sequence[float]],
) -> list[RunJob]:
    """A trial's runs: each training workload (in the config's order), every training seed at each of its
    ``rates``."""
    setup = config.setup(profile, params)
    return [
        RunJob(setup, config.policy, w, seed, rate)
        for w in config.workloads
        for seed in config.train_seeds
        for rate in rates[w.name]
    ]


def per_workload(
    config: TuneConfig, rates: Mapping[str, Sequence[float]], goodputs: Sequence[float]
) -> dict[str, float]:
    """A trial's runs (as trial_jobs orders them) as each workload's mean goodput over seeds x rates."""
    out = {}
    start = 0
    for name in config.names:
        n = len(config.train_seeds) * len(rates[name])
        out[name] = math.fsum(goodputs[start : start + n]) / n
        start += n
    return out


def objective(means: Mapping[str, float]) -> float:
    """The mean of the workloads' means: each family weighs the same, whatever its goodput's scale or its
    rates. One workload: its mean, unchanged."""
    return math.fsum(means.values()) / len(means)


def run_study(
    study: optuna.Study,
    config: TuneConfig,
    profile: HardwareProfile,
    rates: Mapping[str, Sequence[float]],
    trials: int,
    executor: Executor,
    on_trial: Callable[[int, FrozenTrial | None], None] | None = None,
    on_run: Callable[[], None] | None = None,
) -> None:
    """Ask, run and tell batches until ``trials`` trials are done. ``on_trial(done, best)`` after each trial
    is told, ``on_run()`` as each simulated run finishes. ``rates``: each training workload's rates, by
    name. A trial's value is ``objective``: its mean goodput over the training seeds and rates, averaged
    over the workloads; with several, each one's mean is kept in the trial (``per_workload``)."""
    if trials < 1:
        raise ConfigError(f"--trials must be >= 1, got {trials}")
    missing = [n for n in config.names if n not in rates]
    if missing:
        raise ConfigError(f"no training rates for {', '.join(missing)}")
    _close_stale(study)
    _enqueue_handset(study, config)  # again if a stopped batch held it
    dists = {n: distribution(r) for n, r in config.space.items()}
    cls = params_class(config.policy)
    done = len(done_trials(study))
    if on_trial is not None:
        on_trial(done, best_trial(study))
    while done < trials:
        study.sampler = _sampler(config, done)
        batch = [study.ask(dists) for _ in range(min(config.batch_size, trials - done))]
        try:
            valid, jobs, invalid = [], [], {}
            for t in batch:
                params = config.params(t.params)
                try:
                    parse_params(config.policy, cls, params)
                except ConfigError as e:  # e.g. every weight of a score at 0
                    invalid[t.number] = str(e)
                    continue
                valid.append(t)
                jobs += trial_jobs(config, profile, params, rates)

            def on_result(_: int, __: float) -> None:
                if on_run is not None:
                    on_run()

            goodputs = executor.map(run_goodput, jobs, on_result)
        except BaseException:
            # stopped mid-batch: its trials are not done (a rerun asks afresh)
            for t in batch:
                study.tell(t, state=TrialState.FAIL, skip_if_finished=True)
            raise
        per_trial = len(jobs) // max(1, len(valid))
        values = {
            t.number: per_workload(config, rates, goodputs[i * per_trial : (i + 1) * per_trial])
            for i, t in enumerate(valid)
        }
        for t in batch:
            if t.number in values:
                means = values[t.number]
                if config.several:
                    t.set_user_attr(PER_WORKLOAD, means)
                study.tell(t, objective(means))
            else:
                t.set_user_attr(_FAILED_REASON, "invalid")
                t.set_user_attr("error", invalid[t.number])
                study.tell(t, state=TrialState.FAIL)
            done += 1
            if on_trial is not None:
                on_trial(done, best_trial(study))
