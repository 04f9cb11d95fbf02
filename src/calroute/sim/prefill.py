"""A prefill engine: FCFS queue, iterations that batch prompt tokens under a token budget (a prompt larger
than what is left of the budget is chunked across iterations), and a KV budget: a prompt's KV is held from
its first chunk until the decode engine has pulled it, and the head of the queue waits when KV is full.
A prompt's leading blocks found in the engine's prefix cache (kvcache/pool.py, vLLM's block pool) are not
computed; the blocks each iteration fills are cached when it is scheduled, as vLLM caches them, and
announced when it ends (cache_events.py)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from calroute.costmodel.calibration import PrefillCurve
from calroute.kvcache.pool import BlockPool, RequestBlocks
from calroute.sim.cache_events import CacheEvents, CacheListener
from calroute.sim.kernel import URGENT, Kernel
from calroute.sim.requests import SimRequest
from calroute.sim.sampling import HeldMetrics, ReadHorizon, Sample
from calroute.types import InstanceState, Role


class PrefillInstance:
    def __init__(
        self,
        instance_id: str,
        kernel: Kernel,
        curve: PrefillCurve,
        kv_capacity_tokens: int,
        max_batched_tokens: int,
        on_prefill_done: Callable[[SimRequest], None],
        sample_interval_s: float = 0.05,
        block_tokens: int = 512,
        horizon: ReadHorizon | None = None,
        cache_listener: CacheListener | None = None,
    ) -> None:
        self.instance_id = instance_id
        self._kernel = kernel
        self._curve = curve
        self.kv_capacity_tokens = kv_capacity_tokens
        self._budget = max_batched_tokens
        self._on_done = on_prefill_done
        self._queue: deque[SimRequest] = deque()
        self._busy = False
        self._batch_size = 0
        self.peak_kv_used_tokens = 0
        self.metrics = HeldMetrics(sample_interval_s, self._metrics_at, horizon)
        self._events = None if cache_listener is None else CacheEvents(cache_listener, buffering=True)
        self.pool = BlockPool(kv_capacity_tokens, block_tokens, self._events)

    @property
    def kv_used_tokens(self) -> int:
        return self.pool.used_tokens

    def enqueue(self, req: SimRequest) -> None:
        self.metrics.touch(self._kernel.now_s)
        req.prefill_left_tokens = req.prompt_tokens
        self._queue.append(req)
        if not self._busy:
            self._start_iteration()

    def release_kv(self, req: SimRequest) -> None:
        """The decode engine pulled (or gave up on) this request's KV."""
        if req.prefill_kv_held:
            self.metrics.touch(self._kernel.now_s)
            req.prefill_kv_held = False
            rb = req.prefill_kv
            if rb is not None:
                self.pool.free(rb)
                req.prefill_kv = None
            if not self._busy and self._queue:
                self._start_iteration()

    def _start_iteration(self) -> None:
        budget = self._budget
        tokens = 0
        attn = 0.0
        batch: list[tuple[SimRequest, int]] = []
        pool = self.pool
        block_tokens = pool.block_tokens
        for req in self._queue:
            blocks = req.prefix_blocks
            if not req.prefill_kv_held:
                # vLLM looks its prefix cache up when it first schedules a request
                hit = pool.lookup(blocks, req.prompt_tokens) if blocks else 0
                cached = hit * block_tokens
                fresh = RequestBlocks()
                if not pool.admit(fresh, blocks, hit, req.prompt_tokens - cached, req.prompt_tokens):
                    break  # FCFS: the head waits for KV rather than being overtaken
                req.prefill_kv = fresh
                req.prefill_kv_held = True
                req.cached_prefill_tokens = cached
                req.prefill_left_tokens = req.prompt_tokens - cached
                if pool.used_tokens > self.peak_kv_used_tokens:
                    self.peak_kv_used_tokens = pool.used_tokens
            chunk = min(req.prefill_left_tokens, budget)
            done_before = req.prompt_tokens - req.prefill_left_tokens
            held = req.prefill_kv
            if blocks and held is not None:
                # cached as scheduled: a request scheduled later (or after it in this batch) hits them
                pool.cache(held, blocks, (done_before + chunk) // block_tokens)
            attn += chunk * (done_before + chunk / 2)
            tokens += chunk
            budget -= chunk
            batch.append((req, chunk))
            if budget == 0:
                break
        if not batch:
            self._busy = False
            return
        c = self._curve
        duration = c.base_s + c.per_token_s * tokens + c.attn_s_per_token2 * attn
        self._busy = True
        self._batch_size = len(batch)
        self._kernel.at(self._kernel.now_s + duration, self._end_iteration, batch, URGENT)

    def _end_iteration(self, batch: list[tuple[SimRequest, int]]) -> None:
        now = self._kernel.now_s
        self.metrics.touch(now)
        if self._events is not None:
            self._events.flush()  # the step's events, published after it as vLLM's engine core does
        for req, chunk in batch:
            req.prefill_left_tokens -= chunk
            if req.prefill_left_tokens == 0:
                # Finished requests are at the head, in order: the batch was taken from the head.
                self._queue.popleft()
                req.prefill_done_s = now
                self._on_done(req)
        self._busy = False
        self._batch_size = 0
        if self._queue:
            self._start_iteration()

    def true_state(
        self, tau_pre_s: float, blocks: tuple[int, ...], prompt_tokens: int, reuse: float
    ) -> InstanceState:
        """This engine as it is now, for a request with these blocks (the clairvoyant policy's view): the
        prompt tokens it has still to compute, priced at the hardware's ``tau_pre_s`` (a queued prompt hits
        what is cached and what the prompts ahead of it will cache), the KV it holds and will hold, and the
        hits this request would get behind them all."""
        pool = self.pool
        b = pool.block_tokens
        coming: set[int] = set()
        left = 0
        pending_kv = 0
        for req in self._queue:
            if req.prefill_kv_held:
                left += req.prefill_left_tokens
            else:
                pending_kv += req.prompt_tokens
                hits = (
                    pool.lookup_ahead(req.prefix_blocks, req.prompt_tokens, coming) * b
                    if req.prefix_blocks
                    else 0
                )
                left += req.prompt_tokens - hits
            coming.update(req.prefix_blocks)
        cached = pool.lookup_ahead(blocks, prompt_tokens, coming) * b if blocks else 0
        n = len(self._queue)
        return InstanceState(
            self.instance_id,
            Role.PREFILL,
            True,
            n,
            left * tau_pre_s,
            self.kv_used_tokens + pending_kv,
            self.kv_used_tokens,
            self.kv_capacity_tokens,
            self._batch_size,
            n - self._batch_size,
            0.0,
            cached,
            reuse,
        )

    def _metrics_at(self, t: float) -> Sample:
        return Sample(t, self.kv_used_tokens, self._batch_size, len(self._queue) - self._batch_size)
