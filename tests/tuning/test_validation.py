"""Validation: held-out seeds only, every workload at its own rate, pairs by seed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from calroute.costmodel.profiles import HardwareProfile
from calroute.executors.local import LocalExecutor
from calroute.tuning.config import TuneConfig, WorkloadSpec
from calroute.tuning.validation import (
    validate,
    validation_seeds,
    validation_steps,
    validation_workloads,
)

TRACES = Path(__file__).resolve().parents[2] / "data" / "traces"


def test_validation_seeds_follow_the_training_ones(tiny: TuneConfig) -> None:
    assert validation_seeds(tiny, 3) == [2, 3, 4]
    assert not set(validation_seeds(tiny, 10)) & set(tiny.train_seeds)


def test_the_training_workload_comes_first_and_once(tiny: TuneConfig) -> None:
    names = [w.name for w in validation_workloads(tiny, ["chat", "mixed-bursty", "document"])]
    assert names == ["mixed-bursty", "chat", "document"]


def test_hand_set_against_itself_is_a_tie_and_tuned_values_are_paired_by_seed(
    tiny: TuneConfig, profile: HardwareProfile
) -> None:
    config = replace(tiny, rate_factors=(0.9, 1.1))
    workloads = validation_workloads(config, ["chat"])
    steps = 0

    def step() -> None:
        nonlocal steps
        steps += 1

    with LocalExecutor(1) as ex:
        same = validate(config, profile, {}, {}, [2, 3, 4], workloads, {"mixed-bursty": 10.0}, ex, step)
        tuned = {"w_b": 4.0, "rho": 0.0}
        other = validate(config, profile, {}, tuned, [2, 3, 4], workloads, {"mixed-bursty": 10.0}, ex)
    assert steps == validation_steps(2, 3, 2)
    assert [f.workload for f in same] == ["mixed-bursty", "chat"]
    assert same[0].trained_on and not same[1].trained_on
    assert same[0].saturation_rps == 10.0  # the study's, not searched again
    assert same[1].saturation_rps is not None and same[1].saturation_rps > 0
    for f in same:
        assert len(f.handset) == len(f.tuned) == 3
        assert f.handset == f.tuned
        d = f.diff
        assert d is not None and d.mean == 0 and d.n == 3
        assert f.to_dict()["tuned_minus_handset"]["verdict"] == "within noise (n = 3)"
    # the hand-set side does not depend on what it is compared with
    assert [f.handset for f in other] == [f.handset for f in same]
    assert [f.tuned for f in other] != [f.tuned for f in same]


def test_a_trace_validates_on_windows_it_never_trained_on(tiny: TuneConfig) -> None:
    trace = TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
    config = replace(tiny, workloads=(WorkloadSpec(str(trace), 50, windows=5),))
    train = {
        tuple(r.prompt_tokens for r in config.workloads[0].source().requests(None, s))
        for s in config.train_seeds
    }
    held_out = {
        tuple(r.prompt_tokens for r in config.workloads[0].source().requests(None, s))
        for s in validation_seeds(config, 3)
    }
    assert len(train) == 2 and len(held_out) == 3 and not train & held_out
