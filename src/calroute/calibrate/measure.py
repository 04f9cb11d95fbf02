"""Measurements against a live cluster, over the same HTTP surface the router uses (aiohttp client).

A warm-up and two sweeps, each bounded in time:

* **prefill + handoff**: unloaded single requests (``max_tokens=1``, ``kv_transfer_params.do_remote_decode``:
  the real P/D prefill path) at prompt lengths spread geometrically, on every prefill engine; latency is
  the client-observed request time, HTTP overhead included, because that is what the router waits for.
  Each prefill is followed at once by its decode half on an idle decode engine (streaming, the returned
  ``kv_transfer_params``): the decode engine's TTFT is the transfer time plus one decode step, so the same
  requests give the transfer samples, and the prefill engine's held KV is released instead of lingering
  until its lease expires.
* **decode**: B concurrent streaming requests (``ignore_eos``, exact lengths) straight to a decode engine,
  which prefills them itself. Per-token time is read over the *steady window*: after the last request's
  first token (no prefill left in the batch) and before the first request's last token (the batch is
  still B). Two prompt lengths per B, so context varies independently of the batch size.
* **warm-up**: one request per engine and one handoff per prefill x decode pair before anything is
  measured, because the first transfer over a cold pair can be anomalous (the paper's protocol, IV-B).

Prompts are random token ids, unique per request, so no request hits the prefix cache.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

from calroute.cluster import ClusterEngine, ClusterFile
from calroute.costmodel.calibration import REF_PROMPT_TOKENS, PrefillCurve
from calroute.errors import CalibrationError
from calroute.proxy.pd import PREFILL_KV_PARAMS

Progress = Callable[[str], None]

# Prompt token ids: the emulator accepts [3, 4096) (0-2 are special); real models' vocabularies are larger,
# but the tiny test model's is ~2k, so other clusters get a range every tokenizer accepts.
EMULATED_TOKEN_IDS = (3, 4096)
DEFAULT_TOKEN_IDS = (10, 1000)

MIN_PROMPT_TOKENS = 64
MAX_PROMPT_TOKENS = 4096
PREFILL_LADDER_POINTS = 8
MIN_PREFILL_ROUNDS = 2  # so every prompt length has a repeat even when one round eats the budget
MAX_PREFILL_ROUNDS = 6
HANDOFF_OUTPUT_TOKENS = 2

# The batch ladder 1, 2, 4, ..., 64 in the order it is measured: the corners of the (batch, context) plane
# first, then the middle, so a short budget still brackets the reference point (32 sequences) instead of
# stopping halfway up the ladder.
DECODE_BATCH_PRIORITY = (1, 32, 64, 8, 2, 16, 4)
DECODE_SHORT_PROMPT = 128
DECODE_LONG_PROMPT_MAX = 2048
MAX_DECODE_PASSES = 2
# Streams open at once across all decode engines. Emulated engines of one cluster usually share a process
# and an event loop: several batches of 64 streaming at once would overload it, and its steps would
# stretch by the time it spends writing tokens, which the fit would then read as per-sequence cost.
MAX_CONCURRENT_STREAMS = 64
STEADY_WINDOW_TOKENS = 32  # decode steps wanted inside the steady window, per request
MIN_WINDOW_TOKENS = 8  # fewer than this and the sample is dropped
# A burst's effect on the shared event loop outlasts the last response header by the engine's next
# admission (hashing the new prompts' blocks); this margin covers it.
BURST_MARGIN_S = 0.05
BURST_MAX_WAIT_S = 3.0  # a batch waits at most this long for other batches' windows to close
BURST_POLL_S = 0.005
# The engine's per-iteration prefill token budget is not advertised; assuming a small one overestimates how
# long the prompts' prefill staggers the requests' starts, which only costs a few extra tokens.
PREFILL_CHUNK_GUESS = 2048
KV_FILL = 0.9  # use at most this fraction of an engine's KV (vLLM keeps a watermark, blocks round up)

WARMUP_TIMEOUT_S = 90.0  # a cold NIXL pair has been seen to take ~30 s on the CPU build
MIN_REQUEST_TIMEOUT_S = 10.0


class RequestFailed(Exception):
    """One measurement request failed; the sweep drops that sample and carries on."""


class NoSteadyWindow(RequestFailed):
    """A batch's requests never all ran at once: the engine caps concurrent sequences below the batch."""


@dataclass(frozen=True)
class PrefillMeasurement:
    engine_id: str
    prompt_tokens: int
    latency_s: float


