"""The policy registry: one table, one constructor. An unknown name or parameter is a ConfigError.

A policy's name is written once, as its class's ``name``: the registry's keys, the name its parameters are
checked under and its records' label all come from there."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from calroute.costmodel.calibration import Calibration
from calroute.errors import ConfigError
from calroute.policies import aggregated, pd_dynamo, pd_llmd, pd_vllm_router
from calroute.policies.base import RoutingPolicy
from calroute.policies.catalog import CLAIRVOYANT, PAIR_POLICIES, Registered

# In the order ``all`` runs them: the pair-choosing policies (policies/catalog.py), then conditional
# disaggregation, the peers' deciders around an inner policy, which may be priced (docs/policies.md), and
# never disaggregating; then the simulator-only one.
POLICIES: dict[str, Registered] = {
    r.name: r
    for r in (
        *PAIR_POLICIES,
        Registered(pd_llmd.PdLlmd, pd_llmd.Params, priced=True),
        Registered(pd_dynamo.PdDynamo, pd_dynamo.Params, priced=True),
        Registered(pd_vllm_router.PdVllmRouter, pd_vllm_router.Params, priced=True),
        Registered(aggregated.Aggregated, aggregated.Params, priced=True),
        CLAIRVOYANT,
    )
}

# Each policy's Params dataclass, by name.
PARAMS: dict[str, type[Any]] = {name: r.params for name, r in POLICIES.items()}

# Policies that only the simulator can run (one that reads what a live router cannot know, the truth):
# left out of ``all``, and run only when named.
SIM_ONLY_POLICIES: frozenset[str] = frozenset(name for name, r in POLICIES.items() if r.sim_only)


# Names a policy had before, with the new name and why: asking for one is an error naming the new name, not
# an unknown policy.
RENAMED: dict[str, tuple[str, str]] = {
    "oracle": ("clairvoyant", "marginal_cost fed the truth, which is no bound: policies/clairvoyant.py"),
}


def unknown_policy(name: str, known: str) -> ConfigError:
    """The error for a name that is no registered policy: a renamed one's names its new name."""
    if name in RENAMED:
        new, why = RENAMED[name]
        return ConfigError(f"policy {name!r} was renamed {new!r} ({why}); ask for {new!r}")
    return ConfigError(f"unknown policy {name!r}; known: {known}")


def registered(name: str) -> Registered:
    """The registered policy ``name``; an unknown name is a ConfigError naming the known ones (a renamed
    one, its new name)."""
    r = POLICIES.get(name)
    if r is None:
        raise unknown_policy(name, ", ".join(POLICIES))
    return r


def check_live_policy(name: str) -> None:
    """A ConfigError for a policy a live router cannot run (the proxy, `calroute serve`, `calroute run`),
    and for a renamed one (its new name)."""
    if name in RENAMED:
        raise unknown_policy(name, ", ".join(POLICIES))
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
                raise unknown_policy(n, f"{ALL_POLICIES}, {', '.join(POLICIES)}")
            if n not in out:
                out.append(n)
    if not out:
        raise ConfigError(f"no policy given; known: {ALL_POLICIES}, {', '.join(POLICIES)}")
    return out


def policy_names() -> list[str]:
    return list(POLICIES)


def params_class(name: str) -> type[Any]:
    """The policy's Params dataclass; an unknown name is a ConfigError."""
    return registered(name).params


def make_policy(name: str, params: Mapping[str, Any], calibration: Calibration) -> RoutingPolicy:
    """Policy ``name`` with ``params`` (raw values, checked: a bad one is a ConfigError naming it)."""
    return registered(name).build(params, calibration)


__all__ = [
    "ALL_POLICIES",
    "PARAMS",
    "POLICIES",
    "RENAMED",
    "SIM_ONLY_POLICIES",
    "Registered",
    "check_live_policy",
    "RoutingPolicy",
    "expand_policy_list",
    "make_policy",
    "params_class",
    "policy_names",
    "registered",
    "unknown_policy",
]
