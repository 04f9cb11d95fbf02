"""Search-space declarations on the policies' Params: every range valid and around its default."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest

from calroute.errors import ConfigError
from calroute.policies import PARAMS, POLICIES, params_class
from calroute.policies.search_space import Range, declared_space, select, tunable, tunable_int

MARGINAL_COST_TUNABLE = [
    "w_b",
    "w_b_dec",
    "w_s",
    "w_q",
    "w_cobatch",
    "rho",
    "sigma_tight",
    "sigma_loose",
    "w_evict",
    "w_local",
    "stall_tolerance_s",
]


def test_every_policy_has_a_params_class() -> None:
    assert set(PARAMS) == set(POLICIES)
    assert params_class("clairvoyant") is params_class("marginal_cost")
    with pytest.raises(ConfigError, match="unknown policy 'bogus'"):
        params_class("bogus")


@pytest.mark.parametrize("policy", sorted(PARAMS))
def test_every_declared_range_contains_its_default_and_is_a_valid_value(policy: str) -> None:
    cls = params_class(policy)
    defaults = cls()
    for name, r in declared_space(cls).items():
        default = getattr(defaults, name)
        assert r.contains(default), f"{policy}.{name}: default {default} outside [{r.low}, {r.high}]"
        assert r.low < r.high
        if r.log:
            assert r.low > 0
        # both ends are values the policy accepts (a tuner may land on either)
        for end in (r.low, r.high):
            value = int(end) if r.integer else float(end)
            cls(**{name: value})


def test_marginal_cost_declares_its_weights_and_the_peers_theirs() -> None:
    assert list(declared_space(params_class("marginal_cost"))) == MARGINAL_COST_TUNABLE
    for peer in ("prefix_scorer_mix", "kv_overlap_cost", "cache_aware", "queue_kv", "length_heuristic"):
        assert declared_space(params_class(peer)), peer
    # switches and seeds are not searched
    assert "use_slo" not in declared_space(params_class("marginal_cost"))
    assert declared_space(params_class("round_robin")) == {}
    assert declared_space(params_class("cache_aware"))["balance_abs_threshold"].integer


@pytest.mark.parametrize(
    ("low", "high", "log", "message"),
    [(1.0, 1.0, False, "low < high"), (0.0, 1.0, True, "low > 0"), (float("nan"), 1.0, False, "finite")],
)
def test_a_bad_range_is_refused(low: float, high: float, log: bool, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Range(low, high, log)


def test_a_range_of_the_wrong_kind_is_a_programming_error() -> None:
    @dataclass(frozen=True)
    class P:
        x: float = field(default=1.0, metadata=tunable_int(0, 4))

    with pytest.raises(TypeError, match="int range"):
        declared_space(P)

    @dataclass(frozen=True)
    class Q:
        flag: bool = field(default=True, metadata=tunable(0.0, 1.0))

    with pytest.raises(TypeError):
        declared_space(Q)
    assert [f.name for f in dataclasses.fields(Q)] == ["flag"]


def test_select_names_what_is_missing() -> None:
    space = declared_space(params_class("queue_kv"))
    assert list(select(space, None, "queue_kv")) == ["w_queue", "w_kv"]
    assert list(select(space, ["w_kv"], "queue_kv")) == ["w_kv"]
    with pytest.raises(ConfigError, match="no search range for w_x; tunable: w_queue, w_kv"):
        select(space, ["w_x"], "queue_kv")
    with pytest.raises(ConfigError, match="declares no tunable parameters"):
        select({}, None, "round_robin")
