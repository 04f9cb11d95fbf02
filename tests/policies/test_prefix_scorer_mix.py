"""prefix_scorer_mix (llm-d's default profile: prefix 3, queue 2, KV 2): scores within llm-d's match window,
picks, its source, table-driven."""

from __future__ import annotations

from typing import Any

import pytest

from calroute.costmodel.calibration import Calibration
from calroute.errors import ConfigError
from calroute.policies import make_policy
from calroute.policies.prefix_scorer_mix import Params, prefix_score, scores
from calroute.types import Role
from tests.conftest import make_admission, make_state, make_view

PROMPT = 2048


@pytest.mark.parametrize(
    ("pool", "params", "want"),
    [
        # (waiting, kv_used_tokens, cached_tokens) per candidate; queues equal: 1 each; KV all free: 1 each
        ([(0, 0, 1024), (0, 0, 0)], {}, (3 * 0.5 + 2 + 2, 0 + 2 + 2)),
        # a whole-prompt hit scores 1, and a hit the index reports past the prompt no more
        ([(0, 0, 2048), (0, 0, 4096)], {}, (7.0, 7.0)),
        # queues 0 and 10 min-max normalised to 1 and 0; KV 0 % and 50 % used
        ([(0, 0, 0), (10, 30_000, 0)], {}, (4.0, 1.0)),
        # the P/D sample's weights: prefix 2, queue 1, no KV term
        ([(0, 60_000, 2048), (5, 0, 0)], {"w_prefix": 2, "w_queue": 1, "w_kv": 0}, (3.0, 0.0)),
    ],
)
def test_scores(pool: list[tuple[int, int, int]], params: dict[str, Any], want: tuple[float, ...]) -> None:
    states = [
        make_state(f"d{i}", Role.DECODE, waiting=q, kv_used_tokens=kv, cached_tokens=c)
        for i, (q, kv, c) in enumerate(pool)
    ]
    assert scores(states, PROMPT, Params(**params)) == pytest.approx(want)


@pytest.mark.parametrize(
    ("pool", "seq", "want"),
    [
        # balanced load: the prefix hit wins
        ([{"cached_tokens": 1024}, {}], 0, 0),
        ([{}, {"cached_tokens": 512}], 0, 1),
        # a longer hit beats a shorter one
        ([{"cached_tokens": 512}, {"cached_tokens": 1536}], 0, 1),
        # imbalanced: a whole-prompt hit (3) on a full engine with the longest queue (0 + 0) loses to an
        # idle engine without it (0 + 2 + 2)
        ([{"cached_tokens": 2048, "waiting": 10, "kv_used_tokens": 60_000}, {}], 0, 1),
        # ... and wins while its KV is free: 3 + 0 + 2 against 0 + 2 + 2
        ([{"cached_tokens": 2048, "waiting": 10}, {}], 0, 0),
        # exactly equal totals, 1.5 + 0 + 2 against 0 + 2 + 1.5: the tie rotates with seq
        ([{"cached_tokens": 1024, "waiting": 4}, {"kv_used_tokens": 15_000}], 0, 0),
        ([{"cached_tokens": 1024, "waiting": 4}, {"kv_used_tokens": 15_000}], 1, 1),
        # no hits anywhere: the shortest queue, then the freer KV
        ([{"waiting": 3}, {"waiting": 1}, {"waiting": 2}], 0, 1),
        ([{"kv_used_tokens": 9000}, {"kv_used_tokens": 3000}], 0, 1),
        # an idle cluster spreads
        ([{}, {}, {}], 4, 1),
        # an unhealthy instance is skipped, however good its score
        ([{"cached_tokens": 2048, "healthy": False}, {"waiting": 3}, {"waiting": 5}], 0, 1),
    ],
)
def test_picks_the_highest_score_in_each_pool(
    pool: list[dict[str, Any]], seq: int, want: int, calibration: Calibration
) -> None:
    policy = make_policy("prefix_scorer_mix", {}, calibration)
    adm = make_admission(prompt_tokens=PROMPT)
    d = policy.route(adm, make_view(prefill=2, decode=pool, seq=seq))
    p = policy.route(adm, make_view(prefill=pool, decode=2, seq=seq))
    assert (d.decode_id, p.prefill_id) == (f"decode-{want}", f"prefill-{want}")


