"""The study: the hand-set trial first, the same course on every worker count and across a resume, an
interrupted batch not counted, another configuration refused."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from optuna.trial import TrialState

from calroute.costmodel.profiles import HardwareProfile
from calroute.errors import ConfigError
from calroute.executors.local import LocalExecutor
from calroute.tuning.config import TuneConfig
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
    assert course[0][0] == {"w_b": 1.0, "w_b_dec": 0.0, "rho": 1.0, "w_q": 1e-3} == handset_values(tiny)
    # the others are drawn in the declared ranges
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
