"""The policies that decide a pair by themselves, the ones a decider can wrap: their table and constructor.

The registry (policies/__init__.py) adds the deciders to this table; a decider builds its inner policy from
this one. Kept apart so that the deciders need not import the registry that imports them, and so that
"deciders do not nest" holds by construction: no decider is in this table."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import calroute.policies.cache_aware as cache_aware
import calroute.policies.clairvoyant as clairvoyant
import calroute.policies.kv_overlap_cost as kv_overlap_cost
import calroute.policies.least_loaded as least_loaded
import calroute.policies.length_heuristic as length_heuristic
import calroute.policies.marginal_cost as marginal_cost
import calroute.policies.power_of_two as power_of_two
import calroute.policies.prefix_scorer_mix as prefix_scorer_mix
import calroute.policies.queue_kv as queue_kv
import calroute.policies.random_pick as random_pick
import calroute.policies.round_robin as round_robin
from calroute.costmodel.calibration import Calibration
from calroute.policies.base import RoutingPolicy, parse_params


@dataclass(frozen=True)
class Registered:
    """A policy as the registry knows it: its class (whose ``name`` is the policy's one name), its Params
    dataclass (what a params file, a tuner's search space and --param are checked against), whether it is
    built with the router's calibration (it prices in seconds), and whether a run's router seeds it (its
    "seed" parameter, unless given, comes from RouterSeeds.policy: routing/build.py)."""

    cls: type[Any]
    params: type[Any]
    priced: bool = False
    seeded: bool = False

    @property
    def name(self) -> str:
        name: str = self.cls.name
        return name

    @property
    def sim_only(self) -> bool:
        """It reads what a live router cannot know, the truth."""
        return bool(getattr(self.cls, "needs_true_state", False))

    def build(self, params: Mapping[str, Any], calibration: Calibration) -> RoutingPolicy:
        """The policy with ``params`` (raw values, checked: a bad one is a ConfigError naming it)."""
        parsed = parse_params(self.name, self.params, params)
        policy: RoutingPolicy = self.cls(parsed, calibration) if self.priced else self.cls(parsed)
        return policy


# The pair-choosing policies, in the order ``all`` runs them.
PAIR_POLICIES: tuple[Registered, ...] = (
    Registered(round_robin.RoundRobin, round_robin.Params),
    Registered(least_loaded.LeastLoaded, least_loaded.Params),
    Registered(length_heuristic.LengthHeuristic, length_heuristic.Params),
    Registered(random_pick.RandomPick, random_pick.Params, seeded=True),
    Registered(power_of_two.PowerOfTwo, power_of_two.Params, seeded=True),
    Registered(queue_kv.QueueKv, queue_kv.Params),
    Registered(marginal_cost.MarginalCost, marginal_cost.Params, priced=True),
    # prefix-aware peers (docs/prefix.md)
    Registered(prefix_scorer_mix.PrefixScorerMix, prefix_scorer_mix.Params),
    Registered(kv_overlap_cost.KvOverlapCost, kv_overlap_cost.Params),
    Registered(cache_aware.CacheAware, cache_aware.Params),
)

# marginal_cost fed the truth (simulator only): perfect inputs to its prices, not a bound
CLAIRVOYANT = Registered(clairvoyant.Clairvoyant, marginal_cost.Params, priced=True)


def inner_policy(name: str) -> Registered:
    """The policy a decider may wrap: one that chooses a pair itself and that a live router can run. Any
    other name is a ValueError saying why (the decider's Params turn it into a ConfigError naming it)."""
    by_name = {r.name: r for r in PAIR_POLICIES}
    if name == CLAIRVOYANT.name:
        raise ValueError(
            f"inner: policy {name!r} runs on the simulator only; "
            "a decider wraps a policy a live router can run"
        )
    r = by_name.get(name)
    if r is None:
        raise ValueError(
            f"inner: {name!r} is not a policy that chooses a pair itself (deciders do not nest); "
            f"known: {', '.join(by_name)}"
        )
    return r


def make_inner(name: str, params: Mapping[str, Any], calibration: Calibration) -> RoutingPolicy:
    """A decider's inner policy ``name`` with ``params`` (a ValueError or ConfigError names what is wrong)."""
    return inner_policy(name).build(params, calibration)


__all__ = ["CLAIRVOYANT", "PAIR_POLICIES", "Registered", "inner_policy", "make_inner"]
