"""What calibration measures and how it reads a batch: the prompt-length ladder for prefill, the
(batch, prompt, output) plan for decode, and the steady window of a decode batch."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from calroute.calibrate.client import NoSteadyWindow, RequestFailed, StreamTrace
from calroute.errors import CalibrationError

MIN_PROMPT_TOKENS = 64
MAX_PROMPT_TOKENS = 4096
PREFILL_LADDER_POINTS = 8

# The batch ladder 1, 2, 4, ..., 64 in the order it is measured: the corners of the (batch, context) plane
# first, then the middle, so a short budget still brackets the reference point (32 sequences) instead of
# stopping halfway up the ladder.
DECODE_BATCH_PRIORITY = (1, 32, 64, 8, 2, 16, 4)
DECODE_SHORT_PROMPT = 128
DECODE_LONG_PROMPT_MAX = 2048
STEADY_WINDOW_TOKENS = 32  # decode steps wanted inside the steady window, per request
MIN_WINDOW_TOKENS = 8  # fewer than this and the sample is dropped
# The engine's per-iteration prefill token budget is not advertised; assuming a small one overestimates how
# long the prompts' prefill staggers the requests' starts, which only costs a few extra tokens.
PREFILL_CHUNK_GUESS = 2048
KV_FILL = 0.9  # use at most this fraction of an engine's KV (vLLM keeps a watermark, blocks round up)


def geometric_ladder(lo: int, hi: int, points: int) -> list[int]:
    """``points`` integers from lo to hi, evenly spaced in log (deduplicated)."""
    if hi <= lo:
        return [lo]
    values = np.exp(np.linspace(math.log(lo), math.log(hi), points))
    return sorted({int(round(float(v))) for v in values})


def prefill_ladder(max_model_len: int) -> list[int]:
    hi = min(MAX_PROMPT_TOKENS, max_model_len // 2)
    if hi < MIN_PROMPT_TOKENS * 4:
        raise CalibrationError(
            f"max_model_len {max_model_len} is too short to measure a prefill curve (need >= "
            f"{MIN_PROMPT_TOKENS * 8})"
        )
    return geometric_ladder(MIN_PROMPT_TOKENS, hi, PREFILL_LADDER_POINTS)


@dataclass(frozen=True)
class DecodeItem:
    batch: int
    prompt_tokens: int
    output_tokens: int


def _output_tokens(batch: int, prompt_tokens: int) -> int:
    stagger = math.ceil(batch * prompt_tokens / PREFILL_CHUNK_GUESS)
    return STEADY_WINDOW_TOKENS + stagger + 4


def decode_plan(kv_capacity_tokens: int, max_model_len: int) -> list[DecodeItem]:
    """(batch, prompt, output) items: every batch size whose KV fits, a short and a long prompt each."""
    kv = int(KV_FILL * kv_capacity_tokens)
    short = min(DECODE_SHORT_PROMPT, max_model_len // 4)
    long_max = min(DECODE_LONG_PROMPT_MAX, max_model_len // 2)
    items: list[DecodeItem] = []
    for b in DECODE_BATCH_PRIORITY:
        n_short = _output_tokens(b, short)
        if b * (short + n_short) > kv or short + n_short > max_model_len:
            continue
        items.append(DecodeItem(b, short, n_short))
        long = min(long_max, kv // b - _output_tokens(b, long_max))
        n_long = _output_tokens(b, long)
        long = min(long, kv // b - n_long, max_model_len - n_long)
        if long >= 2 * short:  # else context would not vary enough to separate it from the batch size
            items.append(DecodeItem(b, long, n_long))
    return items


def _largest_gap(start: float, end: float, exclude: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """The longest part of (start, end) that overlaps none of the ``exclude`` intervals."""
    segments = [(start, end)]
    for a, b in exclude:
        kept: list[tuple[float, float]] = []
        for s, e in segments:
            if b <= s or a >= e:
                kept.append((s, e))
                continue
            if a > s:
                kept.append((s, a))
            if b < e:
                kept.append((b, e))
        segments = kept
    if not segments:
        return start, start
    return max(segments, key=lambda se: se[1] - se[0])


def steady_window(
    traces: Sequence[StreamTrace], prompt_tokens: int, exclude: Sequence[tuple[float, float]] = ()
) -> tuple[float, float, int]:
    """(median per-token time, mean total context, median tokens) over the batch's steady window.

    The window opens at the last request's first token (every prompt is prefilled: the batch is pure
    decode) and closes at the first request's last token (until then it holds all B requests); it is then
    narrowed to its longest stretch clear of the ``exclude`` intervals (other batches' bursts). Per request,
    the time between its first and last event inside the window, over the tokens in between, is its TPOT;
    the first event inside is skipped, in case it was produced by a step that still held prefill work and
    reached the client late. Context: the step producing a request's k-th token holds prompt + k - 2 tokens
    of KV (the prompt and the outputs before the one it consumes).
    """
    if any(not t.events for t in traces):
        raise RequestFailed("a stream returned no tokens")
    if any(t.events[-1][0] <= t.events[0][0] for t in traces):
        # Not a sign of a capped batch (a batch of one has the same): the client or the engine's API server
        # fell behind and read the whole answer at once. The sample says nothing; the batch size stays.
        raise RequestFailed("a stream's tokens all arrived at once: no per-token time")
    t_start = max(t.events[0][0] for t in traces)
    t_end = min(t.events[-1][0] for t in traces)
    if t_end <= t_start:
        raise NoSteadyWindow("no steady window: some requests started only after others finished")
    t_start, t_end = _largest_gap(t_start, t_end, exclude)
    tpots: list[float] = []
    context = 0.0
    counts: list[int] = []
    for trace in traces:
        cum = np.cumsum([n for _, n in trace.events])
        inside = [i for i, (t, _) in enumerate(trace.events) if t_start < t < t_end]
        if len(inside) < 3:
            raise RequestFailed(f"steady window too short ({len(inside)} events)")
        a, z = inside[1], inside[-1]
        tokens = int(cum[z] - cum[a])
        if tokens < MIN_WINDOW_TOKENS:
            raise RequestFailed(f"steady window too short ({tokens} tokens)")
        span_s = trace.events[z][0] - trace.events[a][0]
        if span_s <= 0:
            # The tokens were read in one chunk: the client or the engine's API server fell behind, so their
            # arrival times say nothing of the engine's step time.
            raise RequestFailed(f"{tokens} tokens arrived at once: no per-token time")
        tpots.append(span_s / tokens)
        context += prompt_tokens + (int(cum[a]) + 1 + int(cum[z])) / 2 - 2
        counts.append(tokens)
    return statistics.median(tpots), context, int(statistics.median(counts))
