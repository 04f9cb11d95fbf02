"""The policy registry's lists: ``all`` and the simulator-only policies."""

from __future__ import annotations

import pytest

import calroute.policies as registry
from calroute.errors import ConfigError
from calroute.policies import POLICIES, expand_policy_list

PREFIX_PEERS = ("prefix_scorer_mix", "kv_overlap_cost", "cache_aware")


def test_the_prefix_peers_are_registered() -> None:
    assert set(PREFIX_PEERS) <= set(POLICIES)


def test_all_is_every_registered_live_policy_in_registry_order() -> None:
    assert expand_policy_list("all") == [p for p in POLICIES if p != "oracle"]
    assert expand_policy_list("all,oracle")[-1] == "oracle"  # named, the simulator runs it


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
            ["kv_overlap_cost", *[p for p in POLICIES if p not in {"kv_overlap_cost", "oracle"}]],
        ),
    ],
)
def test_lists_keep_their_order_without_duplicates(spec: str, want: list[str]) -> None:
    assert expand_policy_list(spec) == want


@pytest.mark.parametrize(("spec", "message"), [("round_robin,bogus", "bogus"), (" , ", "no policy given")])
def test_bad_lists(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        expand_policy_list(spec)
