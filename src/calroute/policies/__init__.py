"""The policy registry: one table, one constructor. An unknown name or parameter is a ConfigError."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from calroute.costmodel.calibration import Calibration
from calroute.errors import ConfigError
from calroute.policies import (
    cache_aware,
    kv_overlap_cost,
    least_loaded,
    length_heuristic,
    marginal_cost,
    oracle,
    power_of_two,
    prefix_scorer_mix,
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
    # prefix-aware peers (docs/prefix.md)
    "prefix_scorer_mix": lambda raw, cal: prefix_scorer_mix.PrefixScorerMix(
        parse_params("prefix_scorer_mix", prefix_scorer_mix.Params, raw)
    ),
    "kv_overlap_cost": lambda raw, cal: kv_overlap_cost.KvOverlapCost(
        parse_params("kv_overlap_cost", kv_overlap_cost.Params, raw)
    ),
    "cache_aware": lambda raw, cal: cache_aware.CacheAware(
        parse_params("cache_aware", cache_aware.Params, raw)
    ),
    # the headroom bound: marginal_cost on the truth (simulator only)
    "oracle": lambda raw, cal: oracle.Oracle(parse_params("oracle", marginal_cost.Params, raw), cal),
}

# Each policy's Params dataclass: what a params file, a tuner's search space and --param are checked against.
PARAMS: dict[str, type[Any]] = {
    "round_robin": round_robin.Params,
    "least_loaded": least_loaded.Params,
    "length_heuristic": length_heuristic.Params,
    "random": random_pick.Params,
    "power_of_two": power_of_two.Params,
    "queue_kv": queue_kv.Params,
    "marginal_cost": marginal_cost.Params,
    "prefix_scorer_mix": prefix_scorer_mix.Params,
    "kv_overlap_cost": kv_overlap_cost.Params,
    "cache_aware": cache_aware.Params,
    "oracle": marginal_cost.Params,
}

# Policies that only the simulator can run (e.g. one that reads what a live router cannot know): left out
# of ``all``, and run only when named.
SIM_ONLY_POLICIES: frozenset[str] = frozenset({"oracle"})


def check_live_policy(name: str) -> None:
    """A ConfigError for a policy a live router cannot run (the proxy, `calroute serve`, `calroute run`)."""
    if name in SIM_ONLY_POLICIES:
        raise ConfigError(
            f"policy {name!r} runs on the simulator only: it routes on the true output lengths and the "
            "engines' instantaneous state, which no live router has"
        )


ALL_POLICIES = "all"


def expand_policy_list(spec: str) -> list[str]:
    """A comma-separated list of policy names, in its order, duplicates dropped; ``all`` stands for every
    registered policy but the simulator-only ones, in registry order. An unknown name is a ConfigError."""
    out: list[str] = []
    for name in (p.strip() for p in spec.split(",")):
        if not name:
            continue
        names = [p for p in POLICIES if p not in SIM_ONLY_POLICIES] if name == ALL_POLICIES else [name]
        for n in names:
            if n not in POLICIES:
                raise ConfigError(f"unknown policy {n!r}; known: {ALL_POLICIES}, {', '.join(POLICIES)}")
            if n not in out:
                out.append(n)
    if not out:
        raise ConfigError(f"no policy given; known: {ALL_POLICIES}, {', '.join(POLICIES)}")
    return out


def policy_names() -> list[str]:
    return list(POLICIES)


def params_class(name: str) -> type[Any]:
    """The policy's Params dataclass; an unknown name is a ConfigError."""
    cls = PARAMS.get(name)
    if cls is None:
        raise ConfigError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    return cls


def make_policy(name: str, params: Mapping[str, Any], calibration: Calibration) -> RoutingPolicy:
    factory = POLICIES.get(name)
    if factory is None:
        raise ConfigError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    return factory(params, calibration)


__all__ = [
    "ALL_POLICIES",
    "PARAMS",
    "POLICIES",
    "SIM_ONLY_POLICIES",
    "check_live_policy",
    "RoutingPolicy",
    "expand_policy_list",
    "make_policy",
    "params_class",
    "policy_names",
]
