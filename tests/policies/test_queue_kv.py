"""queue_kv (llm-d's queue and KV-utilisation scorers, weighted): scores and picks, table-driven."""

from __future__ import annotations

from typing import Any

import pytest

from calroute.costmodel.calibration import Calibration
from calroute.errors import ConfigError
from calroute.policies import make_policy
from calroute.policies.queue_kv import scores
from calroute.types import Role
from tests.conftest import make_admission, make_state, make_view


@pytest.mark.parametrize(
    ("pool", "w_queue", "w_kv", "want"),
    [
        # equal queues: every queue score is 1; KV free 100 %, 50 %, 0 %
        ([(0, 0), (0, 30_000), (0, 60_000)], 2.0, 1.0, (3.0, 2.5, 2.0)),
        # queues 0, 5, 10 min-max normalised to 1, 0.5, 0; KV all free
        ([(0, 0), (5, 0), (10, 0)], 2.0, 1.0, (3.0, 2.0, 1.0)),
        # KV used beyond capacity (blocks round up) counts as full, not below 0
        ([(2, 70_000), (4, 0)], 1.0, 1.0, (1.0, 1.0)),
        ([(0, 0), (3, 60_000)], 0.0, 1.0, (1.0, 0.0)),
        ([(0, 60_000), (3, 0)], 1.0, 0.0, (1.0, 0.0)),
    ],
)
def test_scores(pool: list[tuple[int, int]], w_queue: float, w_kv: float, want: tuple[float, ...]) -> None:
    states = [
        make_state(f"d{i}", Role.DECODE, waiting=q, kv_used_tokens=kv) for i, (q, kv) in enumerate(pool)
    ]
    assert scores(states, w_queue, w_kv) == pytest.approx(want)


@pytest.mark.parametrize(
    ("decode", "params", "seq", "want"),
    [
        # the shortest waiting queue wins at the default 2:1 over a little more free KV
        ([{"waiting": 4, "kv_used_tokens": 0}, {"waiting": 0, "kv_used_tokens": 20_000}], {}, 0, "decode-1"),
        # with KV weighted up, the free KV wins
        (
            [{"waiting": 4, "kv_used_tokens": 0}, {"waiting": 0, "kv_used_tokens": 50_000}],
            {"w_queue": 0.5, "w_kv": 2},
            0,
            "decode-0",
        ),
        # in-flight requests the engines have not reported yet do not count: the samples decide
        ([{"in_flight": 9}, {"in_flight": 0, "kv_used_tokens": 1000}], {}, 0, "decode-0"),
        # ties rotate with the view's decision counter
        ([{}, {}, {}], {}, 0, "decode-0"),
        ([{}, {}, {}], {}, 4, "decode-1"),
    ],
)
def test_picks_the_highest_score(
    decode: list[dict[str, Any]], params: dict[str, Any], seq: int, want: str, calibration: Calibration
) -> None:
    policy = make_policy("queue_kv", params, calibration)
    decision = policy.route(make_admission(), make_view(prefill=2, decode=decode, seq=seq))
    assert decision.decode_id == want


def test_prefill_pool_is_scored_the_same_way(calibration: Calibration) -> None:
    view = make_view(prefill=[{"waiting": 3}, {"waiting": 0}, {"waiting": 1}], decode=1)
    assert make_policy("queue_kv", {}, calibration).route(make_admission(), view).prefill_id == "prefill-1"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"w_queue": -1}, "w_queue must be >= 0"),
        ({"w_kv": "-0.5"}, "w_kv must be >= 0"),
        ({"w_queue": 0, "w_kv": 0}, "cannot both be 0"),
        ({"w_kv": "lots"}, "w_kv"),
    ],
)
def test_bad_weights(params: dict[str, Any], message: str, calibration: Calibration) -> None:
    with pytest.raises(ConfigError, match=message):
        make_policy("queue_kv", params, calibration)
