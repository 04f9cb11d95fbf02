"""kv_overlap_cost (Dynamo's KV router, disaggregated): costs, argmin, the decode router with and without
assumed reuse (through the ledger's active sequences), temperature sampling, table-driven."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest

from calroute.costmodel.calibration import Calibration
from calroute.costmodel.predictors import make_predictor
from calroute.errors import ConfigError
from calroute.policies import make_policy
from calroute.policies.kv_overlap_cost import KvOverlapCost, softmax_pick
from calroute.routing.ledger import Ledger
from calroute.routing.prefix_index import PrefixIndex
from calroute.routing.router import Router
from calroute.types import InstanceSpec, Role, SloClass
from tests.conftest import make_admission, make_view

PROMPT = 2048


@pytest.mark.parametrize(
    ("prefill", "weight", "want"),
    [
        # (pending_prefill_tokens, cached_tokens): w * (pending + prompt - cached), no decode term (Dynamo's
        # prefill router tracks no active blocks). The old model added committed + prompt tokens: 4096, 3072.
        ([(0, 0), (0, 1024)], 1.0, (2048.0, 1024.0)),
        ([(1000, 2048), (0, 0)], 1.0, (1000.0, 2048.0)),
        # a hit the index reports past the prompt saves no more than the prompt
        ([(0, 4096)], 1.0, (0.0,)),
        # weight 2 doubles the cost; weight 0 makes every prefill worker alike (the tie rotates)
        ([(0, 0), (0, 1024)], 2.0, (4096.0, 2048.0)),
        ([(500, 0), (0, 1024)], 0.0, (0.0, 0.0)),
    ],
)
def test_prefill_costs(
    prefill: list[tuple[int, int]], weight: float, want: tuple[float, ...], calibration: Calibration
) -> None:
    policy = make_policy("kv_overlap_cost", {"overlap_score_weight": weight}, calibration)
    # committed KV and active sequences on a prefill worker are not its cost
    pool = [
        {"pending_prefill_tokens": k, "cached_tokens": c, "kv_committed_tokens": 7000, "active_tokens": 9000}
        for k, c in prefill
    ]
    view = make_view(prefill=pool, decode=1)
    assert policy.route(make_admission(prompt_tokens=PROMPT), view).prefill_scores == pytest.approx(want)


@pytest.mark.parametrize(
    ("pool", "params", "seq", "want"),
    [
        # balanced: the prefix hit wins
        ([{"cached_tokens": 1024}, {}], {}, 0, 0),
        ([{}, {"cached_tokens": 512}, {"cached_tokens": 1536}], {}, 0, 2),
        # imbalanced: 1024 cached tokens do not pay for 2000 pending ones (3024 against 2048)
        ([{"cached_tokens": 1024, "pending_prefill_tokens": 2000}, {}], {}, 0, 1),
        # exactly at the boundary, 1024 pending + 1024 uncached against 2048: the tie rotates
        ([{"cached_tokens": 1024, "pending_prefill_tokens": 1024}, {}], {}, 0, 0),
        ([{"cached_tokens": 1024, "pending_prefill_tokens": 1024}, {}], {}, 1, 1),
        # the hit wins however much KV the worker has committed or how many sequences it holds (the old
        # model charged those: 2048 + 8000 + 2048 against 4096, the idle worker)
        ([{"cached_tokens": 2048, "kv_committed_tokens": 8000, "active_tokens": 8000}, {}], {}, 0, 0),
        # no hits anywhere: the fewest pending prefill tokens
        (
            [
                {"pending_prefill_tokens": 900},
                {"pending_prefill_tokens": 300},
                {"pending_prefill_tokens": 600},
            ],
            {},
            0,
            1,
        ),
        # a zero weight: every worker alike, the tie rotates
        ([{"cached_tokens": 1024}, {"pending_prefill_tokens": 50}], {"overlap_score_weight": 0}, 1, 1),
        # an idle cluster spreads
        ([{}, {}, {}], {}, 5, 2),
        # an unhealthy instance is skipped, however cheap
        (
            [
                {"cached_tokens": 2048, "healthy": False},
                {"pending_prefill_tokens": 10},
                {"pending_prefill_tokens": 20},
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
    ("decode", "reuse", "want"),
    [
        # (active_tokens, active_shared_tokens, active_overlap_tokens); the decode router gives no overlap
        # credit and counts no prefill tokens. Without reuse (Dynamo's disaggregated decode stage): every
        # active sequence whole plus the request, sharing or not
        ([(6144, 3072, 1536), (4096, 0, 0)], False, (8192.0, 6144.0)),
        # with reuse (Dynamo's global default): shared blocks once, and only the request's new blocks
        ([(6144, 3072, 1536), (4096, 0, 0)], True, (3584.0, 6144.0)),
        # an overlap past the prompt adds no negative blocks
        ([(4096, 2048, 4096)], True, (2048.0,)),
        # idle workers cost the request's blocks alone either way
        ([(0, 0, 0), (0, 0, 0)], True, (2048.0, 2048.0)),
    ],
)
def test_decode_costs(
    decode: list[tuple[int, int, int]], reuse: bool, want: tuple[float, ...], calibration: Calibration
) -> None:
    policy = make_policy("kv_overlap_cost", {"assume_kv_reuse": reuse}, calibration)
    pool = [
        {
            "active_tokens": a,
            "active_shared_tokens": s,
            "active_overlap_tokens": o,
            "cached_tokens": 2048,  # no overlap credit on decode
            "kv_committed_tokens": 50_000,  # predicted outputs are not blocks Dynamo counts
            "pending_prefill_tokens": 3000,
        }
        for a, s, o in decode
    ]
    d = policy.route(make_admission(prompt_tokens=PROMPT), make_view(prefill=1, decode=pool))
    assert d.decode_scores == pytest.approx(want)


@pytest.mark.parametrize(
    ("pool", "seq", "want"),
    [
        # no overlap credit: a hit does not outweigh active blocks
        ([{"cached_tokens": 2048, "active_tokens": 500}, {"active_tokens": 400}], 0, 1),
        ([{"cached_tokens": 2048}, {}], 0, 0),
        ([{"cached_tokens": 2048}, {}], 1, 1),
        ([{"healthy": False}, {"active_tokens": 5}, {"active_tokens": 4}], 0, 2),
    ],
)
def test_decode_is_fewest_active_blocks(
    pool: list[dict[str, Any]], seq: int, want: int, calibration: Calibration
) -> None:
    policy = make_policy("kv_overlap_cost", {}, calibration)
    d = policy.route(make_admission(prompt_tokens=PROMPT), make_view(prefill=1, decode=pool, seq=seq))
    assert d.decode_id == f"decode-{want}"


SPECS = [
    InstanceSpec("p0", Role.PREFILL, 60_000),
    InstanceSpec("d0", Role.DECODE, 60_000),
    InstanceSpec("d1", Role.DECODE, 60_000),
]


@pytest.mark.parametrize(
    ("reuse", "want"),
    [
        # Dynamo's disaggregated decode router: each sequence's blocks its own, d0's three sequences (6144
        # tokens) cost more than d1's two (4096)
        (False, "d1"),
        # assuming reuse, d0's shared 1536-token prefix counts once (6144 - 3072) and the request adds only
        # its 512 new tokens: 3584 against 6144. The old model (committed tokens + prompt) picked d1 too.
        (True, "d0"),
    ],
)
def test_dedup_makes_the_decode_engine_serving_the_prefix_cheaper(
    reuse: bool, want: str, calibration: Calibration
) -> None:
    """Through the router and its ledger: d0 serves three active requests whose first three 512-token blocks
    are the new request's, d1 two requests that share nothing."""
    policy = make_policy("kv_overlap_cost", {"assume_kv_reuse": reuse}, calibration)
    ledger = Ledger(SPECS, calibration)
    router = Router(policy, make_predictor("bucket"), ledger, prefix=PrefixIndex(SPECS, 512))
    hot = [1, 2, 3]

    def admit(rid: str, blocks: list[int], decode: str) -> None:
        ledger.admit(rid, "p0", decode, PROMPT, 100, 0.0, 0, blocks)
        ledger.prefill_done(rid, 0.1)

    for i in range(3):
        admit(f"hot{i}", [*hot, 100 + i], "d0")
    for i in range(2):
        admit(f"cold{i}", [200 + 4 * i + k for k in range(4)], "d1")
    d = router.decide("new", PROMPT, SloClass.LOOSE, 1.0, prefix_blocks=[*hot, 300])
    assert d.route.decode_id == want
    states = {s.instance_id: s for s in d.view.decode}
    assert states["d0"].active_tokens == 3 * PROMPT and states["d1"].active_tokens == 2 * PROMPT
    shared, overlap = (3072, 1536) if reuse else (0, 0)  # the ledger counts blocks only when asked
    assert (states["d0"].active_shared_tokens, states["d0"].active_overlap_tokens) == (shared, overlap)


def test_reads_only_the_ledger_and_blocks_only_when_reuse_is_assumed(calibration: Calibration) -> None:
    assert not KvOverlapCost.reads_engine_samples
    assert not make_policy("kv_overlap_cost", {}, calibration).reads_active_blocks  # type: ignore[attr-defined]
    with_reuse = make_policy("kv_overlap_cost", {"assume_kv_reuse": "true"}, calibration)
    assert with_reuse.reads_active_blocks  # type: ignore[attr-defined]


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
    pool = [
        {"pending_prefill_tokens": 0, "active_tokens": 0},
        {"pending_prefill_tokens": 1000, "active_tokens": 1000},
        {"pending_prefill_tokens": 2000, "active_tokens": 2000},
    ]
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
