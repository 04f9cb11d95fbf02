"""The calibration plan and the steady window of a decode batch, on synthetic streams."""

from __future__ import annotations

import pytest

from calroute.calibrate.client import NoSteadyWindow, RequestFailed, StreamTrace
from calroute.calibrate.plan import KV_FILL, _largest_gap, decode_plan, prefill_ladder, steady_window
from calroute.errors import CalibrationError

STEP_S = 0.02


def _trace(first_s: float, tokens: int, per_event: int = 1, step_s: float = STEP_S) -> StreamTrace:
    """A stream whose first token arrives at first_s and then one event every per_event steps."""
    trace = StreamTrace(sent_s=0.0, events=[(first_s, 1)])
    n = 1
    t = first_s
    while n < tokens:
        k = min(per_event, tokens - n)
        t += k * step_s
        trace.events.append((t, k))
        n += k
    return trace


def test_steady_window_reads_the_pure_decode_stretch() -> None:
    # Three requests start 0, 2 and 5 steps apart (their prompts' prefill staggers them) and all produce
    # 40 tokens; only the stretch where all three decode counts.
    traces = [_trace(0.1 + i * STEP_S, 40) for i in (0, 2, 5)]
    tpot_s, context, window = steady_window(traces, prompt_tokens=100)
    assert tpot_s == pytest.approx(STEP_S)
    t_start, t_end = 0.1 + 5 * STEP_S, traces[0].events[-1][0]
    assert window == pytest.approx(round((t_end - t_start) / STEP_S) - 2, abs=1)
    # each request: prompt + the mean index of the tokens it produced inside the window, minus 2
    assert 300 < context < 300 + 3 * 40


def test_steady_window_counts_tokens_per_event() -> None:
    # vLLM may coalesce tokens into one SSE event when the client lags: per-token time must not change
    traces = [_trace(0.0, 60, per_event=3), _trace(0.0, 60, per_event=2)]
    tpot_s, _, _ = steady_window(traces, prompt_tokens=10)
    assert tpot_s == pytest.approx(STEP_S)


def test_steady_window_skips_other_batches_bursts() -> None:
    trace = _trace(0.0, 60)
    # A 100 ms stall (another batch's burst on the shared event loop) stretches one step.
    stall_at = 30
    trace.events = [(t + (0.1 if i >= stall_at else 0.0), n) for i, (t, n) in enumerate(trace.events)]
    stalled, _, _ = steady_window([trace], 10)
    assert stalled > STEP_S * 1.05
    burst = (trace.events[stall_at - 1][0], trace.events[stall_at][0])
    clean, _, _ = steady_window([trace], 10, exclude=[burst])
    assert clean == pytest.approx(STEP_S)


def test_steady_window_rejects_tokens_read_at_once() -> None:
    # A starved API server flushes a backlog of tokens in one read: arrival times then carry no step time.
    trace = _trace(0.0, 40)
    last = len(trace.events) - 1
    trace.events = [(t if i in (0, last) else 0.5, n) for i, (t, n) in enumerate(trace.events)]
    with pytest.raises(RequestFailed, match="at once"):
        steady_window([trace, _trace(0.0, 40)], 10)


def test_a_stream_read_at_once_is_a_failed_sample_not_a_capped_batch() -> None:
    # A batch of one whose answer came in one read: dropping it must not mark batch size 1 as too big.
    burst = StreamTrace(sent_s=0.0, events=[(0.3, 1), (0.3, 20)])
    for traces in ([burst], [burst, _trace(0.0, 40)]):
        with pytest.raises(RequestFailed, match="at once") as info:
            steady_window(traces, 10)
        assert not isinstance(info.value, NoSteadyWindow)


def test_largest_gap() -> None:
    assert _largest_gap(0, 10, []) == (0, 10)
    assert _largest_gap(0, 10, [(2, 3), (6, 7)]) == (3, 6)
    assert _largest_gap(0, 10, [(-1, 4)]) == (4, 10)
    assert _largest_gap(0, 10, [(-1, 11)]) == (0, 0)


def test_no_steady_window_when_requests_do_not_overlap() -> None:
    # An engine that runs 1 sequence at a time: the second starts after the first ends.
    with pytest.raises(NoSteadyWindow):
        steady_window([_trace(0.0, 10), _trace(0.5, 10)], 10)
    with pytest.raises(RequestFailed, match="too short"):
        steady_window([_trace(0.0, 10), _trace(0.1, 10)], 10)


@pytest.mark.parametrize(
    ("kv_tokens", "max_model_len"), [(60_000, 32_768), (65_536, 2048), (20_000, 4096), (8000, 1024)]
)
def test_decode_plan_fits_the_engines(kv_tokens: int, max_model_len: int) -> None:
    plan = decode_plan(kv_tokens, max_model_len)
    assert plan and plan[0].batch == 1
    for item in plan:
        assert item.batch * (item.prompt_tokens + item.output_tokens) <= KV_FILL * kv_tokens
        assert item.prompt_tokens + item.output_tokens <= max_model_len
    for b in {i.batch for i in plan}:
        prompts = sorted(i.prompt_tokens for i in plan if i.batch == b)
        assert len(prompts) in (1, 2)
        if len(prompts) == 2:
            assert prompts[1] >= 2 * prompts[0]  # context varies independently of the batch size
    assert max(i.batch for i in plan) == (64 if kv_tokens >= 20_000 else 32)


def test_prefill_ladder() -> None:
    ladder = prefill_ladder(32_768)
    assert ladder[0] == 64 and ladder[-1] == 4096 and len(ladder) == 8
    assert all(b / a < 2.0 for a, b in zip(ladder, ladder[1:], strict=False))  # geometric
    assert prefill_ladder(2048)[-1] == 1024
    with pytest.raises(CalibrationError, match="too short"):
        prefill_ladder(256)