@dataclass(frozen=True)
class HandoffMeasurement:
    prefill_id: str
    decode_id: str
    prompt_tokens: int
    decode_ttft_s: float  # transfer + one decode step (+ the wait for a step boundary, 0 when idle)


@dataclass(frozen=True)
class DecodeMeasurement:
    engine_id: str
    batch: int
    prompt_tokens: int
    output_tokens: int
    context_tokens: float  # total context in the batch over the steady window (mean)
    tpot_s: float  # median over the requests of each one's mean per-token time in the window
    window_tokens: int  # median tokens per request inside the window


@dataclass
class StreamTrace:
    """A streaming response as the client saw it: when each SSE event arrived and how many tokens it held."""

    sent_s: float
    events: list[tuple[float, int]] = field(default_factory=list)

    @property
    def first_token_s(self) -> float:
        return self.events[0][0] - self.sent_s


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


_LABEL = re.compile(r'(\w+)="([^"]*)"')


def kv_bytes_from_metrics(text: str) -> int | None:
    """KV bytes per token from vLLM's ``vllm:cache_config_info`` labels (memory / (blocks x block size)).

    None when the labels are missing or the engine sized its KV by memory fraction (no byte count).
    Blocks are whole, so this can overstate the true figure by under one block's share.
    """
    for line in text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            labels = dict(_LABEL.findall(line))
            try:
                n_bytes = int(labels["kv_cache_memory_bytes"])
                tokens = int(labels["num_gpu_blocks"]) * int(labels["block_size"])
            except (KeyError, ValueError):
                return None
            return round(n_bytes / tokens) if tokens > 0 and n_bytes > 0 else None
    return None


