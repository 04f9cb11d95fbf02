"""The policy registry: one table, one constructor. An unknown name or parameter is a ConfigError."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from calroute.costmodel.calibration import Calibration
from calroute.errors import ConfigError
from calroute.policies import (
    least_loaded,
    length_heuristic,
    marginal_cost,
    power_of_two,
    queue_kv,
    random_pick,
    round_robin,
)
from calroute.policies.base import RoutingPolicy, parse_params

_Factory = Callable[[Mapping[str, Any], Calibration], RoutingPolicy]

POLICIES: dict[str, _Factory] = {
    "round_robin": lambda raw, cal: round_robin.RoundRobin(
        parse_params("round_robin", round_robin.Params, raw)
    ),
    "least_loaded": lambda raw, cal: least_loaded.LeastLoaded(
        parse_params("least_loaded", least_loaded.Params, raw)
    ),
    "length_heuristic": lambda raw, cal: length_heuristic.LengthHeuristic(
        parse_params("length_heuristic", length_heuristic.Params, raw)
    ),
    "random": lambda raw, cal: random_pick.RandomPick(parse_params("random", random_pick.Params, raw)),
    "power_of_two": lambda raw, cal: power_of_two.PowerOfTwo(
        parse_params("power_of_two", power_of_two.Params, raw)
    ),
    "queue_kv": lambda raw, cal: queue_kv.QueueKv(parse_params("queue_kv", queue_kv.Params, raw)),
    "marginal_cost": lambda raw, cal: marginal_cost.MarginalCost(
        parse_params("marginal_cost", marginal_cost.Params, raw), cal
    ),
}


def policy_names() -> list[str]:
    return list(POLICIES)


def make_policy(name: str, params: Mapping[str, Any], calibration: Calibration) -> RoutingPolicy:
    factory = POLICIES.get(name)
    if factory is None:
        raise ConfigError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    return factory(params, calibration)


__all__ = ["POLICIES", "RoutingPolicy", "make_policy", "policy_names"]
