"""What requests.jsonl keeps of a round's requests (benchmarks/overhead/client.py)."""

from __future__ import annotations

import json
import math

from benchmarks.overhead.client import Outcome, as_columns


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