class EngineClient:
    """Measurement requests to one cluster's engines (the model name, token ids, headers, timeouts)."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        model: str,
        token_ids: tuple[int, int],
        seed: int,
        api_key: str | None = None,
    ) -> None:
        self._session = session
        self._model = model
        self._lo, self._hi = token_ids
        self._rng = np.random.default_rng(seed)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def prompt(self, tokens: int) -> list[int]:
        return [int(i) for i in self._rng.integers(self._lo, self._hi, size=tokens)]

    async def get_text(self, url: str, timeout_s: float) -> str:
        try:
            async with self._session.get(
                url, headers=self._headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as r:
                if r.status != 200:
                    raise RequestFailed(f"GET {url}: HTTP {r.status}")
                return await r.text()
        except (aiohttp.ClientError, TimeoutError) as e:
            raise RequestFailed(f"GET {url}: {type(e).__name__}: {e}") from e

    async def prefill(self, url: str, prompt: list[int], timeout_s: float) -> tuple[float, dict[str, Any]]:
        """(client-observed latency, kv_transfer_params) of a P/D prefill request."""
        body = {
            "model": self._model,
            "prompt": prompt,
            "max_tokens": 1,
            "temperature": 0,
            "kv_transfer_params": dict(PREFILL_KV_PARAMS),
        }
        sent = time.perf_counter()
        try:
            async with self._session.post(
                f"{url}/v1/completions",
                json=body,
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as r:
                payload = await r.read()
                done = time.perf_counter()
                status = r.status
        except (aiohttp.ClientError, TimeoutError) as e:
            raise RequestFailed(f"prefill on {url}: {type(e).__name__}: {e}") from e
        if status != 200:
            raise RequestFailed(f"prefill on {url}: HTTP {status}: {payload[:300]!r}")
        try:
            kv = json.loads(payload).get("kv_transfer_params")
        except (ValueError, AttributeError) as e:
            raise RequestFailed(f"prefill on {url}: not a completion object: {payload[:300]!r}") from e
        if not isinstance(kv, dict):
            raise RequestFailed(f"prefill on {url} returned no kv_transfer_params (is a KV connector set?)")
        return done - sent, kv

    async def stream(
        self,
        url: str,
        prompt: list[int],
        max_tokens: int,
        timeout_s: float,
        kv_transfer_params: dict[str, Any] | None = None,
        on_event: Callable[[str], None] | None = None,
    ) -> StreamTrace:
        """A streaming completion with exactly ``max_tokens`` tokens; events are parsed after the stream
        ends, so the client does as little as possible between receiving one chunk and the next.

        ``on_event`` hears "headers" (the engine has parsed and queued the request), "first" (the first
        chunk arrived) and "done" (the stream ended, also on failure).
        """
        hook = on_event or _no_event
        body: dict[str, Any] = {
            "model": self._model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "return_token_ids": True,
        }
        if kv_transfer_params is not None:
            body["kv_transfer_params"] = kv_transfer_params
        chunks: list[tuple[float, bytes]] = []
        sent = time.perf_counter()
        try:
            async with self._session.post(
                f"{url}/v1/completions",
                json=body,
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as r:
                hook("headers")
                if r.status != 200:
                    raise RequestFailed(f"stream on {url}: HTTP {r.status}: {(await r.read())[:300]!r}")
                async for data in r.content.iter_any():
                    chunks.append((time.perf_counter(), data))
                    if len(chunks) == 1:
                        hook("first")
        except (aiohttp.ClientError, TimeoutError) as e:
            raise RequestFailed(f"stream on {url}: {type(e).__name__}: {e}") from e
        finally:
            hook("done")
        trace = StreamTrace(sent)
        buffer = b""
        for t, data in chunks:
            buffer += data
            *complete, buffer = buffer.split(b"\n\n")
            for event in complete:
                n = _event_tokens(event, url)
                if n:
                    trace.events.append((t, n))
        total = sum(n for _, n in trace.events)
        if total != max_tokens:
            raise RequestFailed(f"stream on {url}: expected {max_tokens} tokens, got {total}")
        return trace


def _no_event(event: str) -> None:
    pass


def _event_tokens(event: bytes, url: str) -> int:
    """Tokens carried by one SSE event (0 for [DONE] and usage-only events)."""
    for line in event.split(b"\n"):
        if not line.startswith(b"data: "):
            continue
        data = line[6:].strip()
        if data == b"[DONE]":
            return 0
        try:
            obj = json.loads(data)
        except ValueError as e:
            raise RequestFailed(f"stream on {url}: an event is not JSON: {data[:300]!r}") from e
        if not isinstance(obj, dict):
            raise RequestFailed(f"stream on {url}: an event is not a JSON object: {data[:300]!r}")
        if "error" in obj:
            raise RequestFailed(f"stream on {url}: {obj['error']}")
        choices = obj.get("choices") or []
        if not choices:
            return 0
        ids = choices[0].get("token_ids")
        if ids is None:
            raise RequestFailed(f"stream on {url}: the engine ignores return_token_ids")
        return len(ids)
    return 0


# ---- warm-up ---------------------------------------------------------------------------------------------


async def warm_up(client: EngineClient, cluster: ClusterFile, progress: Progress) -> None:
    """One request per engine, then one handoff per prefill x decode pair. A failed pass is tried once more
    (a fresh CPU vLLM engine has answered its first handoff with a 500); a second failure is fatal."""

    async def plain(e: ClusterEngine) -> None:
        await client.stream(e.url, client.prompt(32), 2, WARMUP_TIMEOUT_S)

    async def pair(p: ClusterEngine, d: ClusterEngine) -> None:
        prompt = client.prompt(MIN_PROMPT_TOKENS)
        _, kv = await client.prefill(p.url, prompt, WARMUP_TIMEOUT_S)
        await client.stream(d.url, prompt, HANDOFF_OUTPUT_TOKENS, WARMUP_TIMEOUT_S, kv)

    started = time.perf_counter()
    for attempt in (1, 2):
        try:
            await asyncio.gather(*(plain(e) for e in cluster.engines))
            pre, dec = cluster.prefill, cluster.decode
            for r in range(len(dec)):  # rounds of disjoint pairs (when P <= D) so rounds run concurrently
                await asyncio.gather(*(pair(p, dec[(i + r) % len(dec)]) for i, p in enumerate(pre)))
            break
        except RequestFailed as e:
            if attempt == 2:
                raise CalibrationError(f"warm-up failed twice: {e}") from e
            progress(f"warm-up: {e}; trying once more")
    progress(
        f"warm-up: {len(cluster.engines)} engines and {len(pre) * len(dec)} prefill x decode pairs "
        f"in {time.perf_counter() - started:.1f} s"
    )


# ---- prefill and handoff -----------------------------------------------------------------------------


async def prefill_sweep(
    client: EngineClient, cluster: ClusterFile, budget_s: float, progress: Progress
) -> tuple[list[PrefillMeasurement], list[HandoffMeasurement]]:
    """Rounds over the prompt ladder on every prefill engine, each prefill followed by its handoff.

    Chains run concurrently, one per decode engine they use, so no decode engine sees two handoffs at once
    and no prefill engine two prefills; a chain's decode engine rotates between rounds. Rounds repeat while
    another one fits in the budget (the first MIN_PREFILL_ROUNDS always run).
    """
    ladder = prefill_ladder(cluster.max_model_len)
    if ladder[-1] < REF_PROMPT_TOKENS:
        progress(
            f"prefill: prompts stop at {ladder[-1]} tokens (max_model_len {cluster.max_model_len}): tau_pre, "
            f"read at {REF_PROMPT_TOKENS}, is extrapolated"
        )
    pre, dec = cluster.prefill, cluster.decode
    n_chains = min(len(pre), len(dec))
    prefills: list[PrefillMeasurement] = []
    handoffs: list[HandoffMeasurement] = []
    failures: list[str] = []
    order_rng = np.random.default_rng(len(ladder))
    started = time.perf_counter()

    async def chain(c: int, round_no: int, lengths: list[int]) -> None:
        d = dec[(c + round_no * n_chains) % len(dec)]
        for p_tokens in lengths:
            for p in pre[c::n_chains]:
                prompt = client.prompt(p_tokens)
                timeout_s = max(MIN_REQUEST_TIMEOUT_S, budget_s)
                try:
                    latency_s, kv = await client.prefill(p.url, prompt, timeout_s)
                    prefills.append(PrefillMeasurement(p.id, p_tokens, latency_s))
                    trace = await client.stream(d.url, prompt, HANDOFF_OUTPUT_TOKENS, timeout_s, kv)
                    handoffs.append(HandoffMeasurement(p.id, d.id, p_tokens, trace.first_token_s))
                except RequestFailed as e:
                    failures.append(str(e))

    rounds = 0
    while rounds < MAX_PREFILL_ROUNDS:
        round_started = time.perf_counter()
        lengths = [int(x) for x in order_rng.permutation(ladder)]
        await asyncio.gather(*(chain(c, rounds, lengths) for c in range(n_chains)))
        rounds += 1
        now = time.perf_counter()
        progress(
            f"prefill: round {rounds}: {len(prefills)} prefill and {len(handoffs)} handoff samples "
            f"({now - started:.1f} s)"
        )
        if rounds >= MIN_PREFILL_ROUNDS and now - started + (now - round_started) > budget_s:
            break
    for message in failures[:3]:
        progress(f"prefill: dropped a sample: {message}")
    return prefills, handoffs


# ---- decode -------------------------------------------------------------------------------------------


class BurstGuard:
    """Keeps the bursts of work at a batch's start and end out of other batches' steady windows.

    The emulated engines of a cluster usually share one process and event loop, and parsing a burst of B
    long prompts (or freeing B finished requests) stalls it for tens of milliseconds: a decode step in
    progress on another engine stretches by as much, which would read as a slower step. A batch waits to
    send its requests while another batch's window is open, and every batch records its bursts so that
    the windows that overlap one anyway are narrowed around it. On separate machines this costs nothing.
    """

    def __init__(self) -> None:
        self.bursts: list[tuple[float, float]] = []
        self._open_windows = 0

    async def before_burst(self, max_wait_s: float) -> None:
        deadline = time.perf_counter() + max_wait_s
        while self._open_windows and time.perf_counter() < deadline:
            await asyncio.sleep(BURST_POLL_S)

    @property
    def open_windows(self) -> int:
        return self._open_windows

    def window_opened(self) -> None:
        self._open_windows += 1

    def window_closed(self) -> None:
        self._open_windows -= 1


@dataclass
class _BatchEvents:
    """Turns a batch's stream events into burst intervals and the open/closed state of its window."""

    batch: int
    guard: BurstGuard
    started_s: float = field(default_factory=time.perf_counter)
    headers: int = 0
    firsts: int = 0
    done: int = 0
    first_done_s: float = 0.0
    window: str = "pending"  # pending -> open -> closed, or pending -> closed (no window)

    def __call__(self, event: str) -> None:
        now = time.perf_counter()
        if event == "headers":
            self.headers += 1
            if self.headers == self.batch:
                self.guard.bursts.append((self.started_s, now + BURST_MARGIN_S))
        elif event == "first":
            self.firsts += 1
            if self.firsts == self.batch and self.window == "pending":
                self.window = "open"
                self.guard.window_opened()
        elif event == "done":
            self.done += 1
            if self.done == 1:
                self.first_done_s = now
                if self.window == "open":
                    self.guard.window_closed()
                self.window = "closed"
            if self.done == self.batch:
                self.guard.bursts.append((self.first_done_s, now + BURST_MARGIN_S))


