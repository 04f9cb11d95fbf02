from __future__ import annotations

import pytest

from calroute.costmodel.profiles import DEFAULT_PROFILE, HardwareProfile, get_profile
from calroute.tuning.config import TuneConfig, WorkloadSpec


@pytest.fixture
def profile() -> HardwareProfile:
    return get_profile(DEFAULT_PROFILE)


@pytest.fixture
def tiny() -> TuneConfig:
    """A study small enough for a unit test: two short traces, one rate, three trials a batch."""
    return TuneConfig(
        "marginal_cost",
        (WorkloadSpec("mixed-bursty", 100),),
        prefill=1,
        decode=2,
        train_seeds=(0, 1),
        rate_factors=(1.0,),
        search=("w_b", "w_b_dec", "rho", "w_q"),
        batch_size=3,
        study_seed=7,
    )
