"""Beside the params file: an existing --out is checked, writes are whole, the report states verdicts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calroute.errors import ConfigError
from calroute.tuning.output import check_out, markdown, write_atomic
from calroute.tuning.validation import FamilyResult


def test_an_existing_out_must_be_a_params_file_of_the_same_policy(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    check_out(path, "marginal_cost")  # absent: fine
    path.write_text(json.dumps({"policy": "marginal_cost", "params": {}}))
    check_out(path, "marginal_cost")
    with pytest.raises(ConfigError, match="parameters of policy 'marginal_cost', not 'queue_kv'"):
        check_out(path, "queue_kv")
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="not a params file"):
        check_out(path, "marginal_cost")


def test_write_atomic_replaces_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "d" / "p.json"
    write_atomic(path, "one")
    write_atomic(path, "two")
    assert path.read_text() == "two"
    assert [p.name for p in path.parent.iterdir()] == ["p.json"]


def test_the_report_calls_a_win_only_outside_noise() -> None:
    doc = {
        "policy": "marginal_cost",
        "params": {"w_b": 1.5},
        "handset": {"w_b": 1.0},
        "training": {
            "workload": "mixed-bursty",
            "prefill": 2,
            "decode": 4,
            "requests": 100,
            "seeds": [0, 1],
            "rates_rps": [9.0, 10.0],
            "rate_factors": [0.9, 1.0],
            "saturation": {"rate_rps": 10.0},
            "complete_trials": 4,
            "study_seed": 0,
            "calibration": "profile a40",
            "handset_objective": 0.8,
            "best_objective": 0.82,
            "best_trial": 3,
            "space": {"w_b": {"low": 0.0, "high": 4.0, "log": False, "integer": False}},
        },
        "validation": {"seeds": [2, 3, 4], "rate_factors": [0.9, 1.0]},
    }
    families = [
        FamilyResult("mixed-bursty", True, 10.0, (0.80, 0.70, 0.75), (0.82, 0.72, 0.77)),
        FamilyResult("chat", False, 30.0, (0.80, 0.70, 0.75), (0.83, 0.68, 0.75)),
        FamilyResult("document", False, None, (), (), "goodput is 0 at every probed rate"),
    ]
    text = markdown(doc, families)
    assert "| mixed-bursty (trained on) | 10.00 | 0.750 | 0.770 | +2.0 [+2.0, +2.0] n=3 win |" in text
    assert "chat | 30.00" in text and "within noise (n = 3)" in text
    assert "| document | - | - | - | not run: goodput is 0 at every probed rate |" in text
    assert "| w_b | 1 | 1.5 | [0, 4] |" in text


def test_the_report_names_every_family_trained_on() -> None:
    sat = {"target": 0.85, "relative": False, "probes": []}
    doc = {
        "policy": "marginal_cost",
        "params": {"w_b": 1.5},
        "handset": {"w_b": 1.0},
        "training": {
            "workloads": ["chat", "reasoning"],
            "per_workload": {
                "chat": {
                    "saturation": {"rate_rps": 30.0, **sat},
                    "rates_rps": [30.0],
                    "best_objective": 0.9,
                    "handset_objective": 0.85,
                },
                "reasoning": {
                    "saturation": {"rate_rps": 7.0, **sat},
                    "rates_rps": [7.0],
                    "best_objective": 0.7,
                    "handset_objective": 0.72,
                },
            },
            "prefill": 2,
            "decode": 4,
            "requests": 100,
            "seeds": [0, 1],
            "rate_factors": [1.0],
            "complete_trials": 4,
            "study_seed": 0,
            "calibration": "profile a40",
            "handset_objective": 0.785,
            "best_objective": 0.8,
            "best_trial": 3,
            "space": {"w_b": {"low": 0.0, "high": 4.0, "log": False, "integer": False}},
        },
        "validation": {"seeds": [2, 3], "rate_factors": [1.0]},
    }
    families = [
        FamilyResult("chat", True, 30.0, (0.80, 0.70), (0.82, 0.72)),
        FamilyResult("reasoning", True, 7.0, (0.80, 0.70), (0.79, 0.69)),
        FamilyResult("document", False, 3.0, (0.80, 0.70), (0.80, 0.70)),
    ]
    text = markdown(doc, families)
    assert "Trained on 2 workloads at once: chat, reasoning;" in text
    assert "x its own hand-set saturation rate" in text
    assert "| chat | 30.00 | 0.85 | 0.9 |" in text and "| reasoning | 7.00 | 0.72 | 0.7 |" in text
    assert "hand-set 0.785, tuned 0.8 (trial 3)" in text
    assert "| chat (trained on) | 30.00 |" in text and "| reasoning (trained on) | 7.00 |" in text
    assert "| document | 3.00 |" in text
