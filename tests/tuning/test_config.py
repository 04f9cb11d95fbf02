"""A study's configuration: one workload keeps the key stored studies have; several are a sorted list in it,
and a name that is not a family, or one given twice, is refused."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from calroute.errors import ConfigError
from calroute.tuning.config import TuneConfig, WorkloadSpec

TRACE = (
    Path(__file__).resolve().parents[2]
    / "data"
    / "traces"
    / "azure_llm_2023"
    / "AzureLLMInferenceTrace_conv.csv"
)


def several(tiny: TuneConfig, *names: str) -> TuneConfig:
    return replace(tiny, workloads=tuple(WorkloadSpec(n, 100) for n in names))


def test_the_key_of_a_one_family_study_is_the_one_stored_studies_have(tiny: TuneConfig) -> None:
    # written by the code before several families could be trained on (commit 91b456e): a stored study
    # resumes only under an equal key
    assert tiny.key() == {
        "policy": "marginal_cost",
        "workload": "mixed-bursty",
        "requests": 100,
        "trace_windows": 1,
        "prefill": 1,
        "decode": 2,
        "train_seeds": [0, 1],
        "rate_factors": [1.0],
        "space": {
            "w_b": {"low": 0.0, "high": 4.0, "log": False, "integer": False},
            "w_b_dec": {"low": 0.0, "high": 2.0, "log": False, "integer": False},
            "w_q": {"low": 1e-05, "high": 0.1, "log": True, "integer": False},
            "rho": {"low": 0.0, "high": 4.0, "log": False, "integer": False},
        },
        "fixed": {},
        "study_seed": 7,
        "batch_size": 3,
        "calibration": "profile",
        "calibration_sha256": None,
        "saturation_target": 0.85,
    }
    assert not tiny.several and tiny.names == ("mixed-bursty",)


def test_several_families_are_a_sorted_list_in_the_key_whatever_their_order(tiny: TuneConfig) -> None:
    one = several(tiny, "reasoning", "chat", "shared-prefix")
    other = several(tiny, "shared-prefix", "reasoning", "chat")
    assert one.names == other.names == ("chat", "reasoning", "shared-prefix")
    assert one.key() == other.key()
    assert one.key()["workloads"] == ["chat", "reasoning", "shared-prefix"] and "workload" not in one.key()
    assert one.key() != several(tiny, "chat", "reasoning").key()
    assert one.several and one.requests == 100


def test_a_name_that_is_not_a_family_is_named(tiny: TuneConfig) -> None:
    with pytest.raises(ConfigError, match=r"--workload: unknown nope \(.*known: chat"):
        several(tiny, "chat", "nope")


def test_a_trace_is_trained_on_alone(tiny: TuneConfig) -> None:
    with pytest.raises(ConfigError, match="a trace is trained on alone"):
        replace(tiny, workloads=(WorkloadSpec("chat", 100), WorkloadSpec(str(TRACE), 100, 12)))
    replace(tiny, workloads=(WorkloadSpec(str(TRACE), 100, 12),))  # alone: fine


def test_a_family_given_twice_is_refused(tiny: TuneConfig) -> None:
    # the CLI counts a repeated name once; a library caller that repeats one has made a mistake
    with pytest.raises(ConfigError, match="--workload: chat given twice"):
        several(tiny, "chat", "reasoning", "chat")


def test_no_workload_or_unequal_request_counts_are_refused(tiny: TuneConfig) -> None:
    with pytest.raises(ConfigError, match="no workload given"):
        replace(tiny, workloads=())
    with pytest.raises(ConfigError, match="--requests"):
        replace(tiny, workloads=(WorkloadSpec("chat", 100), WorkloadSpec("reasoning", 200)))