@pytest.mark.parametrize(
    ("prompt", "cached", "window", "want"),
    [
        # llm-d hashes at most 256 blocks of 16 tokens (4,096 tokens): a 10k-token prompt sharing its first
        # 4,096 tokens scores 1 (the old whole-prompt score: 0.41)
        (10_000, 4096, 4096, 1.0),
        (10_000, 2048, 4096, 0.5),
        (10_000, 8192, 4096, 1.0),
        # window 0: the whole prompt
        (10_000, 4096, 0, 0.4096),
        # a prompt within the window: the share of the prompt
        (2048, 1024, 4096, 0.5),
        (2048, 4096, 4096, 1.0),
        (2048, 0, 4096, 0.0),
    ],
)
def test_the_prefix_score_is_within_the_match_window(
    prompt: int, cached: int, window: int, want: float
) -> None:
    state = make_state("d0", Role.DECODE, cached_tokens=cached)
    assert prefix_score(state, prompt, window) == pytest.approx(want)
    assert scores([state], prompt, Params(window_tokens=window, w_queue=0, w_kv=1))[0] == pytest.approx(
        3 * want + 1
    )


@pytest.mark.parametrize(
    ("params", "want"),
    [
        # a 16k-token prompt whose first 4,096 tokens decode-0 holds, behind a queue of 4: within llm-d's
        # window that is a whole match (3 + 0 + 2 = 5 against 0 + 2 + 2); over the whole prompt only a
        # quarter (0.75 + 0 + 2), and the idle engine wins
        ({}, 0),
        ({"window_tokens": 0}, 1),
    ],
)
def test_a_long_prompt_follows_its_windowed_match(
    params: dict[str, Any], want: int, calibration: Calibration
) -> None:
    policy = make_policy("prefix_scorer_mix", params, calibration)
    view = make_view(prefill=2, decode=[{"cached_tokens": 4096, "waiting": 4}, {}])
    assert policy.route(make_admission(prompt_tokens=16_384), view).decode_id == f"decode-{want}"


@pytest.mark.parametrize(("params", "want"), [({}, "approximate"), ({"source": "precise"}, None)])
def test_the_source_is_the_routers_placements_unless_precise(
    params: dict[str, Any], want: str | None, calibration: Calibration
) -> None:
    assert make_policy("prefix_scorer_mix", params, calibration).prefix_source == want  # type: ignore[attr-defined]


def test_the_decision_reports_negated_scores(calibration: Calibration) -> None:
    policy = make_policy("prefix_scorer_mix", {}, calibration)
    view = make_view(prefill=[{"cached_tokens": 1024}, {}], decode=[{}, {"healthy": False}, {"waiting": 2}])
    d = policy.route(make_admission(prompt_tokens=PROMPT), view)
    assert d.prefill_scores == pytest.approx((-5.5, -4.0))
    assert d.decode_scores == pytest.approx((-4.0, -2.0))


def test_reads_the_engine_samples() -> None:
    from calroute.policies.prefix_scorer_mix import PrefixScorerMix

    assert PrefixScorerMix.reads_engine_samples


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"w_prefix": -1}, "w_prefix must be >= 0"),
        ({"w_queue": "-2"}, "w_queue must be >= 0"),
        ({"w_kv": -0.5}, "w_kv must be >= 0"),
        ({"w_prefix": 0, "w_queue": 0, "w_kv": 0}, "cannot all be 0"),
        ({"w_prefix": "lots"}, "w_prefix"),
        ({"window_tokens": -1}, "window_tokens must be >= 0"),
        ({"source": "kv-events"}, "source must be one of approximate, precise"),
    ],
)
def test_bad_weights(params: dict[str, Any], message: str, calibration: Calibration) -> None:
    with pytest.raises(ConfigError, match=message):
        make_policy("prefix_scorer_mix", params, calibration)
