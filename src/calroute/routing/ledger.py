"""The in-flight ledger: the router's own account of the work it has committed to each instance.

Fed by four events per request (admit, prefill done, first token, done), the same in the simulator and
the proxy, it turns predicted lengths and observed timings into each instance's backlog in *observed*
seconds:

- prefill: prompt tokens admitted and not yet prefilled, times the instance's observed seconds per prompt
  token (time the instance had work outstanding, divided by the tokens it finished; decayed averages);
- decode: for requests not yet started, predicted tokens times the instance's observed TPOT; for started
  requests, the time left until their predicted last token (first token + (o_hat - 1) x TPOT at that
  moment), never below zero. Sums are kept incrementally; expired requests leave a heap lazily, so a view
  costs O(instances), not O(requests).

Until an instance has finished anything, it borrows its pool's observed rate, and until the pool has,
the calibration's tau. The ledger also keeps committed KV (prompt + predicted output of in-flight work)
and the last engine metrics sample per instance, and builds the ClusterView a policy sees.

It also keeps each engine's active sequences as NVIDIA Dynamo's KV router does (its ``ActiveSequences``,
docs/prefix.md "How each peer does it"): the requests admitted to a prefill engine until their prefill is
done, to a decode engine until they are done, with their prompt tokens and, for a policy that asks
(``track_active_blocks``), their prompt blocks counted with multiplicity (``ActiveBlocks``), so that a
block several of them share counts once and a request can be matched against them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from calroute.costmodel.calibration import Calibration
from calroute.errors import ConfigError
from calroute.routing.heap import Entry, MinHeap
from calroute.routing.prefix_index import leading_runs
from calroute.types import ClusterView, InstanceSpec, InstanceState, Role

_INF: Final = float("inf")


class _Rate:
    """Decayed ratio of two sums: seconds over tokens (prefill) or a mean of TPOT samples (decode)."""

    __slots__ = ("num", "den", "decay")

    def __init__(self, decay: float) -> None:
        self.num = 0.0
        self.den = 0.0
        self.decay = decay

    def add(self, num: float, den: float) -> None:
        self.num = self.num * self.decay + num
        self.den = self.den * self.decay + den

    def value(self) -> float | None:
        return self.num / self.den if self.den > 0 else None


@dataclass(slots=True)
class _Book:
    spec: InstanceSpec
    rate: _Rate
    pool_rate: _Rate  # shared by the instances of the pool
    prior_s: float  # the calibration's tau for the pool
    decode: bool  # the role, as a bool: comparing an Enum member is an attribute lookup per view
    healthy: bool = True
    in_flight: int = 0
    # prefill: prompt tokens admitted, not yet prefilled. decode: predicted tokens of requests not started.
    pending_tokens: int = 0
    kv_committed_tokens: int = 0
    # prompt tokens of the active sequences (prefill: admitted, prefill not done; decode: admitted, not done)
    active_tokens: int = 0
    # decode only: prompt tokens of requests it prefills itself (local), admitted and not yet prefilled
    local_prefill_tokens: int = 0
    # prefill only: busy-time accounting.
    busy_s: float = 0.0
    last_event_s: float = 0.0
    # decode only: started requests, as expiry times of their predicted last token.
    expiry_heap: MinHeap = field(default_factory=MinHeap)  # keyed by expiry, ordered by entry key
    active: dict[int, float] = field(default_factory=dict)
    expiry_sum_s: float = 0.0
    # last engine metrics sample
    kv_used_tokens: int = 0
    running: int = 0
    waiting: int = 0
    sampled_at_s: float | None = None


class ActiveBlocks:
    """The prompt blocks of each engine's active sequences, with multiplicity (Dynamo's ``unique_blocks``,
    a reference count per block): a block that several of them hold counts once in their footprint, and a
    request's blocks can be matched against them. Block ids chain as the prefix index's do (an id stands for
    its block and everything before it), so a match is a leading run, as Dynamo's overlap depth is."""

    __slots__ = ("block_tokens", "_ids", "_bit", "_all", "_counts", "_holders", "shared_tokens")

    def __init__(self, ids: list[str], block_tokens: int) -> None:
        if block_tokens < 1:
            raise ConfigError(f"block size must be >= 1 token, got {block_tokens}")
        self.block_tokens = block_tokens
        self._ids = ids
        self._bit = {iid: 1 << i for i, iid in enumerate(ids)}
        self._all = (1 << len(ids)) - 1
        self._counts: dict[str, dict[int, int]] = {iid: {} for iid in ids}
        self._holders: dict[int, int] = {}  # block -> bitmask of the engines whose active sequences hold it
        # per engine: the tokens of its blocks held by more than one of its sequences, past the first
        self.shared_tokens: dict[str, int] = dict.fromkeys(ids, 0)

    def acquire(self, instance_id: str, blocks: list[int]) -> None:
        counts = self._counts[instance_id]
        holders = self._holders
        bit = self._bit[instance_id]
        shared = 0
        for b in blocks:
            c = counts.get(b, 0)
            if c:
                shared += 1
            else:
                holders[b] = holders.get(b, 0) | bit
            counts[b] = c + 1
        if shared:
            self.shared_tokens[instance_id] += shared * self.block_tokens

    def release(self, instance_id: str, blocks: list[int]) -> None:
        counts = self._counts[instance_id]
        holders = self._holders
        bit = self._bit[instance_id]
        shared = 0
        for b in blocks:
            c = counts.get(b, 0)
            if c > 1:
                counts[b] = c - 1
                shared += 1
            elif c == 1:
                del counts[b]
                rest = holders.get(b, 0) & ~bit
                if rest:
                    holders[b] = rest
                else:
                    holders.pop(b, None)
        if shared:
            self.shared_tokens[instance_id] -= shared * self.block_tokens

    def match(self, blocks: Sequence[int]) -> dict[str, int]:
        """Per engine, the tokens of the leading run of ``blocks`` among its active sequences' blocks
        (engines with none left out)."""
        return leading_runs(self._holders, self._ids, self._all, blocks, self.block_tokens)

    def blocks_held(self, instance_id: str) -> int:
        """Distinct blocks of the engine's active sequences."""
        return len(self._counts[instance_id])