async def measure_decode_item(
    client: EngineClient, engine: ClusterEngine, item: DecodeItem, timeout_s: float, guard: BurstGuard
) -> DecodeMeasurement:
    await guard.before_burst(BURST_MAX_WAIT_S)
    events = _BatchEvents(item.batch, guard)
    traces = await asyncio.gather(
        *(
            client.stream(
                engine.url,
                client.prompt(item.prompt_tokens),
                item.output_tokens,
                timeout_s,
                on_event=events,
            )
            for _ in range(item.batch)
        )
    )
    tpot_s, context, window = steady_window(traces, item.prompt_tokens, guard.bursts)
    return DecodeMeasurement(
        engine.id, item.batch, item.prompt_tokens, item.output_tokens, context, tpot_s, window
    )


class _StreamSlots:
    """A counting limit on open streams, taken and given back a batch at a time."""

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._open = 0
        self._changed = asyncio.Condition()

    def _fits(self, n: int) -> bool:
        return self._open + n <= self._cap

    async def acquire(self, n: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self._fits(n))
            self._open += n

    async def release(self, n: int) -> None:
        async with self._changed:
            self._open -= n
            self._changed.notify_all()


async def decode_sweep(
    client: EngineClient,
    cluster: ClusterFile,
    prefill: PrefillCurve,
    budget_s: float,
    progress: Progress,
) -> list[DecodeMeasurement]:
    """Work items (batch x prompt length, in ``DECODE_BATCH_PRIORITY`` order, repeated up to
    ``MAX_DECODE_PASSES`` times) shared by one worker per decode engine, with at most
    ``MAX_CONCURRENT_STREAMS`` streams open at once. A worker skips an item whose estimated duration (its
    prompts' prefill from the fitted curve, its tokens at a pessimistic step time) no longer fits in the
    budget. A batch size whose requests do not all run at once (the engine caps concurrent sequences)
    gives no steady window; larger ones are then skipped."""
    dec = cluster.decode
    kv = min(e.kv_capacity_tokens for e in dec)
    plan = decode_plan(kv, cluster.max_model_len)
    if not plan:
        raise CalibrationError(f"decode engines' KV ({kv} tokens) is too small for the decode sweep")
    queue: deque[DecodeItem] = deque(plan * MAX_DECODE_PASSES)
    samples: list[DecodeMeasurement] = []
    failures: list[str] = []
    too_big: list[int] = []  # batch sizes that found no steady window
    step_guess = [2 * prefill.single_s(1)]  # no decode measurement yet: a pessimistic step time
    slots = _StreamSlots(max(MAX_CONCURRENT_STREAMS, max(item.batch for item in plan)))
    guard = BurstGuard()
    deadline = time.perf_counter() + budget_s

    def runnable(item: DecodeItem) -> bool:
        if too_big and item.batch >= min(too_big):
            return False
        estimate_s = item.batch * prefill.single_s(item.prompt_tokens) + item.output_tokens * step_guess[0]
        return estimate_s <= deadline - time.perf_counter()

    async def worker(engine: ClusterEngine) -> None:
        while queue:
            item = queue.popleft()
            if not runnable(item):
                continue
            await slots.acquire(item.batch)
            try:
                if not runnable(item):  # waiting for slots took time
                    continue
                timeout_s = max(MIN_REQUEST_TIMEOUT_S, deadline - time.perf_counter())
                s = await measure_decode_item(client, engine, item, timeout_s, guard)
            except NoSteadyWindow as e:
                failures.append(f"B={item.batch} prompt={item.prompt_tokens}: {e}")
                too_big.append(item.batch)
                continue
            except RequestFailed as e:
                failures.append(f"B={item.batch} prompt={item.prompt_tokens}: {e}")
                continue
            finally:
                await slots.release(item.batch)
            samples.append(s)
            step_guess[0] = max(step_guess[0], 1.5 * s.tpot_s)
            progress(
                f"decode: {engine.id} B={s.batch:<3d} prompt={s.prompt_tokens:<5d} "
                f"TPOT {1e3 * s.tpot_s:.2f} ms over {s.window_tokens} tokens"
            )

    await asyncio.gather(*(worker(e) for e in dec))
    for message in failures[:5]:
        progress(f"decode: dropped a sample: {message}")
    return samples
