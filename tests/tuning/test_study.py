"""The study: the hand-set trial first, the same course on every worker count and across a resume, an
interrupted batch not counted, another configuration refused; with several families, the mean of each one's
mean."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from optuna.trial import TrialState

from calroute.costmodel.profiles import HardwareProfile
from calroute.errors import ConfigError
from calroute.executors.local import LocalExecutor
from calroute.tuning.config import TuneConfig, WorkloadSpec
from calroute.tuning.jobs import RunJob
from calroute.tuning.study import done_trials, handset_trial, handset_values, open_study, run_study

RATES = {"mixed-bursty": (10.0,)}


def study_course(
    db: Path, config: TuneConfig, profile: HardwareProfile, trials: int, workers: int = 1
) -> list[tuple[dict[str, Any], float | None]]:
    with LocalExecutor(workers) as ex:
        study = open_study(db, config)
        run_study(study, config, profile, RATES, trials, ex)
    return [(t.params, t.value) for t in study.get_trials() if t.state is TrialState.COMPLETE]


def test_the_first_trial_is_the_hand_set_parameters(
    tmp_path: Path, tiny: TuneConfig, profile: HardwareProfile
) -> None:
    course = study_course(tmp_path / "s.db", tiny, profile, 3)
    assert len(course) == 3
    assert course[0][0] == {"w_b": 0.26, "w_b_dec": 0.0, "rho": 1.0, "w_q": 1e-3} == handset_values(tiny)
    # once: the others are drawn in the declared ranges (each study once ran the hand-set values twice)
    assert all(params != course[0][0] for params, _ in course[1:])
    for params, value in course[1:]:
        assert 0 <= params["w_b"] <= 4 and 1e-5 <= params["w_q"] <= 0.1
        assert value is not None and 0 <= value <= 1


def test_one_and_two_workers_run_the_same_study(
    tmp_path: Path, tiny: TuneConfig, profile: HardwareProfile
) -> None:
    one = study_course(tmp_path / "one.db", tiny, profile, 5, workers=1)
    two = study_course(tmp_path / "two.db", tiny, profile, 5, workers=2)
    assert one == two
    assert len({v for _, v in one}) > 1  # the trials differ: equal courses are not a constant


def test_a_study_resumed_at_a_batch_boundary_takes_the_unbroken_course(
    tmp_path: Path, tiny: TuneConfig, profile: HardwareProfile
) -> None:
    unbroken = study_course(tmp_path / "a.db", tiny, profile, 6)
    study_course(tmp_path / "b.db", tiny, profile, 3)
    assert study_course(tmp_path / "b.db", tiny, profile, 6) == unbroken


class Stop(KeyboardInterrupt):
    pass


def test_an_interrupted_study_resumes_to_the_full_count(
    tmp_path: Path, tiny: TuneConfig, profile: HardwareProfile
) -> None:
    db = tmp_path / "s.db"
    runs = 0

    def stop_in_the_second_batch() -> None:
        nonlocal runs
        runs += 1
        if runs == 3 * 2 + 1:  # the first run of the second batch (3 trials x 2 seeds a batch)
            raise Stop

    with LocalExecutor(1) as ex, pytest.raises(Stop):
        run_study(open_study(db, tiny), tiny, profile, RATES, 7, ex, on_run=stop_in_the_second_batch)
    study = open_study(db, tiny)
    assert len(done_trials(study)) == 3
    assert [t.state for t in study.get_trials()][3:] == [TrialState.FAIL] * 3  # the stopped batch
    with LocalExecutor(1) as ex:
        run_study(study, tiny, profile, RATES, 7, ex)
    assert len(done_trials(study)) == 7
    assert handset_trial(study, tiny) is not None


def test_an_interrupted_first_batch_still_starts_from_the_hand_set_values(
    tmp_path: Path, tiny: TuneConfig, profile: HardwareProfile
) -> None:
    db = tmp_path / "s.db"

    def stop() -> None:
        raise Stop

    with LocalExecutor(1) as ex, pytest.raises(Stop):
        run_study(open_study(db, tiny), tiny, profile, RATES, 3, ex, on_run=stop)
    study = open_study(db, tiny)
    with LocalExecutor(1) as ex:
        run_study(study, tiny, profile, RATES, 3, ex)
    hand = handset_trial(study, tiny)
    assert hand is not None and hand.number == 3


def test_a_stored_study_of_another_configuration_is_refused(
    tmp_path: Path, tiny: TuneConfig, profile: HardwareProfile
) -> None:
    db = tmp_path / "s.db"
    study_course(db, tiny, profile, 1)
    with pytest.raises(ConfigError, match="another configuration.*study_seed 7 there, 8 here"):
        open_study(db, replace(tiny, study_seed=8))
    with pytest.raises(ConfigError, match="train_seeds"):
        open_study(db, replace(tiny, train_seeds=(0, 1, 2)))
    open_study(db, tiny)  # the same one resumes


def test_a_file_that_is_not_a_study_database_is_refused(tmp_path: Path, tiny: TuneConfig) -> None:
    db = tmp_path / "s.db"
    db.write_text("not sqlite")
    with pytest.raises(ConfigError, match="not a study database"):
        open_study(db, tiny)


def test_trials_below_one_are_refused(tmp_path: Path, tiny: TuneConfig, profile: HardwareProfile) -> None:
    with LocalExecutor(1) as ex, pytest.raises(ConfigError, match="--trials must be >= 1"):
        run_study(open_study(tmp_path / "s.db", tiny), tiny, profile, RATES, 0, ex)


def fake_goodput(job: RunJob) -> float:
    """A goodput that says which run it is: the family's level, plus the seed and the rate."""
    return {"chat": 0.2, "reasoning": 0.6}[job.workload.name] + job.seed / 100 + job.rate_rps / 1000


