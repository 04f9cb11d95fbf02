"""cache_aware (vllm-router's / SGLang's): imbalance test, cache threshold, fallbacks, table-driven."""

from __future__ import annotations

from typing import Any

import pytest

from calroute.costmodel.calibration import Calibration
from calroute.errors import ConfigError
from calroute.policies import make_policy
from calroute.policies.cache_aware import CacheAware, Params, imbalanced
from calroute.types import Role
from tests.conftest import make_admission, make_state, make_view


@pytest.mark.parametrize(
    ("loads", "params", "want"),
    [
        # defaults: abs 64, rel 1.5; both must be exceeded, strictly
        ((0, 64), {}, False),
        ((0, 65), {}, True),
        ((100, 165), {}, True),
        ((130, 195), {}, False),  # 195 is not above 1.5 x 130
        ((131, 195), {}, False),  # nor is the gap above 64
        ((10, 10, 10), {}, False),
        # the policy doc's in-code defaults: abs 32, rel 1.1
        ((0, 33), {"balance_abs_threshold": 32, "balance_rel_threshold": 1.1}, True),
        ((400, 440), {"balance_abs_threshold": 32, "balance_rel_threshold": 1.1}, False),
        ((400, 441), {"balance_abs_threshold": 32, "balance_rel_threshold": 1.1}, True),
    ],
)
def test_imbalance(loads: tuple[int, ...], params: dict[str, Any], want: bool) -> None:
    pool = [make_state(f"d{i}", Role.DECODE, in_flight=n) for i, n in enumerate(loads)]
    assert imbalanced(pool, Params(**params)) is want


@pytest.mark.parametrize(
    ("pool", "prompt", "seq", "want"),
    [
        # balanced: a match above the threshold wins over a less loaded engine
        ([{"in_flight": 5, "cached_tokens": 1024}, {}], 2048, 0, 0),
        # the longest match is the one taken
        ([{"cached_tokens": 1024}, {"cached_tokens": 1536}, {}], 2048, 0, 1),
        # imbalanced (70 - 0 > 64, 70 > 0): the least loaded wins, whatever it holds
        ([{"in_flight": 70, "cached_tokens": 2048}, {"in_flight": 0}], 2048, 0, 1),
        # just balanced (64 - 0 is not > 64): affinity again
        ([{"in_flight": 64, "cached_tokens": 2048}, {"in_flight": 0}], 2048, 0, 0),
        # the match rate exactly at the threshold (300 / 1000 = 0.3) is not above it: the least loaded
        ([{"in_flight": 3, "cached_tokens": 300}, {"in_flight": 1}], 1000, 0, 1),
        ([{"in_flight": 3, "cached_tokens": 301}, {"in_flight": 1}], 1000, 0, 0),
        # no hits anywhere: the least loaded, ties rotating with seq (an idle cluster spreads)
        ([{"in_flight": 2}, {"in_flight": 1}, {"in_flight": 3}], 2048, 0, 1),
        ([{}, {}, {}], 2048, 0, 0),
        ([{}, {}, {}], 2048, 4, 1),
        # equal matches above the threshold: the tie rotates too
        ([{"cached_tokens": 1024}, {"cached_tokens": 1024}], 2048, 1, 1),
        # an unhealthy instance is skipped, and its load does not make the pool imbalanced
        ([{"cached_tokens": 2048, "healthy": False}, {"in_flight": 2}, {"in_flight": 1}], 2048, 0, 2),
        ([{"in_flight": 500, "healthy": False}, {"in_flight": 9, "cached_tokens": 2048}, {}], 2048, 0, 1),
    ],
)
def test_picks(
    pool: list[dict[str, Any]], prompt: int, seq: int, want: int, calibration: Calibration
) -> None:
    policy = make_policy("cache_aware", {}, calibration)
    adm = make_admission(prompt_tokens=prompt)
    d = policy.route(adm, make_view(prefill=2, decode=pool, seq=seq))
    p = policy.route(adm, make_view(prefill=pool, decode=2, seq=seq))
    assert (d.decode_id, p.prefill_id) == (f"decode-{want}", f"prefill-{want}")


@pytest.mark.parametrize(
    ("threshold", "want"),
    [(0.5, "decode-1"), (0.49, "decode-0")],  # a 1024 / 2048 match against the policy doc's 0.5
)
def test_cache_threshold_parameter(threshold: float, want: str, calibration: Calibration) -> None:
    policy = make_policy("cache_aware", {"cache_threshold": threshold}, calibration)
    view = make_view(prefill=1, decode=[{"in_flight": 4, "cached_tokens": 1024}, {"in_flight": 2}])
    assert policy.route(make_admission(prompt_tokens=2048), view).decode_id == want


def test_reads_only_the_ledger() -> None:
    assert not CacheAware.reads_engine_samples


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"cache_threshold": 1.5}, r"cache_threshold must be in \[0, 1\]"),
        ({"cache_threshold": -0.1}, r"cache_threshold must be in \[0, 1\]"),
        ({"balance_abs_threshold": -1}, "balance_abs_threshold must be >= 0"),
        ({"balance_abs_threshold": "2.5"}, "balance_abs_threshold"),
        ({"balance_rel_threshold": 0.9}, "balance_rel_threshold must be finite and >= 1"),
    ],
)
def test_bad_parameters(params: dict[str, Any], message: str, calibration: Calibration) -> None:
    with pytest.raises(ConfigError, match=message):
        make_policy("cache_aware", params, calibration)
