"""Contract tests run over every registered policy."""

from __future__ import annotations

import pytest

from calroute.costmodel.calibration import Calibration
from calroute.errors import ConfigError, NoCandidateError
from calroute.policies import POLICIES, make_policy
from tests.conftest import make_admission, make_view

ALL = list(POLICIES)


@pytest.mark.parametrize("name", ALL)
def test_picks_a_healthy_member_of_each_pool(name: str, calibration: Calibration) -> None:
    policy = make_policy(name, {}, calibration)
    view = make_view(
        prefill=[{"healthy": False}, {}, {"in_flight": 3}],
        decode=[{"in_flight": 2}, {"healthy": False}, {}, {"backlog_s": 1.0}],
    )
    for seq in range(50):
        d = policy.route(make_admission(), view.replace(seq=seq))
        # a local decision leaves the prompt to its decode engine, named as the engine that prefills
        assert d.prefill_id in ({d.decode_id} if d.local else {"prefill-1", "prefill-2"})
        assert d.decode_id in {"decode-0", "decode-2", "decode-3"}


@pytest.mark.parametrize("name", ALL)
def test_is_a_pure_function_of_admission_and_view(name: str, calibration: Calibration) -> None:
    a = make_policy(name, {}, calibration)
    b = make_policy(name, {}, calibration)
    view = make_view(decode=[{"in_flight": i % 3, "backlog_s": 0.1 * i} for i in range(6)], seq=17)
    adm = make_admission()
    first = a.route(adm, view)
    assert all(a.route(adm, view) == first for _ in range(5))
    assert b.route(adm, view) == first


# Policies that keep every prefill on its decode engine, which need no prefill pool (an aggregated cluster)
NO_PREFILL_POOL = {"aggregated"}


@pytest.mark.parametrize("name", ALL)
def test_empty_pool_is_an_error(name: str, calibration: Calibration) -> None:
    policy = make_policy(name, {}, calibration)
    with pytest.raises(NoCandidateError, match="decode"):
        policy.route(make_admission(), make_view(decode=[{"healthy": False}]))
    if name in NO_PREFILL_POOL:
        assert policy.route(make_admission(), make_view(prefill=0)).local
        return
    with pytest.raises(NoCandidateError, match="prefill"):
        policy.route(make_admission(), make_view(prefill=0))


@pytest.mark.parametrize("name", ALL)
def test_unknown_parameter_is_an_error_naming_policy_and_key(name: str, calibration: Calibration) -> None:
    with pytest.raises(ConfigError, match=rf"{name}.*bogus"):
        make_policy(name, {"bogus": 1}, calibration)


def test_unknown_policy_lists_the_known_ones(calibration: Calibration) -> None:
    with pytest.raises(ConfigError, match="round_robin"):
        make_policy("nope", {}, calibration)


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("marginal_cost", {"w_b": "-1"}, "w_b must be >= 0"),
        ("marginal_cost", {"rho": "abc"}, "rho"),
        ("marginal_cost", {"sigma_tight": 0}, "sigma_tight must be > 0"),
        ("length_heuristic", {"threshold_tokens": "1.5"}, "threshold_tokens"),
        ("length_heuristic", {"threshold_tokens": 0}, "threshold_tokens must be >= 1"),
        ("random", {"seed": True}, "seed"),
    ],
)
def test_bad_parameter_values(
    name: str, params: dict[str, object], message: str, calibration: Calibration
) -> None:
    with pytest.raises(ConfigError, match=message):
        make_policy(name, params, calibration)


def test_string_parameters_are_coerced(calibration: Calibration) -> None:
    policy = make_policy("marginal_cost", {"rho": "2.5", "w_q": "0"}, calibration)
    assert policy.params.rho == 2.5  # type: ignore[attr-defined]
    assert policy.params.w_q == 0.0  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ALL)
def test_a_policy_that_reads_no_engine_samples_ignores_them(name: str, calibration: Calibration) -> None:
    # The proxy scrapes engines only for a policy that declares it reads their samples; a policy that
    # says it does not must decide the same whatever the samples are (and marginal_cost must not).
    policy = make_policy(name, {}, calibration)
    loads = [{"in_flight": i % 3, "backlog_s": 0.05 * i, "kv_committed_tokens": 500 * i} for i in range(4)]

    def sampled(kv: int) -> dict[str, int | float]:
        return {"kv_used_tokens": kv, "running": kv // 1000, "waiting": kv // 5000, "metrics_age_s": kv / 1e5}

    decisions = set()
    for k in range(8):
        kvs = [(k * 7919 + j * 104729) % 60_000 for j in range(4)]
        view = make_view(
            prefill=[{**loads[j], **sampled(kvs[j])} for j in range(3)],
            decode=[{**loads[j], **sampled(kvs[(j + 1) % 4])} for j in range(4)],
            seq=5,
        )
        decisions.add(policy.route(make_admission(), view))
    assert (len(decisions) > 1) == policy.reads_engine_samples, decisions