class _Entry:
    """One request in flight (a written ``__init__``: the compiled build compiles it; a dataclass's is
    generated at import and stays interpreted, once per request)."""

    __slots__ = (
        "key",
        "prefill",
        "decode",
        "prompt_tokens",
        "prefill_tokens",
        "predicted_output_tokens",
        "phase",
        "first_token_s",
        "blocks",
        "tracked",
        "local",
    )

    def __init__(
        self,
        key: int,
        prefill: _Book,
        decode: _Book,
        prompt_tokens: int,
        prefill_tokens: int,
        predicted_output_tokens: int,
        local: bool,
    ) -> None:
        self.key = key
        self.prefill = prefill
        self.decode = decode
        self.prompt_tokens = prompt_tokens
        self.prefill_tokens = prefill_tokens  # the prompt tokens the prefill engine computes (not cached)
        self.predicted_output_tokens = predicted_output_tokens
        self.phase = 0  # 0 prefilling, 1 waiting for first token, 2 decoding
        self.first_token_s = 0.0
        self.blocks: list[int] = []  # its prompt blocks, where active blocks are tracked
        self.tracked: ActiveBlocks | None = None  # the structure they were counted in
        self.local = local  # prefilled by its decode engine (prefill is decode)


class Ledger:
    """Per-instance committed work, fed by request events. ``now_s`` must never go backwards."""

    def __init__(self, instances: Sequence[InstanceSpec], prior: Calibration, decay: float = 0.95) -> None:
        if not 0.0 < decay < 1.0:
            raise ConfigError(f"ledger decay must be in (0, 1), got {decay}")
        ids = [s.instance_id for s in instances]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"instance ids must be unique, got {ids}")
        # Per book, not dicts keyed by Role: hashing an Enum member runs Python code (Enum.__hash__).
        prior_s = {Role.PREFILL: prior.tau_pre_s, Role.DECODE: prior.tau_dec_s}
        pool_rate = {Role.PREFILL: _Rate(decay), Role.DECODE: _Rate(decay)}
        self._books = {
            s.instance_id: _Book(s, _Rate(decay), pool_rate[s.role], prior_s[s.role], s.role is Role.DECODE)
            for s in instances
        }
        self._prefill = [b for b in self._books.values() if b.spec.role is Role.PREFILL]
        self._decode = [b for b in self._books.values() if b.spec.role is Role.DECODE]
        self._entries: dict[str, _Entry] = {}
        self._next_key = 0
        self.decisions = 0
        self._ids = ids
        self._active: ActiveBlocks | None = None

    def track_active_blocks(self, block_tokens: int | None) -> None:
        """Count the active sequences' prompt blocks from the next admission on, in blocks of
        ``block_tokens`` (the size the admissions' blocks name); None: stop. Requests admitted while it was
        off are not counted (their blocks are unknown)."""
        if block_tokens is None:
            self._active = None
        elif self._active is None or self._active.block_tokens != block_tokens:
            self._active = ActiveBlocks(self._ids, block_tokens)

    @property
    def tracks_active_blocks(self) -> bool:
        return self._active is not None

    def active_overlap(self, blocks: Sequence[int]) -> dict[str, int] | None:
        """Per engine, the tokens of the leading run of ``blocks`` among its active sequences' blocks (None
        unless active blocks are tracked)."""
        active = self._active
        if active is None:
            return None
        return active.match(blocks) if blocks else {}

    # ---- events -------------------------------------------------------------------------------------

    def admit(
        self,
        request_id: str,
        prefill_id: str,
        decode_id: str,
        prompt_tokens: int,
        predicted_output_tokens: int,
        now_s: float,
        cached_tokens: int = 0,
        blocks: Sequence[int] = (),
        local: bool = False,
    ) -> None:
        """``cached_tokens``: of the prompt, how many the router expects the prefill engine to hold, so that
        it computes only the rest. Backlog and observed rates count computed tokens; KV counts the prompt.
        ``blocks``: the prompt's blocks (all of them are read, where active blocks are tracked). ``local``:
        the decode engine prefills it (``prefill_id == decode_id``): its computed prompt tokens are the
        engine's ``local_prefill_tokens`` until its prefill is done, and it is one request there, not two."""
        if request_id in self._entries:
            raise ConfigError(f"request {request_id!r} is already in flight")
        if local:
            self._admit_local(
                request_id, decode_id, prompt_tokens, predicted_output_tokens, cached_tokens, blocks
            )
            return
        pre = self._books[prefill_id]
        dec = self._books[decode_id]
        self._account_busy(pre, now_s)
        pre.in_flight += 1
        prefill_tokens = prompt_tokens - cached_tokens if cached_tokens < prompt_tokens else 0
        pre.pending_tokens += prefill_tokens
        pre.kv_committed_tokens += prompt_tokens
        dec.in_flight += 1
        dec.pending_tokens += predicted_output_tokens
        dec.kv_committed_tokens += prompt_tokens + predicted_output_tokens
        pre.active_tokens += prompt_tokens
        dec.active_tokens += prompt_tokens
        e = _Entry(self._next_key, pre, dec, prompt_tokens, prefill_tokens, predicted_output_tokens, False)
        active = self._active
        if active is not None and blocks:
            held = blocks if type(blocks) is list else list(blocks)
            active.acquire(prefill_id, held)
            active.acquire(decode_id, held)
            e.blocks = held
            e.tracked = active
        self._entries[request_id] = e
        self._next_key += 1
        self.decisions += 1

    def _admit_local(
        self,
        request_id: str,
        decode_id: str,
        prompt_tokens: int,
        predicted_output_tokens: int,
        cached_tokens: int,
        blocks: Sequence[int],
    ) -> None:
        dec = self._books[decode_id]
        if not dec.decode:
            raise ConfigError(f"a local prefill runs on a decode engine, {decode_id!r} is not one")
        prefill_tokens = prompt_tokens - cached_tokens if cached_tokens < prompt_tokens else 0
        dec.in_flight += 1
        dec.local_prefill_tokens += prefill_tokens
        dec.pending_tokens += predicted_output_tokens
        dec.kv_committed_tokens += prompt_tokens + predicted_output_tokens
        dec.active_tokens += prompt_tokens
        e = _Entry(self._next_key, dec, dec, prompt_tokens, prefill_tokens, predicted_output_tokens, True)
        active = self._active
        if active is not None and blocks:
            held = blocks if type(blocks) is list else list(blocks)
            active.acquire(decode_id, held)
            e.blocks = held
            e.tracked = active
        self._entries[request_id] = e
        self._next_key += 1
        self.decisions += 1

    def prefill_done(self, request_id: str, now_s: float) -> None:
        e = self._entries[request_id]
        if e.phase != 0:
            return
        if e.local:
            e.decode.local_prefill_tokens -= e.prefill_tokens
            e.phase = 1
            return
        pre = e.prefill
        self._account_busy(pre, now_s)
        pre.in_flight -= 1
        pre.pending_tokens -= e.prefill_tokens
        pre.active_tokens -= e.prompt_tokens
        if e.tracked is not None:
            e.tracked.release(pre.spec.instance_id, e.blocks)
        if e.prefill_tokens > 0:
            pre.rate.add(pre.busy_s, e.prefill_tokens)
            pre.pool_rate.add(pre.busy_s, e.prefill_tokens)
            pre.busy_s = 0.0
        e.phase = 1

    def first_token(self, request_id: str, now_s: float) -> None:
        e = self._entries[request_id]
        if e.phase == 0:
            self.prefill_done(request_id, now_s)
        if e.phase != 1:
            return
        if not e.local:
            e.prefill.kv_committed_tokens -= e.prompt_tokens  # the decode engine has pulled the KV
        dec = e.decode
        dec.pending_tokens -= e.predicted_output_tokens
        expiry = now_s + (e.predicted_output_tokens - 1) * self._rate_s(dec)
        if expiry > now_s:
            dec.expiry_heap.push(Entry(expiry, e.key))
            dec.active[e.key] = expiry
            dec.expiry_sum_s += expiry
        e.first_token_s = now_s
        e.phase = 2

    def done(self, request_id: str, now_s: float, output_tokens: int, ok: bool = True) -> None:
        """The request ended (``ok`` False: failed or cancelled, and its timings teach nothing)."""
        e = self._entries.pop(request_id)
        pre, dec = e.prefill, e.decode
        if e.local:
            self._done_local(e, now_s, output_tokens, ok)
            return
        if e.phase == 0:
            self._account_busy(pre, now_s)
            pre.in_flight -= 1
            pre.pending_tokens -= e.prefill_tokens
            pre.active_tokens -= e.prompt_tokens
            if e.tracked is not None:
                e.tracked.release(pre.spec.instance_id, e.blocks)
        if e.tracked is not None:
            e.tracked.release(dec.spec.instance_id, e.blocks)
        dec.active_tokens -= e.prompt_tokens
        if e.phase < 2:
            pre.kv_committed_tokens -= e.prompt_tokens
            dec.pending_tokens -= e.predicted_output_tokens
        else:
            self._retire_started(dec, e, now_s, output_tokens, ok)
        dec.in_flight -= 1
        dec.kv_committed_tokens -= e.prompt_tokens + e.predicted_output_tokens

    def _done_local(self, e: _Entry, now_s: float, output_tokens: int, ok: bool) -> None:
        dec = e.decode
        if e.phase == 0:
            dec.local_prefill_tokens -= e.prefill_tokens
        if e.tracked is not None:
            e.tracked.release(dec.spec.instance_id, e.blocks)
        dec.active_tokens -= e.prompt_tokens
        if e.phase < 2:
            dec.pending_tokens -= e.predicted_output_tokens
        else:
            self._retire_started(dec, e, now_s, output_tokens, ok)
        dec.in_flight -= 1
        dec.kv_committed_tokens -= e.prompt_tokens + e.predicted_output_tokens

    def _retire_started(self, dec: _Book, e: _Entry, now_s: float, output_tokens: int, ok: bool) -> None:
        """A started request leaves its decode engine: its expiry goes, its TPOT teaches the rate."""
        expiry = dec.active.pop(e.key, None)
        if expiry is not None:
            dec.expiry_sum_s = dec.expiry_sum_s - expiry if dec.active else 0.0
        if ok and output_tokens >= 2:
            tpot = (now_s - e.first_token_s) / (output_tokens - 1)
            dec.rate.add(tpot, 1.0)
            dec.pool_rate.add(tpot, 1.0)

    def set_healthy(self, instance_id: str, healthy: bool) -> None:
        self._books[instance_id].healthy = healthy

    def record_sample(
        self, instance_id: str, kv_used_tokens: int, running: int, waiting: int, now_s: float
    ) -> None:
        """An engine metrics sample (the simulator's or a scrape of vLLM's /metrics)."""
        b = self._books[instance_id]
        b.kv_used_tokens = kv_used_tokens
        b.running = running
        b.waiting = waiting
        b.sampled_at_s = now_s

    def sampled_load(self, instance_id: str) -> tuple[int, int]:
        """(running requests, KV tokens in use) of the engine's last metrics sample."""
        b = self._books[instance_id]
        return b.running, b.kv_used_tokens

    # ---- estimates ----------------------------------------------------------------------------------

    def _account_busy(self, b: _Book, now_s: float) -> None:
        if b.in_flight > 0:
            b.busy_s += now_s - b.last_event_s
        b.last_event_s = now_s

    def _rate_s(self, b: _Book) -> float:
        # _Rate.value() written out: its float | None result is a boxed float in the compiled build
        r = b.rate
        if r.den > 0:
            return r.num / r.den
        r = b.pool_rate
        if r.den > 0:
            return r.num / r.den
        return b.prior_s

    def backlog_s(self, instance_id: str, now_s: float) -> float:
        b = self._books[instance_id]
        return self._backlog_s(b, now_s)

    def _backlog_s(self, b: _Book, now_s: float) -> float:
        pending_s = b.pending_tokens * self._rate_s(b) if b.pending_tokens > 0 else 0.0
        return self._started_s(b, now_s, pending_s) if b.decode else pending_s

    def _started_s(self, b: _Book, now_s: float, pending_s: float) -> float:
        """A decode instance's backlog: ``pending_s`` plus what its started requests have left."""
        heap = b.expiry_heap
        active = b.active
        while heap.top_key() <= now_s:
            entry = heap.pop()
            expiry = entry.key
            if active.pop(entry.order, None) is not None:
                # Reset on empty so float drift cannot accumulate over a long run.
                b.expiry_sum_s = b.expiry_sum_s - expiry if active else 0.0
        started_s = b.expiry_sum_s - float(len(active)) * now_s if active else 0.0
        return pending_s + started_s if started_s > 0.0 else pending_s  # max(): a generic call compiled

    def _states(
        self,
        books: list[_Book],
        now_s: float,
        cached_tokens: dict[str, int] | None,
        reuse: dict[str, float] | None,
        overlap: dict[str, int] | None,
    ) -> tuple[InstanceState, ...]:
        # One loop with the backlog's rate written out (a view of 256 instances is the larger part of a
        # decision there); the arithmetic is _backlog_s's, in the same order.
        out = []
        active = self._active
        shared = active.shared_tokens if active is not None else None
        for b in books:
            s = b.spec
            iid = s.instance_id
            pending = b.pending_tokens
            if pending > 0:
                r = b.rate
                if r.den > 0:
                    pending_s = pending * (r.num / r.den)
                else:
                    r = b.pool_rate
                    pending_s = pending * (r.num / r.den if r.den > 0 else b.prior_s)
            else:
                pending_s = 0.0
            out.append(
                InstanceState(
                    iid,
                    s.role,
                    b.healthy,
                    b.in_flight,
                    self._started_s(b, now_s, pending_s) if b.decode else pending_s,
                    b.kv_committed_tokens,
                    b.kv_used_tokens,
                    s.kv_capacity_tokens,
                    b.running,
                    b.waiting,
                    _INF if b.sampled_at_s is None else now_s - b.sampled_at_s,
                    cached_tokens.get(iid, 0) if cached_tokens else 0,
                    reuse[iid] if reuse is not None else 0.0,
                    b.local_prefill_tokens if b.decode else pending,
                    b.active_tokens,
                    shared[iid] if shared is not None else 0,
                    overlap.get(iid, 0) if overlap else 0,
                )
            )
        return tuple(out)

    def view(
        self,
        now_s: float,
        cached_tokens: dict[str, int] | None = None,
        reuse: dict[str, float] | None = None,
        active_overlap: dict[str, int] | None = None,
    ) -> ClusterView:
        """The pools now; ``cached_tokens`` (instance id -> tokens) is the prefix index's answer for the
        request being routed, absent instances holding none of it; ``reuse`` its evicted-reuse ratios;
        ``active_overlap`` the request's match against the engines' active sequences (``active_overlap``)."""
        return ClusterView(
            now_s,
            self.decisions,
            self._states(self._prefill, now_s, cached_tokens, reuse, active_overlap),
            self._states(self._decode, now_s, cached_tokens, reuse, active_overlap),
        )

    def in_flight_requests(self) -> int:
        return len(self._entries)
