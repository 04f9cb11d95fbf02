"""The emulated engine's core: vLLM V1-style continuous batching in (scaled) real time.

Each iteration the scheduler decides a batch (pure bookkeeping: which running requests decode a token,
which prompt chunks prefill, under a token budget and the KV budget, preempting the newest request when a
running one cannot grow), the loop sleeps for the iteration's modelled duration (the hardware profile's
curves x time_scale x the slow-down fault), then applies the results: prompt progress, one greedy token per
decoding request, completions. Requests with ``kv_pull`` (a decode engine's half of the NixlConnector
handoff) are admitted by taking their local prefix-cache hit and reserving KV for the rest of the prompt,
which they pull from the prefill engine before they join the batch (NixlConnector pulls only the tokens past
the local hit); requests that ``hold_kv`` (a prefill engine's half) keep their blocks after finishing,
until the decode engine pulls them or the lease expires. Blocks are cached as the steps that fill them are
scheduled, prompt and output alike, and pulled ones when the pull is done (kvcache/pool.py: vLLM 0.32's
block pool, the model the simulator's engines share).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from calroute.contract.blocks import BLOCK_TOKENS
from calroute.contract.kv_events import KvEvent
from calroute.costmodel.profiles import HardwareProfile
from calroute.emulator import tokens
from calroute.emulator.kvcache import KvCache, blocks_for, held_blocks
from calroute.emulator.request import EngineRequest, KvPuller, KvReleaser, Phase, PullFailed
from calroute.kvcache.pool import RequestBlocks

logger = logging.getLogger(__name__)


@dataclass
class EngineStats:
    """Counters for /metrics (histogram samples are pushed to ``observer``)."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    preemptions: int = 0
    finished: dict[str, int] = field(default_factory=dict)
    kv_expired: int = 0
    kv_unknown_pulls: int = 0
    kv_failed_pulls: int = 0


