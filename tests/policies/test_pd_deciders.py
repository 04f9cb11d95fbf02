"""The conditional-disaggregation deciders (pd_llmd, pd_dynamo, pd_vllm_router, aggregated): where each keeps
the prefill on its inner policy's decode engine, at and around its thresholds; what it forwards, refuses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from calroute.cli.common import parse_param_options
from calroute.costmodel.calibration import Calibration
from calroute.errors import ConfigError, NoCandidateError
from calroute.policies import make_policy, pd_dynamo, pd_llmd, pd_vllm_router
from calroute.policies.cache_aware import CacheAware
from calroute.policies.decider import Decider, parse_inner_params
from calroute.policies.params_file import load_params_file
from calroute.policies.prefix_scorer_mix import PrefixScorerMix
from calroute.types import ClusterView, RouteDecision
from tests.conftest import make_admission, make_view

DECIDERS = ("pd_llmd", "pd_dynamo", "pd_vllm_router", "aggregated")
DEFAULT_INNER = {
    "pd_llmd": "prefix_scorer_mix",
    "pd_dynamo": "kv_overlap_cost",
    "pd_vllm_router": "cache_aware",
    "aggregated": "cache_aware",
}


def decider(name: str, params: dict[str, Any], calibration: Calibration) -> Decider:
    policy = make_policy(name, params, calibration)
    assert isinstance(policy, Decider)
    return policy


def cached_view(cached: int, prefill: list[dict[str, Any]] | int = 2, decode: int = 3) -> ClusterView:
    """Every decode engine is expected to hold ``cached`` of the prompt's tokens: whichever the inner policy
    picks, the uncached part is the same."""
    return make_view(prefill=prefill, decode=[{"cached_tokens": cached}] * decode)


def check_kept(d: RouteDecision, inner: RouteDecision, local: bool, reason: str) -> None:
    """``d`` is ``inner`` kept local on its decode engine, or ``inner`` itself, with ``reason``."""
    assert d.decode_id == inner.decode_id and d.local is local and d.reason == reason
    if local:
        assert d.prefill_id == d.decode_id and d.prefill_scores == ()
        assert d.decode_scores == inner.decode_scores
    else:
        assert d == inner.replace(reason=reason)


LLMD = [
    # (params, prompt, cached on the decode engine, local, reason)
    ({}, 512, 497, True, "uncached_below_threshold"),  # 15 uncached, under 16
    ({}, 512, 496, False, "uncached_above_threshold"),  # 16 uncached: at the threshold llm-d disaggregates
    ({}, 512, 0, False, "uncached_above_threshold"),
    ({}, 512, 600, True, "uncached_below_threshold"),  # more expected than the prompt: nothing to compute
    ({}, 10, 0, True, "uncached_below_threshold"),  # a prompt shorter than the threshold
    # the match window: a prompt past 4,096 tokens never counts as more cached than 4,096
    ({}, 8000, 8000, False, "uncached_above_threshold"),
    ({"window_tokens": "0"}, 8000, 8000, True, "uncached_below_threshold"),
    ({"window_tokens": "8192"}, 8000, 7990, True, "uncached_below_threshold"),
    ({"non_cached_tokens": "512"}, 1000, 489, True, "uncached_below_threshold"),  # 511
    ({"non_cached_tokens": "512"}, 1000, 488, False, "uncached_above_threshold"),  # 512
    ({"non_cached_tokens": "0"}, 8000, 0, True, "pd_disabled"),  # llm-d's plugin default: never disaggregate
]


@pytest.mark.parametrize(("params", "prompt", "cached", "local", "reason"), LLMD)
def test_pd_llmd(
    params: dict[str, Any], prompt: int, cached: int, local: bool, reason: str, calibration: Calibration
) -> None:
    policy = decider("pd_llmd", params, calibration)
    adm, view = make_admission(prompt_tokens=prompt), cached_view(cached)
    check_kept(policy.route(adm, view), policy.inner.route(adm, view), local, reason)


VLLM_ROUTER = [
    ({}, 1000, 744, True, "uncached_below_threshold"),  # 256 uncached: at the threshold it stays local
    ({}, 1000, 743, False, "uncached_above_threshold"),  # 257
    ({}, 200, 0, True, "uncached_below_threshold"),  # a short prompt stays local uncached
    ({}, 1000, 0, False, "uncached_above_threshold"),
    ({"uncached_token_threshold": "0"}, 1000, 1000, True, "uncached_below_threshold"),
    ({"uncached_token_threshold": "0"}, 1000, 999, False, "uncached_above_threshold"),
]


@pytest.mark.parametrize(("params", "prompt", "cached", "local", "reason"), VLLM_ROUTER)
def test_pd_vllm_router(
    params: dict[str, Any], prompt: int, cached: int, local: bool, reason: str, calibration: Calibration
) -> None:
    policy = decider("pd_vllm_router", params, calibration)
    adm, view = make_admission(prompt_tokens=prompt), cached_view(cached)
    check_kept(policy.route(adm, view), policy.inner.route(adm, view), local, reason)


BUSY = 32_768  # Dynamo's busy line here: 4.0 x 8,192 pending prefill tokens on the chosen prefill engine
LOAD_1X_2048 = {"mode": "prefill_load", "prefill_busy_threshold": "1", "max_num_batched_tokens": "2048"}

DYNAMO = [
    # (params, prompt, cached on the decode engines, pending on every prefill engine, local, reason)
    ({}, 1000, 896, 0, True, "isl_bounding"),  # 104 uncached, a ratio of 0.104 (Dynamo's own test case)
    ({}, 200, 0, 0, False, "remote_prefill"),  # short, but all of it uncached: ratio 1.0
    ({}, 10_000, 7952, 0, False, "remote_prefill"),  # 2,048 uncached: not under 2,048
    ({}, 10_000, 7953, 0, True, "isl_bounding"),  # 2,047, ratio 0.2047
    ({}, 1000, 300, 0, False, "remote_prefill"),  # ratio 0.7: not under 0.7
    ({}, 1000, 301, 0, True, "isl_bounding"),  # 0.699
    ({}, 100_000, 0, BUSY + 1, False, "remote_prefill"),  # isl_bounding reads no load
    ({"eff_isl_threshold": "4096", "eff_isl_ratio_threshold": "0.6"}, 10_000, 7000, 0, True, "isl_bounding"),
    ({"mode": "prefill_load"}, 1000, 896, 0, False, "remote_prefill"),  # prefill_load reads no ISL
    ({"mode": "prefill_load"}, 100_000, 0, BUSY, False, "remote_prefill"),  # at the line: not over it
    ({"mode": "prefill_load"}, 100_000, 0, BUSY + 1, True, "prefill_load"),
    # 0: unset, as Dynamo's default; the line is in units of the engines' prefill budget per iteration
    ({"mode": "prefill_load", "prefill_busy_threshold": "0"}, 1000, 0, 10**9, False, "remote_prefill"),
    (LOAD_1X_2048, 1000, 0, 2048, False, "remote_prefill"),
    (LOAD_1X_2048, 1000, 0, 2049, True, "prefill_load"),
    ({"mode": "isl_or_load"}, 1000, 896, 0, True, "isl_bounding"),
    ({"mode": "isl_or_load"}, 1000, 896, BUSY + 1, True, "isl_bounding"),  # the ISL condition is asked first
    ({"mode": "isl_or_load"}, 100_000, 0, BUSY + 1, True, "prefill_load"),
    ({"mode": "isl_or_load"}, 100_000, 0, BUSY, False, "remote_prefill"),
]


@pytest.mark.parametrize(("params", "prompt", "cached", "pending", "local", "reason"), DYNAMO)
def test_pd_dynamo(
    params: dict[str, Any],
    prompt: int,
    cached: int,
    pending: int,
    local: bool,
    reason: str,
    calibration: Calibration,
) -> None:
    policy = decider("pd_dynamo", params, calibration)
    adm = make_admission(prompt_tokens=prompt)
    view = cached_view(cached, prefill=[{"pending_prefill_tokens": pending}] * 2)
    check_kept(policy.route(adm, view), policy.inner.route(adm, view), local, reason)


@pytest.mark.parametrize(
    ("active", "local", "reason"),
    [(29_000, True, "isl_bounding"), (29_001, False, "decode_busy")],  # 0.5 x 60,000 with the prompt's 1,000
)
def test_pd_dynamo_decode_gate_overrules_a_local_verdict(
    active: int, local: bool, reason: str, calibration: Calibration
) -> None:
    policy = decider("pd_dynamo", {"decode_busy_threshold": "0.5"}, calibration)
    adm = make_admission(prompt_tokens=1000)
    view = make_view(decode=[{"cached_tokens": 896, "active_tokens": active}] * 3)
    check_kept(policy.route(adm, view), policy.inner.route(adm, view), local, reason)
    # the gate only overrules a local verdict: a long uncached prompt goes remote for its own reason
    long = make_admission(prompt_tokens=100_000)
    assert policy.route(long, view).reason == "remote_prefill"


def test_pd_dynamo_asks_the_prefill_engine_its_inner_policy_picked(calibration: Calibration) -> None:
    # kv_overlap_cost picks the idle prefill engine: not busy, whatever the other one holds
    policy = decider("pd_dynamo", {"mode": "prefill_load"}, calibration)
    view = make_view(prefill=[{"pending_prefill_tokens": 10**6}, {}])
    d = policy.route(make_admission(prompt_tokens=100_000), view)
    assert not d.local and d.prefill_id == "prefill-1" and d.reason == "remote_prefill"


HOT_AND_BUSY = {"cached_tokens": 1000, "active_tokens": 5000}


@pytest.mark.parametrize(
    ("name", "decode", "prompt", "want_decode", "local"),
    [
        # the inner policy's decode pick is kept, and its cache decides, not the pool's best
        ("pd_llmd", [{}, {"cached_tokens": 1000}, {}], 1000, "decode-1", True),
        ("pd_vllm_router", [{}, {"cached_tokens": 900}, {}], 1000, "decode-1", True),
        # kv_overlap_cost's decode router ignores the cache: the engine with the fewest active blocks, cold
        (
            "pd_dynamo",
            [HOT_AND_BUSY, {}, HOT_AND_BUSY],
            1000,
            "decode-1",
            False,
        ),
        ("aggregated", [{"in_flight": 3}, {"in_flight": 1}, {"in_flight": 2}], 1000, "decode-1", True),
    ],
)
def test_the_inner_policys_decode_engine_is_kept(
    name: str,
    decode: list[dict[str, Any]],
    prompt: int,
    want_decode: str,
    local: bool,
    calibration: Calibration,
) -> None:
    policy = decider(name, {}, calibration)
    adm, view = make_admission(prompt_tokens=prompt), make_view(decode=decode)
    inner = policy.inner.route(adm, view)
    d = policy.route(adm, view)
    assert inner.decode_id == d.decode_id == want_decode and d.local is local


@pytest.mark.parametrize("name", DECIDERS)
@pytest.mark.parametrize("cached", [0, 100, 400, 512])
@pytest.mark.parametrize("seq", [0, 1, 5])
def test_a_decision_is_the_inner_pair_or_its_decode_engine_alone(
    name: str, cached: int, seq: int, calibration: Calibration
) -> None:
    policy = decider(name, {}, calibration)
    view = make_view(
        prefill=[{"in_flight": 2, "pending_prefill_tokens": 700}, {"waiting": 3}],
        decode=[
            {"in_flight": i, "cached_tokens": cached * (i % 2), "active_tokens": 99 * i} for i in range(4)
        ],
        seq=seq,
    )
    adm = make_admission()
    inner, d = policy.inner.route(adm, view), policy.route(adm, view)
    assert d.reason
    check_kept(d, inner, d.local, d.reason)


@pytest.mark.parametrize("cached", [0, 512])
def test_aggregated_keeps_every_request_local(cached: int, calibration: Calibration) -> None:
    policy = decider("aggregated", {}, calibration)
    for prompt in (1, 512, 100_000):
        adm, view = make_admission(prompt_tokens=prompt), cached_view(cached)
        check_kept(policy.route(adm, view), policy.inner.route(adm, view), True, "aggregated")


@pytest.mark.parametrize("inner", ["cache_aware", "prefix_scorer_mix", "marginal_cost", "round_robin"])
def test_aggregated_needs_no_prefill_engine(inner: str, calibration: Calibration) -> None:
    # an aggregated cluster (no prefill engine, or none healthy): the decode pick is the one the inner policy
    # makes when the decode engines stand in for the prefill pool too
    policy = decider("aggregated", {"inner": inner}, calibration)
    decode = [{"in_flight": 3, "cached_tokens": 512}, {"in_flight": 1}, {"in_flight": 2, "cached_tokens": 9}]
    unhealthy: list[dict[str, Any]] = [{"healthy": False}]
    for prefill in (0, unhealthy):
        view = make_view(prefill=prefill, decode=decode, seq=3)
        d = policy.route(make_admission(), view)
        inner_d = policy.inner.route(make_admission(), view.replace(prefill=view.decode))
        check_kept(d, inner_d, True, "aggregated")
    with pytest.raises(NoCandidateError, match="decode"):
        policy.route(make_admission(), make_view(prefill=0, decode=[{"healthy": False}]))


@pytest.mark.parametrize("name", ["pd_llmd", "pd_dynamo", "pd_vllm_router"])
def test_a_decider_that_may_disaggregate_needs_a_prefill_engine(name: str, calibration: Calibration) -> None:
    # even for a request it would keep local: it fails on a cluster without prefill engines from the start
    policy = decider(name, {}, calibration)
    with pytest.raises(NoCandidateError, match="prefill"):
        policy.route(make_admission(), cached_view(512, prefill=0))


def test_an_inner_local_decision_is_returned_as_it_is(calibration: Calibration) -> None:
    # marginal_cost with local_prefill goes local itself when both prefill engines are deep in backlog
    params = {"inner": "marginal_cost", "inner_params": "local_prefill=true"}
    policy = decider("pd_dynamo", params, calibration)
    view = make_view(prefill=[{"backlog_s": 30.0, "pending_prefill_tokens": 100_000, "in_flight": 20}] * 2)
    inner = policy.inner.route(make_admission(), view)
    assert inner.local and inner.reason == "cheaper_local"
    assert policy.route(make_admission(), view) == inner


@pytest.mark.parametrize("name", DECIDERS)
def test_the_inner_policy_and_what_the_router_reads_off_it(name: str, calibration: Calibration) -> None:
    policy = decider(name, {}, calibration)
    inner = policy.inner
    assert inner.name == policy.params.inner == DEFAULT_INNER[name]
    assert policy.reads_engine_samples == inner.reads_engine_samples
    assert policy.reads_active_blocks == getattr(inner, "reads_active_blocks", False)
    assert policy.prefix_source == getattr(inner, "prefix_source", None)


@pytest.mark.parametrize(
    ("name", "params", "samples", "active_blocks", "prefix_source"),
    [
        ("pd_llmd", {}, True, False, "approximate"),
        ("pd_llmd", {"inner_params": "source=precise"}, True, False, None),
        ("pd_dynamo", {}, False, False, None),
        ("pd_dynamo", {"inner_params": "assume_kv_reuse=true"}, False, True, None),
        ("aggregated", {"inner": "marginal_cost"}, True, True, None),
        ("pd_vllm_router", {"inner": "round_robin"}, False, False, None),
    ],
)
def test_forwarded_attributes_follow_the_inner_policy(
    name: str,
    params: dict[str, Any],
    samples: bool,
    active_blocks: bool,
    prefix_source: str | None,
    calibration: Calibration,
) -> None:
    policy = decider(name, params, calibration)
    assert (policy.reads_engine_samples, policy.reads_active_blocks, policy.prefix_source) == (
        samples,
        active_blocks,
        prefix_source,
    )


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("pd_llmd", {"non_cached_tokens": "-1"}, "non_cached_tokens must be >= 0"),
        ("pd_llmd", {"non_cached_tokens": "1.5"}, "parameter 'non_cached_tokens'"),
        ("pd_llmd", {"window_tokens": -1}, "window_tokens must be >= 0"),
        ("pd_vllm_router", {"uncached_token_threshold": "-1"}, "uncached_token_threshold must be >= 0"),
        ("pd_dynamo", {"mode": "both"}, "mode must be one of isl_bounding, prefill_load, isl_or_load"),
        ("pd_dynamo", {"eff_isl_threshold": "-1"}, "eff_isl_threshold must be >= 0"),
        ("pd_dynamo", {"eff_isl_ratio_threshold": "1.5"}, r"eff_isl_ratio_threshold must be in \[0, 1\]"),
        ("pd_dynamo", {"prefill_busy_threshold": "-0.5"}, "prefill_busy_threshold must be finite and >= 0"),
        ("pd_dynamo", {"prefill_busy_threshold": "inf"}, "prefill_busy_threshold must be finite"),
        ("pd_dynamo", {"decode_busy_threshold": "-1"}, "decode_busy_threshold must be finite and >= 0"),
        ("pd_dynamo", {"max_num_batched_tokens": "0"}, "max_num_batched_tokens must be >= 1"),
        ("aggregated", {"inner": "nope"}, "inner: 'nope' is not a policy that chooses a pair itself"),
        ("aggregated", {"inner": "clairvoyant"}, "inner: policy 'clairvoyant' runs on the simulator only"),
        ("pd_llmd", {"inner": "pd_dynamo"}, r"inner: 'pd_dynamo' is not .*deciders do not nest"),
        ("pd_vllm_router", {"inner_params": "cache_threshold"}, "inner_params: expected NAME=VALUE"),
        ("pd_vllm_router", {"inner_params": "cache_threshold=2"}, "inner_params: .*cache_threshold must be"),
        ("pd_dynamo", {"inner_params": "temperature=0,temperature=1"}, "inner_params: 'temperature' given"),
        ("pd_llmd", {"inner_params": "bogus=1"}, "inner_params: policy 'prefix_scorer_mix': unknown"),
        ("pd_llmd", {"inner": "round_robin", "inner_params": "w_prefix=1"}, "policy 'round_robin': unknown"),
    ],
)
def test_bad_parameters_are_config_errors_naming_the_field(
    name: str, params: dict[str, Any], message: str, calibration: Calibration
) -> None:
    with pytest.raises(ConfigError, match=rf"^policy '{name}': .*{message}"):
        make_policy(name, params, calibration)


def test_the_cli_params_build_each_decider(calibration: Calibration) -> None:
    # as `--param` gives them: POLICY.NAME=VALUE, the value everything after the first "="
    items = [
        "pd_llmd.non_cached_tokens=512",
        "pd_llmd.inner_params=w_prefix=2,w_queue=1,w_kv=0",
        "pd_dynamo.mode=isl_or_load",
        "pd_dynamo.eff_isl_threshold=4096",
        "pd_dynamo.eff_isl_ratio_threshold=0.6",
        "pd_vllm_router.uncached_token_threshold=128",
        "pd_vllm_router.inner_params=cache_threshold=0,balance_abs_threshold=100000",
        "aggregated.inner=least_loaded",
    ]
    by_policy = parse_param_options(items, list(DECIDERS))
    built = {name: decider(name, by_policy[name], calibration) for name in DECIDERS}
    llmd, mix = built["pd_llmd"].params, built["pd_llmd"].inner
    assert isinstance(llmd, pd_llmd.Params) and isinstance(mix, PrefixScorerMix)
    assert llmd.non_cached_tokens == 512
    assert (mix.params.w_prefix, mix.params.w_queue, mix.params.w_kv) == (2.0, 1.0, 0.0)
    dynamo = built["pd_dynamo"].params
    assert isinstance(dynamo, pd_dynamo.Params)
    assert (dynamo.mode, dynamo.eff_isl_threshold, dynamo.eff_isl_ratio_threshold) == (
        "isl_or_load",
        4096,
        0.6,
    )
    vllm, aware = built["pd_vllm_router"].params, built["pd_vllm_router"].inner
    assert isinstance(vllm, pd_vllm_router.Params) and isinstance(aware, CacheAware)
    assert vllm.uncached_token_threshold == 128
    assert aware.params.cache_threshold == 0.0 and aware.params.balance_abs_threshold == 100_000
    assert built["aggregated"].inner.name == "least_loaded"


def test_a_params_file_checks_the_inner_parameters(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    params: dict[str, Any] = {"inner_params": "w_prefix=2", "window_tokens": 0}
    path.write_text(json.dumps({"policy": "pd_llmd", "params": params}))
    assert load_params_file(path).params == params
    path.write_text(json.dumps({"policy": "pd_llmd", "params": {"inner_params": "w_prefix=-1"}}))
    with pytest.raises(ConfigError, match=r"--params .*'pd_llmd': inner_params: .*w_prefix must be >= 0"):
        load_params_file(path)


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ("", {}),
        ("a=1", {"a": "1"}),
        (" a = 1 , b=x=y ,", {"a": "1", "b": "x=y"}),
    ],
)
def test_parse_inner_params(spec: str, want: dict[str, str]) -> None:
    assert parse_inner_params(spec) == want
