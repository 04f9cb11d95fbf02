"""A decode engine: continuous batching with a KV budget, advanced in closed form between events.

Between two events the batch is fixed, so step k takes a + b*B + c*(C0 + B*(k-1)) seconds (C0: context
tokens at the stretch start, growing by B per step) and k steps take an arithmetic series. The engine
schedules one event at the next *boundary that matters*: the earliest completion, the step at which KV
would overflow, or (when something new is waiting) the end of the step in progress.

At each boundary, in vLLM's order: finished requests leave; requests whose KV arrived join; if the next
step would not fit in KV, the most recently joined requests are preempted (freed, requeued at the front,
recomputed on rejoining); then waiting requests are admitted while KV (minus a watermark) and the
sequence limit allow: their KV is reserved and pulled from the prefill engine (latency + bytes/bandwidth),
after which they join at the next boundary. Only the prompt's blocks that the engine's own prefix cache
lacks are pulled (vLLM's NixlConnector asks for the tokens past the local cache hit: pull_scheduler.py
``get_num_new_matched_tokens``), and the pulled blocks are cached when the pull is done.

A request routed here alone (RouteDecision.local) is prefilled here: admitted as above from its arrival, it
joins at once, and the prompt past its local hit is computed in the stretch's first step, priced by the
calibrated prefill curve's per-token and attention terms (the step's base is the decode step's), as a
preempted request's recompute is. vLLM V1 splits such a prefill into chunks under its token budget, mixed with
the running streams' decode steps; folded into one step, the streams lose the same time in all and emit the
same tokens by its end, but their longest gap between two tokens is the whole prefill, not one chunk.

KV in use is the engine's pool (kvcache/pool.py: the prompts, a shared block once) plus its streams' output
tokens, counted in closed form (``_out_tokens``). The pool's free cached blocks live in the room both leave.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

from calroute.costmodel.calibration import DecodeCurve, PrefillCurve
from calroute.costmodel.profiles import EngineLimits
from calroute.kvcache.pool import BlockPool, RequestBlocks
from calroute.routing.heap import Entry, MinHeap
from calroute.sim.cache_events import CacheEvents, CacheListener
from calroute.sim.kernel import URGENT, Kernel
from calroute.sim.requests import SimRequest
from calroute.sim.sampling import HeldMetrics, ReadHorizon, Sample
from calroute.types import InstanceState, Role


class DecodeInstance:
    def __init__(
        self,
        instance_id: str,
        kernel: Kernel,
        curve: DecodeCurve,
        recompute_curve: PrefillCurve,
        transfer_s: Callable[[int], float],
        limits: EngineLimits,
        on_pulled: Callable[[SimRequest], None],
        on_first_tokens: Callable[[float, list[SimRequest]], None],
        on_done: Callable[[SimRequest], None],
        max_stretch_steps: int | None = None,
        sample_interval_s: float = 0.05,
        block_tokens: int = 512,
        horizon: ReadHorizon | None = None,
        cache_listener: CacheListener | None = None,
    ) -> None:
        """``max_stretch_steps=1`` makes this an iteration-level model (one event per step): the baseline
        the closed form is benchmarked and tested against."""
        self.instance_id = instance_id
        self._kernel = kernel
        self._a, self._b, self._c = curve.base_s, curve.per_seq_s, curve.per_ctx_token_s
        self._recompute = recompute_curve
        self._transfer_s = transfer_s
        self.kv_capacity_tokens = limits.kv_capacity_tokens
        self._admit_limit = int(limits.kv_capacity_tokens * (1.0 - limits.kv_watermark_frac))
        self._max_seqs = limits.max_num_seqs
        self._on_pulled = on_pulled
        self._on_first_tokens = on_first_tokens
        self._on_done = on_done
        self._max_stretch = max_stretch_steps or 1 << 62

        self._waiting: deque[SimRequest] = deque()
        self._joiners: list[SimRequest] = []
        self._transferring = 0
        self._running: dict[int, SimRequest] = {}
        self._join_stack: list[int] = []  # join orders, newest last (lazy: finished ones are skipped)
        self._finish_heap = MinHeap()  # keyed by finish step, ordered by join order
        self._next_order = 0
        self._fresh: list[SimRequest] = []  # joined, first token not yet scheduled
        self._prompt_sum = 0
        self._join_sum = 0
        # the current stretch
        self._steps = 0
        self._epoch_s = 0.0
        self._extra_s = 0.0  # recompute time folded into the stretch's first step
        self._step0_s = 0.0  # a + b*B + c*C0
        self._growth_s = 0.0  # c*B: how much each step is slower than the previous one
        self._version = 0
        self._planned_s = math.inf
        self.peak_kv_used_tokens = 0
        self.preemptions = 0
        self.metrics = HeldMetrics(sample_interval_s, self._metrics_at, horizon)
        self.pool = BlockPool(
            limits.kv_capacity_tokens,
            block_tokens,
            None if cache_listener is None else CacheEvents(cache_listener),
        )
        # bound once: each `self._on_event` would build a new bound-method object per scheduled event
        self._on_event_cb: Callable[[tuple[int, int]], None] = self._on_event
        self._transfer_done_cb: Callable[[SimRequest], None] = self._transfer_done

    # ---- closed-form stretch ------------------------------------------------------------------------

    def _elapsed_s(self, k: int) -> float:
        """Time from the stretch start to the end of its k-th step."""
        if k <= 0:
            return 0.0
        return self._extra_s + k * self._step0_s + self._growth_s * k * (k - 1) / 2

    def _steps_at(self, now_s: float) -> int:
        """Whole steps of the current stretch completed by ``now_s``.

        _elapsed_s is inlined in the two correction loops (same expression, same float order): this runs
        at every poke and metrics probe.
        """
        epoch, extra, a, g = self._epoch_s, self._extra_s, self._step0_s, self._growth_s
        d = now_s - epoch - extra
        if d < a:
            return 0
        if g > 0:
            lin = a - g / 2
            k = int((-lin + math.sqrt(lin * lin + 2 * g * d)) / g)
        else:
            k = int(d / a)
        elapsed = now_s - epoch
        j = k + 1
        while (extra + j * a + g * j * (j - 1) / 2 if j > 0 else 0.0) <= elapsed:
            k = j
            j = k + 1
        while k > 0 and extra + k * a + g * k * (k - 1) / 2 > elapsed:
            k -= 1
        return k

    # ---- arrivals -----------------------------------------------------------------------------------

    def enqueue(self, req: SimRequest) -> None:
        """A request whose prefill is done asks this engine to pull its KV and decode it; a local one, to
        prefill it too."""
        self.metrics.touch(self._kernel.now_s)
        self._waiting.append(req)
        self._poke()

    def _transfer_done(self, req: SimRequest) -> None:
        self.metrics.touch(self._kernel.now_s)
        self._transferring -= 1
        rb = req.decode_kv
        if req.prefix_blocks and rb is not None:
            self.pool.cache(rb, req.prefix_blocks, len(req.prefix_blocks))  # vLLM: delay_cache_blocks
        self._joiners.append(req)
        self._on_pulled(req)
        self._poke()

    def _poke(self) -> None:
        """Something new needs the scheduler: run it at the end of the step in progress (now if idle)."""
        now = self._kernel.now_s
        if not self._running:
            if self._planned_s == math.inf:
                self._boundary(now, 0)
            return
        k = self._steps_at(now)
        epoch, extra, a, g = self._epoch_s, self._extra_s, self._step0_s, self._growth_s
        t = epoch + (extra + k * a + g * k * (k - 1) / 2 if k > 0 else 0.0)  # epoch + _elapsed_s(k)
        # A first step carrying a prefill (a recompute, a local prompt) was planned at this very instant and
        # its first tokens announced: what arrives now waits for that step's end, as in vLLM, where the
        # scheduler runs once a step. Planning again now would drop the prefill's time from the step.
        if t < now or (k == 0 and extra > 0.0):
            k += 1
            t = epoch + (extra + k * a + g * k * (k - 1) / 2 if k > 0 else 0.0)
        if t < self._planned_s:
            self._schedule(t, k)

    def _schedule(self, t: float, k: int) -> None:
        self._version += 1
        self._planned_s = t
        self._kernel.at(t, self._on_event_cb, (self._version, k))

    def _on_event(self, arg: tuple[int, int]) -> None:
        version, k = arg
        if version == self._version:
            now = self._kernel.now_s
            self.metrics.touch(now)
            self._boundary(now, k)

    # ---- the scheduler, at a step boundary ----------------------------------------------------------

    def _boundary(self, now: float, k: int) -> None:
        self._planned_s = math.inf
        self._steps += k
        steps = self._steps
        running = self._running
        # 1. finished requests leave
        heap = self._finish_heap
        if heap.top_key() <= steps:
            on_done = self._on_done
            while heap.top_key() <= steps:
                order = heap.pop().order
                req = running.pop(order, None)
                if req is None:
                    continue  # preempted after this entry was pushed
                self._prompt_sum -= req.prompt_tokens
                self._join_sum -= req.join_step
                req.running = False
                req.emitted_tokens = req.output_tokens
                req.last_token_s = now
                if req.answer_blocks:
                    self._cache_answer(req, len(running) * steps - self._join_sum)
                self._free(req)
                on_done(req)
        # 2. requests whose KV arrived join
        extra = 0.0
        joiners = self._joiners
        if joiners:
            for req in joiners:
                self._join(req)
            joiners.clear()
        # 3. the next step must fit: preempt the newest requests (vLLM's recompute preemption)
        cap = self.kv_capacity_tokens
        pool = self.pool
        block_tokens = pool.block_tokens
        # KV in use: the pool's, and the running streams' output tokens (len(running) * steps - join_sum)
        while running and pool.used_tokens + len(running) * (steps + 1) - self._join_sum > cap:
            self._preempt_newest()
        # 4. admit waiting requests while KV and the sequence limit allow
        waiting = self._waiting
        admit_limit = self._admit_limit
        while waiting:
            req = waiting[0]
            blocks = req.prefix_blocks
            recompute = req.recompute_tokens
            hit = pool.lookup(blocks, req.prompt_tokens) if blocks else 0
            new_tokens = req.prompt_tokens - hit * block_tokens
            need = pool.admission_tokens(blocks, hit, new_tokens) + (
                recompute - req.prompt_tokens if recompute else 0
            )
            n = len(running)
            out = n * (steps + 1) - self._join_sum
            used = pool.used_tokens + out + 1
            busy = n + self._transferring + len(self._joiners)
            # The watermark keeps room for running requests to grow; an idle engine has none to keep, and a
            # request that fits its whole budget (the admission check) must be served, or it waits forever.
            if (used + need > admit_limit and (busy or used + need > cap)) or busy >= self._max_seqs:
                break
            rb = RequestBlocks()
            if not pool.admit(rb, blocks, hit, new_tokens, req.prompt_tokens, out):
                break
            waiting.popleft()
            req.decode_kv = rb
            if req.local and not recompute and req.first_token_s is None:
                # its own prompt, prefilled here: as a recompute is (below), past the local hit
                recompute = req.prompt_tokens
                req.cached_decode_tokens = req.cached_prefill_tokens = hit * block_tokens
            if recompute:
                # the prompt's cached blocks are not recomputed (vLLM looks the cache up again)
                c = self._recompute
                done = hit * block_tokens
                extra += (
                    c.per_token_s * (recompute - done)
                    + c.attn_s_per_token2 * (recompute * recompute - done * done) / 2
                )
                req.recompute_tokens = 0
                if blocks:
                    pool.cache(rb, blocks, len(blocks))
                self._join(req)
            else:
                self._transferring += 1
                cached = hit * block_tokens
                req.cached_decode_tokens = cached
                self._kernel.at(
                    now + self._transfer_s(req.prompt_tokens - cached), self._transfer_done_cb, req, URGENT
                )
        # 5. plan the next stretch
        self._epoch_s = now
        self._extra_s = extra
        n = len(running)
        out = n * steps - self._join_sum
        if pool.cached_free_blocks:
            pool.fit(out)
        used = pool.used_tokens
        if n == 0:
            self._fresh.clear()
            if used > self.peak_kv_used_tokens:
                self.peak_kv_used_tokens = used
            return
        context = self._prompt_sum + out
        self._step0_s = step0 = self._a + self._b * n + self._c * context
        self._growth_s = growth = self._c * n
        k_kv = (cap - used - out) // n
        # min() of three is a generic call in the compiled build; two comparisons are not
        k_next = int(heap.top_key()) - steps  # a request runs, so an entry is there; steps fit a float
        if k_kv < k_next:
            k_next = k_kv
        if self._max_stretch < k_next:
            k_next = self._max_stretch
        peak = used + out + n * k_next  # KV in use at the end of the stretch
        if peak > self.peak_kv_used_tokens:
            self.peak_kv_used_tokens = peak
        if self._fresh:
            t1 = now + self._elapsed_s(1)
            fresh = []
            for r in self._fresh:
                if r.running and r.first_token_s is None:
                    r.first_token_s = t1
                    fresh.append(r)
            self._fresh.clear()
            if fresh:
                self._on_first_tokens(t1, fresh)
        # _schedule(now + _elapsed_s(k_next), k_next), inlined: once per boundary
        t = now + (extra + k_next * step0 + growth * k_next * (k_next - 1) / 2 if k_next > 0 else 0.0)
        self._version += 1
        self._planned_s = t
        self._kernel.at(t, self._on_event_cb, (self._version, k_next))

    def _join(self, req: SimRequest) -> None:
        order = self._next_order
        self._next_order += 1
        req.join_order = order
        req.join_step = self._steps - req.emitted_tokens
        req.running = True
        self._running[order] = req
        self._join_stack.append(order)
        if req.first_token_s is None:
            self._fresh.append(req)
        self._finish_heap.push(Entry(float(req.join_step + req.output_tokens), order))
        self._prompt_sum += req.prompt_tokens
        self._join_sum += req.join_step

    def _cache_answer(self, req: SimRequest, out_tokens: int) -> None:
        """The finished request's answer blocks, cached as vLLM caches output blocks it computed: they were
        counted among the streams' output tokens (closed form), and become its blocks in the pool before it
        frees them (``out_tokens``: the other streams' output tokens). Where the pool has no room for them
        as blocks, they are not cached."""
        rb = req.decode_kv
        if rb is None or len(rb.held) < len(req.prefix_blocks):
            return  # its prompt's blocks are not all cached here (a clear since): nothing chains to them
        hashes = req.prefix_blocks + req.answer_blocks
        if self.pool.allocate(rb, len(req.answer_blocks) * self.pool.block_tokens, out_tokens):
            self.pool.cache(rb, hashes, len(hashes))

    def _free(self, req: SimRequest) -> None:
        rb = req.decode_kv
        if rb is not None:
            self.pool.free(rb)
            req.decode_kv = None

    def _preempt_newest(self) -> None:
        stack = self._join_stack
        while stack[-1] not in self._running:
            stack.pop()
        req = self._running.pop(stack.pop())
        self._prompt_sum -= req.prompt_tokens
        self._join_sum -= req.join_step
        self._free(req)
        req.running = False
        req.emitted_tokens = self._steps - req.join_step
        req.recompute_tokens = req.prompt_tokens + req.emitted_tokens
        self.preemptions += 1
        self._waiting.appendleft(req)

    def true_state(
        self,
        now_s: float,
        tau_dec_s: float,
        blocks: tuple[int, ...],
        prompt_tokens: int,
        reuse: float,
    ) -> InstanceState:
        """This engine as it is now, for a request with these blocks (the clairvoyant policy's view): KV in
        use, and committed as the true outputs will grow it; backlog the true value of what the ledger
        estimates (its module docstring), the output tokens every stream here has left, summed, at
        ``tau_dec_s``; the hits this request would get, counting the blocks of the requests waiting to be
        pulled here (as PrefillInstance.true_state). The backlog was once the longest stream's time alone:
        another quantity than marginal_cost's, which weights with w_b_dec > 0 priced very differently (the
        clairvoyant policy with mixed-bursty's tuned weights fell to 0.42 goodput where marginal_cost with
        them had 0.85)."""
        coming: set[int] = set()
        for req in self._waiting:
            coming.update(req.prefix_blocks)
        pool = self.pool
        cached = pool.lookup_ahead(blocks, prompt_tokens, coming) * pool.block_tokens if blocks else 0
        sample = self._metrics_at(now_s)
        steps = self._steps + (self._steps_at(now_s) if self._running else 0)
        left_tokens = 0  # output tokens still to come here, over every stream
        for req in self._running.values():
            left = req.join_step + req.output_tokens - steps
            if left > 0:
                left_tokens += left
        growth = left_tokens
        for req in self._waiting:
            growth += req.prompt_tokens + req.output_tokens
            left_tokens += req.output_tokens
        for req in self._joiners:
            growth += req.output_tokens
            left_tokens += req.output_tokens
        return InstanceState(
            self.instance_id,
            Role.DECODE,
            True,
            sample.running + sample.waiting,
            left_tokens * tau_dec_s,
            sample.kv_used_tokens + growth,
            sample.kv_used_tokens,
            self.kv_capacity_tokens,
            sample.running,
            sample.waiting,
            0.0,
            cached,
            reuse,
        )

    def _metrics_at(self, t: float) -> Sample:
        """KV in use, running and waiting at ``t``, within the current stretch."""
        n = len(self._running)
        kv = self.pool.used_tokens + n * self._steps - self._join_sum  # at the stretch start
        kv = kv + (n * self._steps_at(t) if n else 0)
        return Sample(t, kv, n, len(self._waiting) + self._transferring + len(self._joiners))
