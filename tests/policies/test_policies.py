"""Table-driven decisions of each policy on hand-built views."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from calroute.costmodel.calibration import Calibration
from calroute.policies import make_policy
from calroute.policies.base import argmin_rotating
from calroute.types import SloClass
from tests.conftest import make_admission, make_view


@pytest.mark.parametrize(
    ("keys", "start", "want"),
    [
        ([3, 1, 2], 0, 1),
        ([1, 1, 1], 0, 0),
        ([1, 1, 1], 2, 2),
        ([1, 0, 0], 1, 1),
        ([1, 0, 0], 2, 2),
        ([0, 1, 0], 7, 2),
    ],
)
def test_argmin_rotating(keys: list[float], start: int, want: int) -> None:
    assert argmin_rotating(tuple(keys), start) == want


def test_round_robin_cycles_each_pool(calibration: Calibration) -> None:
    policy = make_policy("round_robin", {}, calibration)
    picks = [policy.route(make_admission(), make_view(seq=s)) for s in range(8)]
    assert [p.prefill_id for p in picks] == ["prefill-0", "prefill-1"] * 4
    assert [p.decode_id for p in picks] == [f"decode-{i}" for i in range(4)] * 2


@pytest.mark.parametrize(
    ("decode", "seq", "want"),
    [
        ([{"in_flight": 3}, {"in_flight": 1}, {"in_flight": 2}], 0, "decode-1"),
        ([{"in_flight": 1}, {"in_flight": 1}, {"in_flight": 1}], 1, "decode-1"),
        ([{"in_flight": 0}, {"in_flight": 5, "healthy": False}, {"in_flight": 1}], 1, "decode-0"),
        # JSQ ignores backlog seconds: only counts matter
        ([{"in_flight": 1, "backlog_s": 0.0}, {"in_flight": 0, "backlog_s": 9.0}], 0, "decode-1"),
    ],
)
def test_least_loaded(decode: list[dict[str, Any]], seq: int, want: str, calibration: Calibration) -> None:
    d = make_policy("least_loaded", {}, calibration).route(
        make_admission(), make_view(decode=decode, seq=seq)
    )
    assert d.decode_id == want


@pytest.mark.parametrize(
    ("predicted", "seq", "want"),
    [
        (1000, 0, "decode-2"),  # long: fewest in flight
        (1000, 3, "decode-2"),
        (10, 0, "decode-0"),  # short: round robin by seq
        (10, 1, "decode-1"),
        (255, 2, "decode-2"),
        (256, 1, "decode-2"),  # at the threshold counts as long
    ],
)
def test_length_heuristic(predicted: int, seq: int, want: str, calibration: Calibration) -> None:
    view = make_view(decode=[{"in_flight": 4}, {"in_flight": 3}, {"in_flight": 0}], seq=seq)
    d = make_policy("length_heuristic", {}, calibration).route(
        make_admission(predicted_output_tokens=predicted), view
    )
    assert d.decode_id == want


def test_power_of_two_never_picks_the_most_loaded_of_two(calibration: Calibration) -> None:
    policy = make_policy("power_of_two", {"seed": 3}, calibration)
    view = make_view(decode=[{"in_flight": 9}, {"in_flight": 0}])
    assert {policy.route(make_admission(), view.replace(seq=s)).decode_id for s in range(20)} == {"decode-1"}


def test_power_of_two_avoids_the_worst_of_many(calibration: Calibration) -> None:
    policy = make_policy("power_of_two", {}, calibration)
    view = make_view(decode=[{"in_flight": 9}, {"in_flight": 1}, {"in_flight": 2}, {"in_flight": 3}])
    picks = Counter(policy.route(make_admission(), view.replace(seq=s)).decode_id for s in range(400))
    assert "decode-0" not in picks
    assert picks["decode-1"] > picks["decode-3"]


def test_random_is_roughly_uniform_and_seeded(calibration: Calibration) -> None:
    a = make_policy("random", {"seed": 1}, calibration)
    b = make_policy("random", {"seed": 2}, calibration)
    picks_a = [a.route(make_admission(), make_view(seq=s)).decode_id for s in range(2000)]
    picks_b = [b.route(make_admission(), make_view(seq=s)).decode_id for s in range(2000)]
    counts = Counter(picks_a)
    assert set(counts) == {f"decode-{i}" for i in range(4)}
    assert all(400 < c < 600 for c in counts.values())
    assert picks_a != picks_b


# marginal_cost ----------------------------------------------------------------------------------------


PAPER = {"w_b_dec": 1.0}  # the paper's decode price: the backlog weighted like prefill's
STEP = {"step_curve": True}  # decode priced by the calibrated step curve after admission
# Eight short streams against two long ones holding more KV (A40 profile: a stream costs as much step time
# as ~900 context tokens).
MANY_SHORT_VS_FEW_LONG = [
    {"in_flight": 8, "kv_used_tokens": 8_000},
    {"in_flight": 2, "kv_used_tokens": 12_000},
]
# One stream with its KV overcommitted against sixty streams with room.
OVERCOMMITTED = [{"in_flight": 1, "kv_committed_tokens": 70_000}, {"in_flight": 60, "kv_used_tokens": 20_000}]


@pytest.mark.parametrize(
    ("decode", "adm", "params", "want"),
    [
        # a decode engine batches continuously: its backlog is no queue, the in-flight tie-breaker decides
        ([{"backlog_s": 0.0, "in_flight": 2}, {"backlog_s": 2.0, "in_flight": 1}], {}, {}, "decode-1"),
        # the paper's price: less committed backlog wins
        ([{"backlog_s": 0.0, "in_flight": 2}, {"backlog_s": 2.0, "in_flight": 1}], {}, PAPER, "decode-0"),
        ([{"backlog_s": 2.0}, {"backlog_s": 0.5}], {}, PAPER, "decode-1"),
        # equal backlog: lower post-admission KV pressure wins
        ([{"kv_used_tokens": 50_000}, {"kv_used_tokens": 1_000}], {}, {}, "decode-1"),
        # the ledger's committed footprint counts when the sampled usage is stale and low
        ([{"kv_committed_tokens": 55_000}, {"kv_used_tokens": 20_000}], {}, {}, "decode-1"),
        # the paper's price: a long request pays pressure more than a small backlog difference
        (
            [{"backlog_s": 0.0, "kv_used_tokens": 55_000}, {"backlog_s": 0.3, "kv_used_tokens": 0}],
            {"predicted_output_tokens": 2000},
            PAPER,
            "decode-1",
        ),
        # ...but a short one takes the emptier queue
        (
            [{"backlog_s": 0.0, "kv_used_tokens": 55_000}, {"backlog_s": 0.3, "kv_used_tokens": 0}],
            {"predicted_output_tokens": 4},
            PAPER,
            "decode-0",
        ),
        # ours: the short one too goes where the KV is free
        (
            [{"backlog_s": 0.0, "kv_used_tokens": 55_000}, {"backlog_s": 0.3, "kv_used_tokens": 0}],
            {"predicted_output_tokens": 4},
            {},
            "decode-1",
        ),
        # all equal: the in-flight tie-breaker
        ([{"in_flight": 2}, {"in_flight": 1}], {}, {}, "decode-1"),
        # the KV price sees only tokens; the step curve also prices each stream's per-step cost
        (MANY_SHORT_VS_FEW_LONG, {}, {}, "decode-0"),
        (MANY_SHORT_VS_FEW_LONG, {}, STEP, "decode-1"),
        # the step curve with equal streams: the lighter context wins
        (
            [{"in_flight": 2, "kv_used_tokens": 50_000}, {"in_flight": 2, "kv_used_tokens": 1_000}],
            {},
            STEP,
            "decode-1",
        ),
        # past the KV budget the request would wait: rho prices the overflow (a cheaper step loses)
        (OVERCOMMITTED, {"predicted_output_tokens": 2000}, STEP, "decode-1"),
        (OVERCOMMITTED, {"predicted_output_tokens": 2000}, {**STEP, "rho": 0.0}, "decode-0"),
    ],
)
def test_marginal_cost_decode(
    decode: list[dict[str, Any]],
    adm: dict[str, Any],
    params: dict[str, Any],
    want: str,
    calibration: Calibration,
) -> None:
    d = make_policy("marginal_cost", params, calibration).route(
        make_admission(**adm), make_view(decode=decode)
    )
    assert d.decode_id == want
    assert len(d.decode_scores) == len(decode)
    assert min(d.decode_scores) == d.decode_scores[int(want[-1])]


def test_marginal_cost_prefill_prefers_less_backlog(calibration: Calibration) -> None:
    view = make_view(prefill=[{"backlog_s": 0.4}, {"backlog_s": 0.1, "in_flight": 3}])
    # at the paper's backlog weight (the default, 0.26, lets the co-batch delay of 3 in flight outweigh 0.3 s)
    policy = make_policy("marginal_cost", {"w_b": 1.0}, calibration)
    assert policy.route(make_admission(), view).prefill_id == "prefill-1"


# prefill-0: one long prompt pending (3,000 tokens); prefill-1: five short ones (500 tokens in all)
LONG_VS_MANY = [
    {"backlog_s": 3000 * 7.95e-5, "in_flight": 1},
    {"backlog_s": 500 * 7.95e-5, "in_flight": 5},
]


@pytest.mark.parametrize(
    ("prompt_tokens", "params", "want"),
    [
        # a long prompt would delay the five short ones batched with it: it queues behind the long one
        (2000, {}, "prefill-0"),
        # priced by its own wait only, it takes the engine with fewer pending tokens
        (2000, {"w_cobatch": 0.0}, "prefill-1"),
        # a short prompt delays little: the emptier engine, in seconds, wins
        (64, {}, "prefill-1"),
    ],
)
def test_marginal_cost_prefill_prices_the_delay_to_co_batched_requests(
    prompt_tokens: int, params: dict[str, Any], want: str, calibration: Calibration
) -> None:
    policy = make_policy("marginal_cost", params, calibration)
    d = policy.route(make_admission(prompt_tokens=prompt_tokens), make_view(prefill=LONG_VS_MANY))
    assert d.prefill_id == want


def test_marginal_cost_weights_are_honoured(calibration: Calibration) -> None:
    view = make_view(decode=[{"backlog_s": 0.0, "in_flight": 5}, {"backlog_s": 0.05, "in_flight": 0}])
    assert (
        make_policy("marginal_cost", PAPER, calibration).route(make_admission(), view).decode_id == "decode-0"
    )
    # with backlog ignored and queue counting dominant, the decision flips
    queue_only = make_policy("marginal_cost", {"w_b": 0, "w_b_dec": 0, "w_q": 1}, calibration)
    assert queue_only.route(make_admission(), view).decode_id == "decode-1"


def test_marginal_cost_mispriced_tau_changes_the_decision(calibration: Calibration) -> None:
    """The size term is priced with tau and the backlog is observed: a wrong tau re-weights them (on decode
    instances only with the paper's decode backlog; prefill instances always have one)."""
    view = make_view(decode=[{"backlog_s": 0.0, "kv_used_tokens": 40_000}, {"backlog_s": 5.0}])
    adm = make_admission(predicted_output_tokens=1500)
    right = make_policy("marginal_cost", PAPER, calibration)
    too_cheap = make_policy(
        "marginal_cost", PAPER, replace(calibration, tau_dec_s=calibration.tau_dec_s / 7.4)
    )
    assert right.route(adm, view).decode_id == "decode-1"
    assert too_cheap.route(adm, view).decode_id == "decode-0"


def test_marginal_cost_sigma_scales_load_terms_not_the_tiebreak(calibration: Calibration) -> None:
    view = make_view(decode=[{"backlog_s": 0.010, "in_flight": 0}, {"backlog_s": 0.0, "in_flight": 12}])
    policy = make_policy("marginal_cost", {"sigma_tight": 4.0, **PAPER}, calibration)
    assert policy.route(make_admission(slo_class=SloClass.LOOSE), view).decode_id == "decode-0"
    assert policy.route(make_admission(slo_class=SloClass.TIGHT), view).decode_id == "decode-1"


@pytest.mark.parametrize(
    ("params", "adm", "decode", "want"),
    [
        # with output length, a long request avoids KV pressure; without it, it is priced as a short one
        # (which the paper's decode backlog then sends to the fuller engine)
        (
            PAPER,
            {"predicted_output_tokens": 3000},
            [{"kv_used_tokens": 50_000}, {"backlog_s": 2.0}],
            "decode-1",
        ),
        (
            {"use_output_length": False, "fallback_output_tokens": 16, **PAPER},
            {"predicted_output_tokens": 3000},
            [{"kv_used_tokens": 50_000}, {"backlog_s": 2.0}],
            "decode-0",
        ),
        # without KV pressure the fuller engine is as cheap as the empty one: backlog decides
        (
            {"use_kv_pressure": False, **PAPER},
            {"predicted_output_tokens": 3000},
            [{"kv_used_tokens": 50_000}, {"backlog_s": 2.0}],
            "decode-0",
        ),
        # without the prompt, a huge prompt no longer adds to KV pressure
        (
            {"use_prompt_length": True},
            {"prompt_tokens": 30_000, "predicted_output_tokens": 10},
            [{"kv_used_tokens": 29_000, "in_flight": 0}, {"kv_used_tokens": 0, "in_flight": 3}],
            "decode-1",
        ),
    ],
)
def test_marginal_cost_feature_switches(
    params: dict[str, Any],
    adm: dict[str, Any],
    decode: list[dict[str, Any]],
    want: str,
    calibration: Calibration,
) -> None:
    d = make_policy("marginal_cost", params, calibration).route(
        make_admission(**adm), make_view(decode=decode)
    )
    assert d.decode_id == want


def test_marginal_cost_without_slo_prices_classes_alike(calibration: Calibration) -> None:
    view = make_view(decode=[{"backlog_s": 0.010, "in_flight": 0}, {"backlog_s": 0.0, "in_flight": 12}])
    policy = make_policy("marginal_cost", {"sigma_tight": 4.0, "use_slo": False}, calibration)
    assert policy.route(make_admission(slo_class=SloClass.TIGHT), view).decode_id == "decode-0"


@pytest.mark.parametrize(
    ("backlog_x_saved", "use_prefix_cache", "want"),
    [
        # the engine holding the prefix is worth its queue while the queue is shorter than the seconds saved
        (0.5, True, "prefill-1"),
        (2.0, True, "prefill-0"),
        # the paper's router prices every prompt from scratch: the idle engine wins
        (0.5, False, "prefill-0"),
    ],
)
def test_marginal_cost_prices_a_cached_prefix_in_prefill_seconds(
    backlog_x_saved: float, use_prefix_cache: bool, want: str, calibration: Calibration
) -> None:
    saved_s = 8000 * calibration.tau_pre_s
    view = make_view(
        prefill=[{}, {"cached_tokens": 8000, "backlog_s": backlog_x_saved * saved_s, "in_flight": 1}]
    )
    # backlog and saving weighed alike (w_b = w_s = 1), so the queue is worth its seconds
    params = {"w_b": 1.0, "w_q": 0.0, "use_prefix_cache": use_prefix_cache, "w_cobatch": 0.0}
    policy = make_policy("marginal_cost", params, calibration)
    assert policy.route(make_admission(prompt_tokens=8192), view).prefill_id == want


def test_marginal_cost_charges_decode_only_the_blocks_it_must_pull(calibration: Calibration) -> None:
    view = make_view(decode=[{}, {"cached_tokens": 8000}, {"cached_tokens": 4000}, {}])
    d = make_policy("marginal_cost", {}, calibration).route(make_admission(prompt_tokens=8192), view)
    assert d.decode_id == "decode-1"
    assert d.decode_scores[1] < d.decode_scores[2] < d.decode_scores[0] == d.decode_scores[3]
    off = make_policy("marginal_cost", {"use_prefix_cache": False}, calibration)
    assert off.route(make_admission(prompt_tokens=8192), view).decode_id == "decode-0"  # a four-way tie
    # the pull is the calibrated transfer time of what the candidate lacks, to the bit (route() writes
    # Calibration.transfer_s out), and nothing for one that lacks nothing
    full = make_view(decode=[{"cached_tokens": 8192}, {"cached_tokens": 4000}])
    f = make_policy("marginal_cost", {}, calibration).route(make_admission(prompt_tokens=8192), full)
    g = off.route(make_admission(prompt_tokens=8192), full)
    sigma = 1.0  # a loose request
    assert f.decode_scores[0] == g.decode_scores[0]
    assert f.decode_scores[1] == g.decode_scores[1] + sigma * 1.0 * calibration.transfer_s(8192 - 4000)


def test_marginal_cost_prices_what_a_prompt_would_evict(calibration: Calibration) -> None:
    # equal queues; prefill-1 holds a quarter of the prompt, prefill-0 nothing; loose SLO (sigma 1)
    view = make_view(
        prefill=[{"evicted_reuse_ratio": 0.9}, {"cached_tokens": 2048, "evicted_reuse_ratio": 0.9}]
    )
    adm = make_admission(prompt_tokens=8192)
    saved_s = 2048 * calibration.tau_pre_s

    def gap(params: dict[str, Any]) -> float:
        scores = make_policy("marginal_cost", params, calibration).route(adm, view).prefill_scores
        return scores[0] - scores[1]

    # the holder saves the tokens it has, and the evictions computing them would cause, at w_evict
    assert gap({}) == pytest.approx(saved_s + 1.16 * 0.9 * saved_s)  # the default weight
    assert gap({"w_evict": 1.0}) == pytest.approx(saved_s + 0.9 * saved_s)
    assert gap({"w_evict": 0.0}) == pytest.approx(saved_s)
    assert gap({"use_prefix_cache": False}) == pytest.approx(0.0)
    # without reuse evidence the eviction price is nothing
    quiet = make_view(prefill=[{}, {"cached_tokens": 2048}])
    scores = make_policy("marginal_cost", {}, calibration).route(adm, quiet).prefill_scores
    assert scores[0] - scores[1] == pytest.approx(saved_s)


@pytest.mark.parametrize(
    ("shared_kv", "want"),
    [(True, "decode-1"), (False, "decode-0")],
    ids=["kv-as-the-cache-holds-it", "every-prompt-whole"],
)
def test_marginal_cost_counts_decode_kv_as_the_cache_holds_it(
    shared_kv: bool, want: str, calibration: Calibration
) -> None:
    # decode-1 runs ten streams that share a 5,000-token system prompt with the request: its ledger commits
    # 50,000 prompt tokens, but its cache holds the prompt once, and the request adds only its own tail.
    # Counting every prompt whole prices decode-1 near full and sends the request to the emptier decode-0,
    # where it takes 6,000 tokens more of KV (vLLM's blocks shared, kvcache/pool.py).
    view = make_view(
        decode=[
            {"kv_committed_tokens": 20_000, "kv_used_tokens": 20_000, "in_flight": 10},
            {
                "kv_committed_tokens": 55_000,
                "kv_used_tokens": 10_000,
                "in_flight": 10,
                "active_tokens": 50_000,
                "active_shared_tokens": 45_000,
                "active_overlap_tokens": 5_000,
            },
        ]
    )
    policy = make_policy("marginal_cost", {"shared_kv": shared_kv, "w_q": 0.0}, calibration)
    assert getattr(policy, "reads_active_blocks", False) is shared_kv
    assert policy.route(make_admission(prompt_tokens=6000), view).decode_id == want
