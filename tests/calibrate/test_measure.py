"""The sweeps without a cluster: one batch's stream events, the decode sweep on fake engines, transfers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

import aiohttp
import pytest

from calroute.calibrate.client import EMULATED_TOKEN_IDS, EngineClient, StreamTrace
from calroute.calibrate.measure import (
    BurstGuard,
    DecodeMeasurement,
    HandoffMeasurement,
    _BatchEvents,
    decode_sweep,
)
from calroute.calibrate.run import transfer_samples
from calroute.costmodel.calibration import DecodeCurve
from calroute.costmodel.profiles import get_profile
from tests.conftest import unreachable_cluster


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


class FakeEngines(EngineClient):
    """Answers every stream at once with a synthetic trace of 2 ms steps. The requests of a batch overlap,
    except when ``overlapping(batch, attempt)`` says not: then each starts after the previous one ended,
    as on an engine that runs them one at a time (or an API server that held one stream back)."""

    def __init__(self, overlapping: Callable[[int, int], bool]) -> None:
        super().__init__(cast(aiohttp.ClientSession, None), "m", EMULATED_TOKEN_IDS, seed=0)
        self._overlapping = overlapping
        self.attempts: dict[int, int] = {}
        self._arrived = 0
        self._read = 0
        self._batch = self._attempt = 0

    async def stream(
        self,
        url: str,
        prompt: list[int],
        max_tokens: int,
        timeout_s: float,
        kv_transfer_params: dict[str, Any] | None = None,
        on_event: Callable[[str], None] | None = None,
    ) -> StreamTrace:
        hook = on_event or (lambda event: None)
        index = self._arrived
        self._arrived += 1
        await asyncio.sleep(0)  # one batch's requests are all sent before any resumes: count them
        self._read += 1
        if self._read == 1:
            self._batch = self._arrived
            self._attempt = self.attempts[self._batch] = self.attempts.get(self._batch, 0) + 1
        if self._read == self._batch:
            self._arrived = self._read = 0
        step_s = 0.002
        start_s = 0.0001 * index
        if not self._overlapping(self._batch, self._attempt):
            start_s = index * (max_tokens + 1) * step_s
        for event in ("headers", "first", "done"):
            hook(event)
        return StreamTrace(0.0, [(start_s + k * step_s, 1) for k in range(max_tokens)])


def sweep(engines: FakeEngines) -> list[DecodeMeasurement]:
    cluster = unreachable_cluster(1, 1)
    prefill = get_profile("a40-qwen2.5-3b").calibration.prefill
    return asyncio.run(decode_sweep(engines, cluster, prefill, 60.0, lambda line: None))


def test_one_batch_without_a_steady_window_is_not_taken_for_a_capped_engine() -> None:
    # The first batch of two comes in one stream after the other (an API server that stalled): the size is
    # tried again and measured, and the larger ones too.
    engines = FakeEngines(lambda batch, attempt: not (batch == 2 and attempt == 1))
    measured = {m.batch for m in sweep(engines)}
    assert measured == {1, 2, 4, 8, 16, 32, 64}


def test_a_capped_engine_stops_the_larger_batches_after_two_tries() -> None:
    engines = FakeEngines(lambda batch, attempt: batch <= 8)
    measured = {m.batch for m in sweep(engines)}
    assert measured == {1, 2, 4, 8}
    assert all(engines.attempts.get(b, 0) <= 2 for b in (16, 32, 64))
