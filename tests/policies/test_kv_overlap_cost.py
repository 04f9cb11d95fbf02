"""kv_overlap_cost (Dynamo's KV router): costs, argmin, temperature sampling, table-driven."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest

from calroute.costmodel.calibration import Calibration
from calroute.errors import ConfigError
from calroute.policies import make_policy
from calroute.policies.kv_overlap_cost import KvOverlapCost, softmax_pick
from tests.conftest import make_admission, make_view

PROMPT = 2048


@pytest.mark.parametrize(
    ("prefill", "weight", "want"),
    [
        # (kv_committed_tokens, cached_tokens): w * (committed + prompt - cached) + committed + prompt
        ([(0, 0), (0, 1024)], 1.0, (4096.0, 3072.0)),
        ([(1000, 2048), (0, 0)], 1.0, (4048.0, 4096.0)),
        # a hit the index reports past the prompt saves no more than the prompt
        ([(0, 4096)], 1.0, (2048.0,)),
        # weight 2 doubles the prefill term; weight 0 is load balancing on blocks alone
        ([(0, 0), (0, 1024)], 2.0, (6144.0, 4096.0)),
        ([(500, 0), (0, 1024)], 0.0, (2548.0, 2048.0)),
    ],
)
def test_prefill_costs(
    prefill: list[tuple[int, int]], weight: float, want: tuple[float, ...], calibration: Calibration
) -> None:
    policy = make_policy("kv_overlap_cost", {"overlap_score_weight": weight}, calibration)
    view = make_view(prefill=[{"kv_committed_tokens": k, "cached_tokens": c} for k, c in prefill], decode=1)
    assert policy.route(make_admission(prompt_tokens=PROMPT), view).prefill_scores == pytest.approx(want)


@pytest.mark.parametrize(
    ("pool", "params", "seq", "want"),
    [
        # balanced: the prefix hit wins
        ([{"cached_tokens": 1024}, {}], {}, 0, 0),
        ([{}, {"cached_tokens": 512}, {"cached_tokens": 1536}], {}, 0, 2),
        # imbalanced: 1024 cached tokens do not pay for 2000 committed ones (7072 against 4096)
        ([{"cached_tokens": 1024, "kv_committed_tokens": 2000}, {}], {}, 0, 1),
        # exactly at the boundary, (512 + 1024) + 512 against 2048 + 0 (both 4096 - 2048): the tie rotates
        ([{"cached_tokens": 1024, "kv_committed_tokens": 512}, {}], {}, 0, 0),
        ([{"cached_tokens": 1024, "kv_committed_tokens": 512}, {}], {}, 1, 1),
        # ... and a heavier overlap weight breaks it towards the hit, a zero weight towards the idle engine
        ([{"cached_tokens": 1024, "kv_committed_tokens": 512}, {}], {"overlap_score_weight": 1.5}, 1, 0),
        ([{"cached_tokens": 1024, "kv_committed_tokens": 512}, {}], {"overlap_score_weight": 0}, 0, 1),
        # no hits anywhere: the fewest committed tokens
        (
            [{"kv_committed_tokens": 900}, {"kv_committed_tokens": 300}, {"kv_committed_tokens": 600}],
            {},
            0,
            1,
        ),
        # an idle cluster spreads
        ([{}, {}, {}], {}, 5, 2),
        # an unhealthy instance is skipped, however cheap
        (
            [
                {"cached_tokens": 2048, "healthy": False},
                {"kv_committed_tokens": 10},
                {"kv_committed_tokens": 20},
            ],
            {},
            0,
            1,
        ),
    ],
)
def test_prefill_picks_the_lowest_cost(
    pool: list[dict[str, Any]], params: dict[str, Any], seq: int, want: int, calibration: Calibration
) -> None:
    policy = make_policy("kv_overlap_cost", params, calibration)
    d = policy.route(make_admission(prompt_tokens=PROMPT), make_view(prefill=pool, decode=2, seq=seq))
    assert d.prefill_id == f"prefill-{want}"


@pytest.mark.parametrize(
    ("pool", "seq", "want"),
    [
        # Dynamo's decode router gives no overlap credit: a hit does not outweigh committed blocks
        ([{"cached_tokens": 2048, "kv_committed_tokens": 500}, {"kv_committed_tokens": 400}], 0, 1),
        ([{"cached_tokens": 2048}, {}], 0, 0),
        ([{"cached_tokens": 2048}, {}], 1, 1),
        ([{"healthy": False}, {"kv_committed_tokens": 5}, {"kv_committed_tokens": 4}], 0, 2),
    ],
)
def test_decode_is_least_committed_blocks(
    pool: list[dict[str, Any]], seq: int, want: int, calibration: Calibration
) -> None:
    policy = make_policy("kv_overlap_cost", {}, calibration)
    d = policy.route(make_admission(prompt_tokens=PROMPT), make_view(prefill=1, decode=pool, seq=seq))
    assert d.decode_id == f"decode-{want}"


def test_reads_only_the_ledger() -> None:
    assert not KvOverlapCost.reads_engine_samples


@pytest.mark.parametrize(
    ("costs", "temperature", "u", "want"),
    [
        # equal costs: uniform
        ((5.0, 5.0, 5.0, 5.0), 1.0, 0.0, 0),
        ((5.0, 5.0, 5.0, 5.0), 1.0, 0.49, 1),
        ((5.0, 5.0, 5.0, 5.0), 1.0, 0.99, 3),
        # costs 0 and 1 at T = 1: p = 1 / (1 + e^-1) = 0.731 for the cheaper
        ((0.0, 1.0), 1.0, 0.72, 0),
        ((0.0, 1.0), 1.0, 0.74, 1),
        # the normalisation makes the scale of the costs irrelevant
        ((0.0, 1000.0), 1.0, 0.72, 0),
        ((0.0, 1000.0), 1.0, 0.74, 1),
        # a low temperature is nearly the argmin
        ((3.0, 1.0, 2.0), 0.01, 0.999, 1),
    ],
)
def test_softmax_pick(costs: tuple[float, ...], temperature: float, u: float, want: int) -> None:
    assert softmax_pick(costs, temperature, u) == want


def test_softmax_probabilities_match_dynamo_formula() -> None:
    costs = (10.0, 14.0, 30.0)
    t = 0.5
    weights = [math.exp(-(c - 10.0) / (20.0 * t)) for c in costs]
    p0 = weights[0] / sum(weights)
    assert softmax_pick(costs, t, p0 * 0.999) == 0
    assert softmax_pick(costs, t, p0 * 1.001) == 1


def _decisions(calibration: Calibration, seed: int, temperature: float = 1.0) -> list[str]:
    policy = make_policy("kv_overlap_cost", {"temperature": temperature, "seed": seed}, calibration)
    pool = [{"kv_committed_tokens": 0}, {"kv_committed_tokens": 1000}, {"kv_committed_tokens": 2000}]
    adm = make_admission(prompt_tokens=PROMPT)
    return [policy.route(adm, make_view(prefill=pool, decode=pool, seq=s)).prefill_id for s in range(300)]


def test_temperature_sampling_is_deterministic_per_seq_and_seed(calibration: Calibration) -> None:
    first = _decisions(calibration, seed=7)
    assert _decisions(calibration, seed=7) == first  # same seq and seed: same pick, every time
    assert _decisions(calibration, seed=8) != first  # another seed: another stream
    counts = Counter(first)
    # the cheapest is likeliest, but every member is drawn
    assert counts["prefill-0"] > counts["prefill-1"] > counts["prefill-2"] > 0


def test_the_two_pools_draw_independently(calibration: Calibration) -> None:
    policy = make_policy("kv_overlap_cost", {"temperature": 100.0}, calibration)
    adm = make_admission(prompt_tokens=PROMPT)
    pairs = [
        policy.route(adm, make_view(prefill=3, decode=3, seq=s)) for s in range(200)
    ]  # equal costs: uniform in each pool
    same = sum(d.prefill_id[-1] == d.decode_id[-1] for d in pairs)
    assert 30 < same < 110  # about a third, not always


def test_temperature_zero_is_the_argmin(calibration: Calibration) -> None:
    assert set(_decisions(calibration, seed=3, temperature=0.0)) == {"prefill-0"}


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"overlap_score_weight": -1}, "overlap_score_weight must be finite and >= 0"),
        ({"temperature": "-0.1"}, "temperature must be finite and >= 0"),
        ({"temperature": "nan"}, "temperature must be finite"),
        ({"temperature": "inf"}, "temperature must be finite"),
        ({"seed": "1.5"}, "seed"),
    ],
)
def test_bad_parameters(params: dict[str, Any], message: str, calibration: Calibration) -> None:
    with pytest.raises(ConfigError, match=message):
        make_policy("kv_overlap_cost", params, calibration)
