"""Params files: one policy's parameters in JSON, as `calroute tune` writes them and `--params FILE` reads
them (docs/tuning.md).

    {"format": "calroute-params/1", "policy": "marginal_cost", "params": {"w_b": 1.3, ...}, ...}

Only ``policy`` and ``params`` are read; the rest (how the parameters were trained and validated) is for
people. Every value is checked as the policy checks a ``--param``: an unknown name, a value of the wrong
type or outside what the policy accepts is a ConfigError naming the file and the parameter.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calroute.errors import ConfigError
from calroute.policies import params_class
from calroute.policies.base import parse_params

FORMAT = "calroute-params/1"


@dataclass(frozen=True)
class ParamsFile:
    path: Path
    policy: str
    params: dict[str, Any]  # JSON values, every one checked against the policy's Params


def params_dict(params: Any) -> dict[str, Any]:
    """A Params instance as the JSON object a params file holds."""
    return dataclasses.asdict(params)


def _no_constant(name: str) -> float:
    # json.loads accepts NaN and Infinity, which no parameter may be
    raise ValueError(f"{name} is not a number a parameter may take")


def load_params_file(path: Path) -> ParamsFile:
    where = f"--params {path}"
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{where}: cannot read it: {e.strerror or e}") from e
    try:
        doc = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where}: not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})") from e
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from e
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: expected a JSON object with 'policy' and 'params'")
    fmt = doc.get("format", FORMAT)
    if fmt != FORMAT:
        raise ConfigError(f"{where}: format {fmt!r} is not {FORMAT!r}")
    policy, params = doc.get("policy"), doc.get("params")
    if not isinstance(policy, str):
        raise ConfigError(f"{where}: 'policy' must be a policy name, got {policy!r}")
    if not isinstance(params, dict):
        raise ConfigError(f"{where}: 'params' must be an object of parameter values, got {params!r}")
    try:
        cls = params_class(policy)
        for key, value in params.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"policy {policy!r}: parameter {key!r}: not a finite number: {value}")
            if isinstance(value, (dict, list)) or value is None:
                raise ConfigError(f"policy {policy!r}: parameter {key!r}: not a scalar: {value!r}")
        parse_params(policy, cls, params)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from e
    return ParamsFile(path, policy, params)


def check_runs_policy(pf: ParamsFile, policies: Sequence[str]) -> None:
    """A ConfigError unless the file's policy is one of those the command runs."""
    if pf.policy not in policies:
        raise ConfigError(
            f"--params {pf.path}: the file is for policy {pf.policy!r}, which this command does not run "
            f"({', '.join(policies)})"
        )


def merged_params(
    pf: ParamsFile | None, overrides: Mapping[str, Mapping[str, Any]]
) -> dict[str, dict[str, Any]]:
    """The parameters by policy: the file's for its policy, then each ``--param`` over them (the command line
    wins: a file is a base that one flag can adjust), each policy's result checked as a whole."""
    out: dict[str, dict[str, Any]] = {}
    if pf is not None:
        out[pf.policy] = dict(pf.params)
    for policy, values in overrides.items():
        out.setdefault(policy, {}).update(values)
    for policy, values in out.items():
        parse_params(policy, params_class(policy), values)
    return out
