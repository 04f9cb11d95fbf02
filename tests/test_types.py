"""The shared value types pickle by their constructor (types.PicklesByConstructor, SlottedValue), so that a
process pool can send them to its workers from the compiled build too (tests/sim/test_compiled.py runs the
same round trips there)."""

from __future__ import annotations

import pickle
from dataclasses import dataclass

import pytest

from calroute.costmodel.profiles import get_profile
from calroute.policies.marginal_cost import Params
from calroute.types import Admission, InstanceState, PicklesByConstructor, Role, SloClass


@pytest.mark.parametrize(
    "value",
    [
        get_profile("a40-qwen2.5-3b").calibration,
        Params(w_b=0.5),
        Admission("r", 700, 180, SloClass.TIGHT),
        InstanceState("p0", Role.PREFILL, True, 1, 0.1, 10, 20, 60_000, 0, 0, 0.02),
    ],
)
def test_values_round_trip(value: object) -> None:
    assert pickle.loads(pickle.dumps(value)) == value


@dataclass(frozen=True)
class _Checked(PicklesByConstructor):
    n: int

    def __post_init__(self) -> None:
        if self.n < 0:
            raise ValueError("n must be >= 0")


def test_unpickling_runs_the_constructors_checks() -> None:
    rebuild, (cls, values) = _Checked(3).__reduce__()
    assert rebuild(cls, values) == _Checked(3)
    with pytest.raises(ValueError, match="n must be"):
        rebuild(cls, {**values, "n": -1})  # what a tampered pickle would hold