class EngineCore:
    def __init__(
        self,
        engine_id: str,
        profile: HardwareProfile,
        time_scale: float = 1.0,
        kv_lease_s: float = 30.0,
        kv_failure_policy: str = "fail",
        puller: KvPuller | None = None,
        releaser: KvReleaser | None = None,
        observer: Callable[[str, float], None] | None = None,
        publish_events: Callable[[Sequence[KvEvent]], None] | None = None,
    ) -> None:
        """``publish_events``: where the prefix cache's KV events go, one batch per step (None: events
        off, and none are recorded)."""
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        if kv_failure_policy not in ("fail", "recompute"):
            raise ValueError(f"kv_failure_policy must be fail or recompute, got {kv_failure_policy!r}")
        self.engine_id = engine_id
        self.profile = profile
        self.time_scale = time_scale
        self.slowdown = 1.0  # a fault: every iteration takes this many times longer
        self.kv_lease_s = kv_lease_s
        self.kv_failure_policy = kv_failure_policy
        self.puller = puller
        self.releaser = releaser
        self.address = ("127.0.0.1", 0)  # where decode engines reach this one; set by the server
        self.observer = observer or (lambda name, value: None)
        self.kv = KvCache(profile.limits.kv_capacity_tokens, record_events=publish_events is not None)
        self.publish_events = publish_events
        self.stats = EngineStats()
        self._waiting: deque[EngineRequest] = deque()
        self._running: list[EngineRequest] = []
        self._pulled: list[EngineRequest] = []
        self._pulling = 0
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._pull_tasks: set[asyncio.Task[None]] = set()
        self._ids = itertools.count()

    # ---- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"engine-{self.engine_id}")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._pull_tasks) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for req in [*self._running, *self._waiting, *self._pulled]:
            self._fail(req, "engine stopped")

    # ---- requests -----------------------------------------------------------------------------------

    def add(self, req: EngineRequest) -> None:
        self._waiting.append(req)
        self._wakeup.set()

    def abort(self, req: EngineRequest) -> None:
        """The client went away: free everything the request holds."""
        if req.finished:
            return
        if req in self._running:
            self._running.remove(req)
        elif req in self._waiting:
            self._waiting.remove(req)
            if req.kv_pull is not None:
                self._release_remote(req.kv_pull)
        elif req in self._pulled:
            self._pulled.remove(req)
        self.kv.free(req.kv)
        self._finish(req, "abort")

    def _release_remote(self, params: dict[str, Any]) -> None:
        """A decode request aborted before it was scheduled still frees the prefill engine's blocks, as
        vLLM 0.32's does: NixlConnectorScheduler.request_finished (nixl/pull_scheduler.py) queues it for
        receiving with no blocks, "to avoid stranding the prefill blocks in the prefill instance", and the
        worker's notification frees them there. (A request already pulling finishes its pull, which frees
        them; one pulled frees them then.)"""
        if self.releaser is None:
            return
        task = asyncio.get_running_loop().create_task(self.releaser(params))
        self._pull_tasks.add(task)
        task.add_done_callback(self._pull_tasks.discard)

    def release_held(self, request_id: str) -> int | None:
        """A decode engine pulled a held request's KV: free it. Returns its prompt tokens, None if unknown."""
        held = self.kv.release_held(request_id)
        if held is None:
            return None
        self._wakeup.set()
        return held.prompt_tokens

    def held_prompt_tokens(self, request_id: str) -> int | None:
        held = self.kv.held.get(request_id)
        return None if held is None else held.prompt_tokens

    def reset_prefix_cache(self) -> None:
        self.kv.reset_prefix_cache()
        # Published now, not with the next step: an idle engine may not step for a long while, and a
        # subscriber must not keep matching against a cache that is gone.
        self._publish_events()

    def _publish_events(self) -> None:
        if self.publish_events is not None:
            events = self.kv.take_events()
            if events:
                self.publish_events(events)

    # ---- metrics ------------------------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting) + self._pulling + len(self._pulled)

    # ---- the loop -----------------------------------------------------------------------------------

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while True:
            self._expire_leases()
            batch = self._schedule()
            if not batch:
                expiry = self.kv.next_expiry_s()
                timeout = None if expiry is None else max(0.0, expiry - time.monotonic())
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), timeout)
                except TimeoutError:
                    pass
                deadline = loop.time()
                continue
            duration_s = self._duration_s(batch) * self.time_scale * self.slowdown
            # Sleep to an absolute deadline so timer jitter does not accumulate over a long stretch,
            # but never try to catch up on time lost while the process was busy elsewhere.
            deadline = max(deadline, loop.time() - 0.002) + duration_s
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            self._apply(batch)
            self._publish_events()  # one batch per step, as vLLM's scheduler publishes them

    def _schedule(self) -> list[tuple[EngineRequest, int]]:
        """The next iteration: (request, tokens to process) pairs. Mutates only bookkeeping."""
        lim = self.profile.limits
        budget = lim.max_batched_tokens
        batch: list[tuple[EngineRequest, int]] = []
        for req in self._pulled:  # their KV arrived: the next step computes the last prompt token's logits
            req.phase = Phase.RUNNING
            req.computed_tokens = req.prompt_tokens - 1
            self._cache(req, req.prompt_tokens)  # vLLM caches pulled blocks once the load is done
            self._running.append(req)
        self._pulled.clear()
        i = 0
        while i < len(self._running) and budget > 0:
            req = self._running[i]
            remaining = req.context_tokens - req.computed_tokens
            n = min(remaining, budget) if remaining > 1 else 1
            need = blocks_for(req.computed_tokens + n) - held_blocks(req.kv)
            while need > 0 and not self.kv.allocate(req.kv, need):
                victim = self._running[-1]
                self._preempt(victim)
                if victim is req:
                    break
            if req.phase is not Phase.RUNNING:
                continue  # preempted itself; the list shrank
            self._cache(req, req.computed_tokens + n)
            batch.append((req, n))
            budget -= n
            i += 1
        while self._waiting and budget > 0 and len(self._running) < lim.max_num_seqs:
            req = self._waiting[0]
            context = req.context_tokens
            # vLLM looks the prefix cache up when it schedules a request (again after a preemption)
            hashes = req.block_hashes(context // BLOCK_TOKENS)
            hit = self.kv.lookup(hashes, context)
            cached = hit * BLOCK_TOKENS
            if req.kv_pull is not None and req.computed_tokens == 0:
                # NixlConnector's decode side pulls the prompt past the local hit (pull_scheduler.py,
                # get_num_new_matched_tokens: prompt tokens - num_computed_tokens)
                if not self.kv.admit(req.kv, hashes, hit, blocks_for(context) - hit, context):
                    break
                self._waiting.popleft()
                self._count_lookup(req, cached)
                req.pull_tokens = context - cached
                req.phase = Phase.PULLING
                self._start_pull(req)
                continue
            n = min(context - cached, budget)
            new_blocks = blocks_for(cached + n) - hit
            need = self.kv.admission_blocks(hashes, hit, new_blocks)
            if need > self.kv.free_blocks - int(self.kv.total_blocks * lim.kv_watermark_frac):
                break
            if not self.kv.admit(req.kv, hashes, hit, new_blocks, context):
                break
            self._waiting.popleft()
            if not req.output_ids:
                self._count_lookup(req, cached)
            req.computed_tokens = cached
            req.phase = Phase.RUNNING
            self._running.append(req)
            self._cache(req, cached + n)
            batch.append((req, n))
            budget -= n
        return batch

    def _count_lookup(self, req: EngineRequest, cached: int) -> None:
        req.cached_tokens = cached
        self.stats.prefix_queries += req.prompt_tokens
        self.stats.prefix_hits += cached

    def _cache(self, req: EngineRequest, tokens: int) -> None:
        """Cache the request's blocks that ``tokens`` fill (vLLM's allocate_slots caches up to the computed
        and scheduled tokens, at most the request's own)."""
        full = min(tokens, req.context_tokens) // BLOCK_TOKENS
        if full > len(req.kv.held):
            ids = req.token_ids() if self.publish_events is not None else None
            self.kv.cache(req.kv, req.block_hashes(full), full, ids or ())

    def _duration_s(self, batch: list[tuple[EngineRequest, int]]) -> float:
        cal = self.profile.calibration
        pre, dec = cal.prefill, cal.decode
        prefill_tokens = 0
        attn = 0.0
        decode_seqs = 0
        decode_ctx = 0
        for req, n in batch:
            if req.context_tokens - req.computed_tokens > 1 or req.computed_tokens < req.prompt_tokens - 1:
                prefill_tokens += n
                attn += n * (req.computed_tokens + n / 2)
            else:
                decode_seqs += 1
                decode_ctx += req.computed_tokens
        base = max(pre.base_s if prefill_tokens else 0.0, dec.base_s if decode_seqs else 0.0)
        return (
            base
            + pre.per_token_s * prefill_tokens
            + pre.attn_s_per_token2 * attn
            + dec.per_seq_s * decode_seqs
            + dec.per_ctx_token_s * decode_ctx
        )

    def _apply(self, batch: list[tuple[EngineRequest, int]]) -> None:
        now = time.monotonic()
        for req, n in batch:
            if req.phase is not Phase.RUNNING:
                continue  # aborted while the step ran
            req.computed_tokens += n
            if req.computed_tokens < req.context_tokens:
                continue  # a prompt chunk that does not reach the end yet
            token = tokens.next_token(req._seed, len(req.output_ids))
            req.output_ids.append(token)
            self.stats.generation_tokens += 1
            if req.first_token_s is None:
                req.first_token_s = now
                self.observer("ttft", now - req.arrival_s)
            else:
                self.observer("itl", now - (req.last_token_s or now))
            req.last_token_s = now
            n_out = len(req.output_ids)
            if n_out >= req.max_tokens:
                self._complete(req, "length")
            elif token == tokens.EOS_ID and not req.ignore_eos and n_out >= req.min_tokens:
                self._complete(req, "stop")
            elif n_out == 1 or n_out % req.notify_every == 0:
                req.updated.set()

    def _complete(self, req: EngineRequest, reason: str) -> None:
        self._running.remove(req)
        if req.hold_kv and reason == "length":
            expires_s = time.monotonic() + self.kv_lease_s
            held = self.kv.hold(req.request_id, req.kv, req.prompt_tokens, expires_s)
            req.kv = RequestBlocks()  # the held entry owns them now
            req.kv_transfer_params = {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_block_ids": [held.block_ids],
                "remote_engine_id": self.engine_id,
                "remote_request_id": req.request_id,
                "remote_host": self.address[0],
                "remote_port": self.address[1],
                "tp_size": 1,
                "dcp_size": 1,
                "pp_size": 1,
                "remote_num_tokens": req.prompt_tokens,
                "remote_blocks_expiry_time": None,
                "transfer_mode": "pull",
                "remote_prefill_cached_tokens": req.cached_tokens,
            }
        else:
            self.kv.free(req.kv)
        self.stats.prompt_tokens += req.prompt_tokens
        self.observer("e2e", time.monotonic() - req.arrival_s)
        self._finish(req, reason)

    def _finish(self, req: EngineRequest, reason: str) -> None:
        req.phase = Phase.FINISHED
        req.finish_reason = reason
        self.stats.finished[reason] = self.stats.finished.get(reason, 0) + 1
        req.updated.set()

    def _fail(self, req: EngineRequest, error: str) -> None:
        if req.finished:
            return
        req.error = error
        self._finish(req, "error")

    def _preempt(self, req: EngineRequest) -> None:
        """vLLM's recompute preemption: free the request's KV and requeue it at the front."""
        self._running.remove(req)
        self.kv.free(req.kv)
        req.computed_tokens = 0
        req.kv_pull = None  # its KV is gone: recompute locally, prompt and output so far
        req.phase = Phase.WAITING
        self._waiting.appendleft(req)
        self.stats.preemptions += 1

    def _expire_leases(self) -> None:
        for held in self.kv.expire_held(time.monotonic()):
            self.stats.kv_expired += 1
            logger.info("engine %s: releasing expired KV blocks of %s", self.engine_id, held.request_id)

    # ---- the decode side of the handoff -------------------------------------------------------------

    def _start_pull(self, req: EngineRequest) -> None:
        self._pulling += 1
        task = asyncio.get_running_loop().create_task(self._pull(req))
        self._pull_tasks.add(task)
        task.add_done_callback(self._pull_tasks.discard)

    async def _pull(self, req: EngineRequest) -> None:
        params = req.kv_pull or {}
        try:
            if self.puller is None:
                raise PullFailed("no KV connector configured")
            found = await self.puller(params, req.pull_tokens)
            if not found:
                # vLLM's decode side reads whatever the block ids point at and carries on; only the
                # prefill engine notices ("potentially invalid KV blocks"). Same here.
                self.stats.kv_unknown_pulls += 1
        except PullFailed as e:
            self.stats.kv_failed_pulls += 1
            self._pulling -= 1
            if req.finished:
                return  # aborted meanwhile; abort() freed its blocks
            self.kv.free(req.kv)
            if self.kv_failure_policy == "fail":
                self._fail(req, f"KV transfer failed: {e}")
                return
            req.kv_pull = None  # recompute: prefill locally
            req.phase = Phase.WAITING
            self._waiting.appendleft(req)
            self._wakeup.set()
            return
        self._pulling -= 1
        if req.phase is Phase.PULLING:
            self._pulled.append(req)
            self._wakeup.set()

    def transfer_s(self, prompt_tokens: int) -> float:
        """Modelled time to move a prompt's KV, scaled like every other duration."""
        return self.profile.calibration.transfer_s(prompt_tokens) * self.time_scale

    def next_request_id(self) -> str:
        return f"{self.engine_id}-{next(self._ids)}"
