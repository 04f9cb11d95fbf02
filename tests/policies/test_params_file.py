"""Params files: a round trip, and each way a file can be wrong, named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from calroute.errors import ConfigError
from calroute.policies import marginal_cost
from calroute.policies.base import parse_params
from calroute.policies.params_file import (
    FORMAT,
    check_runs_policy,
    load_params_file,
    merged_params,
    params_dict,
)


def write(tmp_path: Path, doc: Any, name: str = "p.json") -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def test_round_trip(tmp_path: Path) -> None:
    tuned = marginal_cost.Params(w_b=1.7, rho=0.25, sigma_tight=3.5, use_slo=False, fallback_output_tokens=99)
    path = write(tmp_path, {"format": FORMAT, "policy": "marginal_cost", "params": params_dict(tuned)})
    pf = load_params_file(path)
    assert pf.policy == "marginal_cost"
    assert parse_params("marginal_cost", marginal_cost.Params, pf.params) == tuned


def test_the_format_field_may_be_left_out_and_extra_sections_are_ignored(tmp_path: Path) -> None:
    doc = {"policy": "queue_kv", "params": {"w_kv": 3}, "training": {"seeds": [0, 1]}}
    assert load_params_file(write(tmp_path, doc)).params == {"w_kv": 3}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"policy": "marginal_cost", "params": {"w_bogus": 1}}, "unknown parameter.*w_bogus"),
        ({"policy": "marginal_cost", "params": {"rho": -1}}, "rho must be >= 0"),
        ({"policy": "marginal_cost", "params": {"w_b": "heavy"}}, "parameter 'w_b'"),
        ({"policy": "marginal_cost", "params": {"w_b": [1]}}, "parameter 'w_b': not a scalar"),
        ({"policy": "bogus", "params": {}}, "unknown policy 'bogus'"),
        ({"params": {}}, "'policy' must be a policy name"),
        ({"policy": "marginal_cost"}, "'params' must be an object"),
        ({"format": "other/2", "policy": "marginal_cost", "params": {}}, "format 'other/2'"),
        ([1, 2], "expected a JSON object"),
        ('{"policy": "marginal_cost", "params": {"w_b": NaN}}', "NaN is not a number"),
        ('{"policy": "marginal_cost",', "not valid JSON.*line 1"),
    ],
)
def test_a_bad_file_is_an_error_naming_the_file_and_what_is_wrong(
    tmp_path: Path, doc: Any, message: str
) -> None:
    path = write(tmp_path, doc)
    with pytest.raises(ConfigError, match=message) as e:
        load_params_file(path)
    assert str(path) in str(e.value)


def test_an_unreadable_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read it"):
        load_params_file(tmp_path / "missing.json")
    with pytest.raises(ConfigError, match="cannot read it"):
        load_params_file(tmp_path)  # a directory


def test_a_file_for_a_policy_not_run_is_an_error(tmp_path: Path) -> None:
    pf = load_params_file(write(tmp_path, {"policy": "queue_kv", "params": {}}))
    check_runs_policy(pf, ["least_loaded", "queue_kv"])
    with pytest.raises(ConfigError, match="for policy 'queue_kv', which this command does not run"):
        check_runs_policy(pf, ["least_loaded", "marginal_cost"])


def test_param_overrides_the_file_and_the_result_is_checked(tmp_path: Path) -> None:
    pf = load_params_file(write(tmp_path, {"policy": "marginal_cost", "params": {"w_b": 2.0, "rho": 3.0}}))
    merged = merged_params(pf, {"marginal_cost": {"rho": "0.5"}, "queue_kv": {"w_kv": "2"}})
    assert merged == {"marginal_cost": {"w_b": 2.0, "rho": "0.5"}, "queue_kv": {"w_kv": "2"}}
    with pytest.raises(ConfigError, match="rho must be >= 0"):
        merged_params(pf, {"marginal_cost": {"rho": "-2"}})