def test_several_families_score_the_mean_of_each_ones_mean(
    tmp_path: Path, tiny: TuneConfig, profile: HardwareProfile, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("calroute.tuning.study.run_goodput", fake_goodput)
    config = replace(tiny, workloads=(WorkloadSpec("reasoning", 100), WorkloadSpec("chat", 100)))
    # unequal run counts per family, so the mean of the means is not the mean of all runs
    rates = {"chat": (10.0,), "reasoning": (20.0, 30.0)}
    study = open_study(tmp_path / "s.db", config)
    with LocalExecutor(1) as ex:
        run_study(study, config, profile, rates, 1, ex)
    (trial,) = done_trials(study)
    chat = [0.2 + s / 100 + 10 / 1000 for s in (0, 1)]
    reasoning = [0.6 + s / 100 + r / 1000 for s in (0, 1) for r in (20.0, 30.0)]
    means = {"chat": sum(chat) / 2, "reasoning": sum(reasoning) / 4}
    assert trial.user_attrs["per_workload"] == pytest.approx(means)
    assert trial.value == pytest.approx((means["chat"] + means["reasoning"]) / 2)
    assert trial.value != pytest.approx(sum(chat + reasoning) / 6)


def test_one_familys_trial_is_its_mean_over_seeds_and_rates(
    tmp_path: Path, tiny: TuneConfig, profile: HardwareProfile, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("calroute.tuning.study.run_goodput", fake_goodput)
    config = replace(tiny, workloads=(WorkloadSpec("chat", 100),))
    study = open_study(tmp_path / "s.db", config)
    with LocalExecutor(1) as ex:
        run_study(study, config, profile, {"chat": (10.0, 20.0)}, 1, ex)
    (trial,) = done_trials(study)
    runs = [0.2 + s / 100 + r / 1000 for s in (0, 1) for r in (10.0, 20.0)]
    assert trial.value == math.fsum(runs) / 4  # exactly as before several families could be trained on
    assert "per_workload" not in trial.user_attrs


def test_a_family_without_rates_is_named(tmp_path: Path, tiny: TuneConfig, profile: HardwareProfile) -> None:
    config = replace(tiny, workloads=(WorkloadSpec("reasoning", 100), WorkloadSpec("chat", 100)))
    with LocalExecutor(1) as ex, pytest.raises(ConfigError, match="no training rates for reasoning"):
        run_study(open_study(tmp_path / "s.db", config), config, profile, {"chat": (1.0,)}, 1, ex)
