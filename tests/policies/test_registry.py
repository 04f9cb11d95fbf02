"""The policy registry: one name per policy, its lists (``all``, the simulator-only policies)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

import calroute.policies as registry
from calroute.costmodel.calibration import Calibration
from calroute.costmodel.profiles import get_profile
from calroute.errors import ConfigError
from calroute.policies import (
    PARAMS,
    POLICIES,
    SIM_ONLY_POLICIES,
    expand_policy_list,
    make_policy,
    params_class,
    registered,
)

CAL = get_profile("a40-qwen2.5-3b").calibration

PREFIX_PEERS = ("prefix_scorer_mix", "kv_overlap_cost", "cache_aware")


def test_the_prefix_peers_are_registered() -> None:
    assert set(PREFIX_PEERS) <= set(POLICIES)


def test_all_is_every_registered_live_policy_in_registry_order() -> None:
    assert expand_policy_list("all") == [p for p in POLICIES if p != "clairvoyant"]
    assert expand_policy_list("all,clairvoyant")[-1] == "clairvoyant"  # named, the simulator runs it


def test_all_leaves_out_the_simulator_only_policies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "SIM_ONLY_POLICIES", frozenset({"marginal_cost"}))
    assert expand_policy_list("all") == [p for p in POLICIES if p != "marginal_cost"]
    # named, it runs
    assert expand_policy_list("all,marginal_cost")[-1] == "marginal_cost"


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ("cache_aware, round_robin", ["cache_aware", "round_robin"]),
        ("round_robin,round_robin,,", ["round_robin"]),
        (
            "kv_overlap_cost,all",
            ["kv_overlap_cost", *[p for p in POLICIES if p not in {"kv_overlap_cost", "clairvoyant"}]],
        ),
    ],
)
def test_lists_keep_their_order_without_duplicates(spec: str, want: list[str]) -> None:
    assert expand_policy_list(spec) == want


@pytest.mark.parametrize(("spec", "message"), [("round_robin,bogus", "bogus"), (" , ", "no policy given")])
def test_bad_lists(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        expand_policy_list(spec)


@pytest.mark.parametrize("name", list(POLICIES))
def test_a_policy_is_named_once_by_its_class(name: str, calibration: Calibration) -> None:
    """The registry's key, the policy's ``name``, its Params and the name its parameters are checked under
    all agree, for every registered policy."""
    r = registered(name)
    policy = make_policy(name, {}, calibration)
    assert r.name == r.cls.name == policy.name == name and type(policy) is r.cls
    assert PARAMS[name] is params_class(name) is r.params
    assert type(policy.params) is r.params  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=f"policy '{name}': unknown parameter"):
        make_policy(name, {"no_such_parameter": 1}, calibration)
    assert not r.seeded or "seed" in {f.name for f in dataclasses.fields(r.params)}
    assert (name in SIM_ONLY_POLICIES) == getattr(r.cls, "needs_true_state", False)


@pytest.mark.parametrize("lookup", [registered, params_class, lambda n: make_policy(n, {}, CAL)])
def test_a_wrong_name_is_a_config_error_naming_the_known_ones(lookup: Callable[[str], object]) -> None:
    with pytest.raises(ConfigError, match=f"unknown policy 'roundrobin'; known: {', '.join(POLICIES)}$"):
        lookup("roundrobin")
