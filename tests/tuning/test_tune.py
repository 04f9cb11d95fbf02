"""The saturation phase: each training family's rate found once, stored in the study as it is found, and
read back on a resume (one family's where studies stored before several could be trained on keep it)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from calroute.costmodel.profiles import HardwareProfile
from calroute.executors.local import LocalExecutor
from calroute.experiments.kit.saturation import Probe, SaturationResult
from calroute.tuning.config import TuneConfig, WorkloadSpec
from calroute.tuning.jobs import SaturationJob
from calroute.tuning.study import open_study
from calroute.tuning.tune import saturations

RATES = {"chat": 5.0, "reasoning": 2.0, "mixed-bursty": 8.0}


class Stop(KeyboardInterrupt):
    pass


class FakeSearch:
    """find_rate's stand-in: a rate per family, the families searched in order, and a stop on demand."""

    def __init__(self, stop_at: str | None = None) -> None:
        self.searched: list[str] = []
        self.stop_at = stop_at

    def __call__(self, job: SaturationJob) -> SaturationResult:
        name = job.workload.name
        if name == self.stop_at:
            raise Stop
        self.searched.append(name)
        return SaturationResult(RATES[name], 0.85, (Probe(RATES[name], 0.85),))


@pytest.fixture
def two(tiny: TuneConfig) -> TuneConfig:
    return replace(tiny, workloads=(WorkloadSpec("reasoning", 100), WorkloadSpec("chat", 100)))


def test_a_resumed_study_keeps_each_familys_saturation(
    tmp_path: Path,
    two: TuneConfig,
    profile: HardwareProfile,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    search = FakeSearch()
    monkeypatch.setattr("calroute.tuning.tune.find_rate", search)
    steps = 0

    def step() -> None:
        nonlocal steps
        steps += 1

    db = tmp_path / "s.db"
    with LocalExecutor(1) as ex:
        first = saturations(open_study(db, two), two, profile, ex, step)
        again = saturations(open_study(db, two), two, profile, ex, step)
    assert search.searched == ["chat", "reasoning"]  # once each, not again on the resume
    assert {n: s.rate_rps for n, s in first.items()} == {"chat": 5.0, "reasoning": 2.0}
    assert again == first and list(again) == ["chat", "reasoning"]
    assert steps == 4  # one a family, searched or read back
    assert set(open_study(db, two).user_attrs["saturations"]) == {"chat", "reasoning"}


def test_a_stopped_search_keeps_the_families_it_found(
    tmp_path: Path, two: TuneConfig, profile: HardwareProfile, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "s.db"
    monkeypatch.setattr("calroute.tuning.tune.find_rate", FakeSearch(stop_at="reasoning"))
    with LocalExecutor(1) as ex, pytest.raises(Stop):
        saturations(open_study(db, two), two, profile, ex)
    search = FakeSearch()
    monkeypatch.setattr("calroute.tuning.tune.find_rate", search)
    with LocalExecutor(1) as ex:
        sats = saturations(open_study(db, two), two, profile, ex)
    assert search.searched == ["reasoning"]
    assert {n: s.rate_rps for n, s in sats.items()} == {"chat": 5.0, "reasoning": 2.0}


def test_one_familys_saturation_is_where_stored_studies_keep_it(
    tmp_path: Path, tiny: TuneConfig, profile: HardwareProfile, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "s.db"
    stored = {"rate_rps": 7.5, "target": 0.85, "relative": False, "probes": [[7.5, 0.85]]}
    open_study(db, tiny).set_user_attr("saturation", stored)  # as the code before several families wrote it
    search = FakeSearch()
    monkeypatch.setattr("calroute.tuning.tune.find_rate", search)
    with LocalExecutor(1) as ex:
        sats = saturations(open_study(db, tiny), tiny, profile, ex)
        assert search.searched == [] and sats["mixed-bursty"].to_dict() == stored
        other = tmp_path / "t.db"
        saturations(open_study(other, tiny), tiny, profile, ex)
    attrs = open_study(other, tiny).user_attrs
    assert attrs["saturation"]["rate_rps"] == 8.0 and "saturations" not in attrs
