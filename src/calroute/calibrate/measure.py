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
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from calroute.calibrate.client import EngineClient, NoSteadyWindow, RequestFailed
from calroute.calibrate.plan import MIN_PROMPT_TOKENS, DecodeItem, decode_plan, prefill_ladder, steady_window
from calroute.cluster.file import ClusterEngine, ClusterFile
from calroute.costmodel.calibration import REF_PROMPT_TOKENS, PrefillCurve
from calroute.errors import CalibrationError

Progress = Callable[[str], None]

MIN_PREFILL_ROUNDS = 2  # so every prompt length has a repeat even when one round eats the budget
MAX_PREFILL_ROUNDS = 6
HANDOFF_OUTPUT_TOKENS = 2

MAX_DECODE_PASSES = 2
NO_WINDOW_STRIKES = 2  # batches of one size without a steady window before the size counts as capped
# Streams open at once across all decode engines. Emulated engines of one cluster usually share a process
# and an event loop: several batches of 64 streaming at once would overload it, and its steps would
# stretch by the time it spends writing tokens, which the fit would then read as per-sequence cost.
MAX_CONCURRENT_STREAMS = 64
# A burst's effect on the shared event loop outlasts the last response header by the engine's next
# admission (hashing the new prompts' blocks); this margin covers it.
BURST_MARGIN_S = 0.05
BURST_MAX_WAIT_S = 3.0  # a batch waits at most this long for other batches' windows to close
BURST_POLL_S = 0.005
WARMUP_TIMEOUT_S = 90.0  # a cold NIXL pair has been seen to take ~30 s on the CPU build
MIN_REQUEST_TIMEOUT_S = 10.0


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
    gives no steady window; after NO_WINDOW_STRIKES such batches of one size, it and larger ones are
    skipped. One is not enough: an engine's API server that stalls can deliver one stream's tokens in a
    bunch before the next stream's first, which reads the same once (seen on real CPU vLLM)."""
    dec = cluster.decode
    kv = min(e.kv_capacity_tokens for e in dec)
    plan = decode_plan(kv, cluster.max_model_len)
    if not plan:
        raise CalibrationError(f"decode engines' KV ({kv} tokens) is too small for the decode sweep")
    queue: deque[DecodeItem] = deque(plan * MAX_DECODE_PASSES)
    samples: list[DecodeMeasurement] = []
    failures: list[str] = []
    too_big: list[int] = []  # batch sizes that found no steady window NO_WINDOW_STRIKES times
    no_window: dict[int, int] = {}
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
                no_window[item.batch] = no_window.get(item.batch, 0) + 1
                if no_window[item.batch] >= NO_WINDOW_STRIKES:
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
