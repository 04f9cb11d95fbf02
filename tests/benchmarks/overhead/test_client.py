"""What requests.jsonl keeps of a round's requests (benchmarks/overhead/client.py)."""

from __future__ import annotations

import json
import math

import pytest
from benchmarks.overhead.client import Outcome, as_columns, late_timers


def test_a_rounds_requests_become_columns_in_ms_with_none_where_one_failed() -> None:
    outs = [
        Outcome(scheduled_s=10.0, sent_s=10.0005, ttft_s=0.0951234, done_s=10.3),
        Outcome(scheduled_s=10.01, sent_s=10.0121, error="HTTP 500: boom"),
        Outcome(scheduled_s=10.02),  # never sent: the round ended first
    ]
    cols = as_columns(outs)
    assert cols["scheduled_s"] == [10.0, 10.01, 10.02]
    assert cols["ttft_ms"] == [95.123, None, None]
    assert cols["error"] == [None, "HTTP 500: boom", None]
    assert cols["send_lag_ms"][0] is not None and math.isclose(cols["send_lag_ms"][0], 0.5)
    assert cols["send_lag_ms"][2] is None
    assert cols["e2e_ms"][0] is not None and math.isclose(cols["e2e_ms"][0], 300.0)
    assert cols["e2e_ms"][1:] == [None, None]
    assert json.loads(json.dumps(cols)) == cols  # one JSON line, no NaN


_EXPOSITION = """# HELP calroute_event_loop_lag_seconds How late the event loop ran a timer.
# TYPE calroute_event_loop_lag_seconds histogram
calroute_event_loop_lag_seconds_bucket{le="0.01"} 95.0
calroute_event_loop_lag_seconds_bucket{le="0.02"} 97.0
calroute_event_loop_lag_seconds_bucket{le="0.05"} 99.0
calroute_event_loop_lag_seconds_bucket{le="+Inf"} 100.0
calroute_event_loop_lag_seconds_count 100.0
calroute_event_loop_lag_seconds_sum 0.9
"""


@pytest.mark.parametrize(
    ("text", "over_s", "late"),
    [
        (_EXPOSITION, 0.02, 3.0),
        (_EXPOSITION, 0.05, 1.0),
        (_EXPOSITION, 0.03, None),  # not a bucket bound
        ("calroute_requests_total 3.0\n", 0.02, None),  # no such histogram (an older proxy)
    ],
)
def test_late_timers_are_read_from_the_histogram(text: str, over_s: float, late: float | None) -> None:
    assert late_timers(text, over_s) == late
