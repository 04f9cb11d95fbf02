"""The arrival schedules of benchmarks/overhead/phases.py: common random numbers across modes."""

from __future__ import annotations

import numpy as np
from benchmarks.overhead.phases import step_arrivals


def test_a_ramp_step_is_the_same_for_every_mode_and_another_on_its_retry() -> None:
    first = step_arrivals(0, 22.5, 3.0, retry=False)
    assert first == step_arrivals(0, 22.5, 3.0, retry=False)  # what every mode is sent at this step
    assert first != step_arrivals(0, 22.5, 3.0, retry=True)
    assert first != step_arrivals(0, 33.75, 3.0, retry=False)
    assert first != step_arrivals(1, 22.5, 3.0, retry=False)


def test_a_ramp_step_offers_its_rate_for_its_duration() -> None:
    arrivals_s = np.array(step_arrivals(0, 400.0, 10.0, retry=False))
    assert np.all(np.diff(arrivals_s) >= 0) and 0 < arrivals_s[0] and arrivals_s[-1] < 10.0
    assert abs(len(arrivals_s) - 4000) < 4 * np.sqrt(4000)
