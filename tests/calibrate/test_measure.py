"""The sweeps' bookkeeping that needs no cluster: one batch's stream events, the transfer samples."""

from __future__ import annotations

import pytest

from calroute.calibrate.measure import BurstGuard, HandoffMeasurement, _BatchEvents
from calroute.calibrate.run import transfer_samples
from calroute.costmodel.calibration import DecodeCurve


def test_batch_events_open_and_close_one_window_and_record_bursts() -> None:
    guard = BurstGuard()
    events = _BatchEvents(batch=2, guard=guard)
    for e in ("headers", "headers", "first"):
        events(e)
    assert len(guard.bursts) == 1 and guard.open_windows == 0
    events("first")
    assert guard.open_windows == 1
    events("done")
    assert guard.open_windows == 0
    events("done")
    assert len(guard.bursts) == 2 and guard.open_windows == 0


def test_batch_events_never_open_a_window_after_a_request_finished() -> None:
    guard = BurstGuard()
    events = _BatchEvents(batch=2, guard=guard)
    for e in ("headers", "headers", "first", "done", "first", "done"):
        events(e)
    assert guard.open_windows == 0


def test_transfer_is_ttft_minus_one_decode_step() -> None:
    decode = DecodeCurve(base_s=0.015, per_seq_s=1e-4, per_ctx_token_s=1e-7)
    handoffs = [HandoffMeasurement("p", "d", 1001, 0.020)]
    [(prompt, transfer_s)] = transfer_samples(handoffs, decode)
    assert prompt == 1001
    assert transfer_s == pytest.approx(0.020 - (0.015 + 1e-4 + 1e-7 * 1000))
