"""The router's view of the engines' prefix caches: which engine holds which prompt blocks.

One structure, two sources (docs/prefix.md):

- **approximate**: the router's own record of what it placed where (``placed``), as llm-d's approximate
  scorer and SGLang's ``cache_aware`` tree keep it;
- **precise**: the engines' KV events (``stored``, ``removed``, ``cleared``), as llm-d's precise scorer
  and Dynamo's KV router read vLLM's.

A block id stands for its block and everything before it (vLLM chains each block's hash on its parent's,
Mooncake's ``hash_ids`` mean the same), so an engine can serve a prompt's first k blocks from cache exactly
when it holds the first k ids; a hit is the longest such leading run. Each engine's blocks are an LRU
bounded by its KV capacity in blocks, whatever the source: an engine that reports more blocks than it can
hold (a buggy or hostile event stream) ages its oldest out, so the index never outgrows
``sum(capacities)`` entries. ``holders`` maps a block to a bitmask of the engines holding it, so a match
walks the prompt's blocks once for all engines.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import ClassVar

from calroute.errors import ConfigError
from calroute.routing._native import walk
from calroute.routing.block_hash import PromptBlocks
from calroute.types import InstanceSpec


def leading_runs(
    holders: dict[int, int], ids: list[str], running: int, blocks: Sequence[int], block_tokens: int
) -> dict[str, int]:
    """Per engine, the tokens of the longest leading run of ``blocks`` it holds (engines with none left
    out): ``holders`` maps a block to the bitmask of the engines holding it (bit i: ``ids[i]``), ``running``
    is the mask of the engines to look at. A ``PromptBlocks`` is hashed only as far as some engine holds its
    blocks. One walk over the blocks for every engine (the prefix index's match; the ledger's match against
    the engines' active sequences, routing/ledger.py)."""
    out: dict[str, int] = {}
    if not running:
        return out
    run = 0  # blocks walked
    for part in blocks.stretches() if isinstance(blocks, PromptBlocks) else (blocks,):
        # In C (_native.c), a dict lookup a block: Python's groupby over the lookups took about
        # 30 us for 511 blocks. Only the places where engines leave the running set come back.
        walked, drops, running, ended = walk(holders, part if type(part) is list else list(part), running)
        for i, dropped in drops:
            if run + i:
                if dropped & (dropped - 1):
                    _credit(out, dropped, (run + i) * block_tokens, ids)
                else:  # one engine, the usual case
                    out[ids[dropped.bit_length() - 1]] = (run + i) * block_tokens
        run += walked
        if ended:  # a block nobody holds, or nobody holds all blocks so far: hash and walk no further
            break
    if run:
        _credit(out, running, run * block_tokens, ids)
    return out


def _credit(out: dict[str, int], mask: int, tokens: int, ids: list[str]) -> None:
    while mask:  # over the set bits only: a 256-engine pool loses a few engines per block
        low = mask & -mask
        out[ids[low.bit_length() - 1]] = tokens
        mask ^= low


class PrefixIndex:
    # Whether the engines' KV events feed this index (the proxy's PreciseIndex): then it is not the router's
    # own placements alone, and a policy that routes on those (``prefix_source = "approximate"``) gets an
    # index of its own (routing/router.py).
    hears_events: ClassVar[bool] = False

    def __init__(self, instances: Sequence[InstanceSpec], block_tokens: int) -> None:
        if block_tokens < 1:
            raise ConfigError(f"prefix block size must be >= 1 token, got {block_tokens}")
        self.block_tokens = block_tokens
        self._specs = tuple(instances)
        self._ids = [s.instance_id for s in instances]
        self._bit = {iid: 1 << i for i, iid in enumerate(self._ids)}
        self._all = (1 << len(self._ids)) - 1
        self._capacity_blocks = {
            s.instance_id: max(1, s.kv_capacity_tokens // block_tokens) for s in instances
        }
        self._lru: dict[str, OrderedDict[int, None]] = {iid: OrderedDict() for iid in self._ids}
        self._holders: dict[int, int] = {}
        # Blocks each engine evicted lately (bounded like its cache), and how many of its evictions a
        # later request wanted back: decayed over about one cache's worth of evictions.
        self._ghost: dict[str, OrderedDict[int, None]] = {iid: OrderedDict() for iid in self._ids}
        self._evicted = dict.fromkeys(self._ids, 0.0)
        self._regretted = dict.fromkeys(self._ids, 0.0)
        self._decay = {iid: 1.0 - 1.0 / cap for iid, cap in self._capacity_blocks.items()}
        # reuse_ratio per engine, refreshed whenever its counts change (once per event, not per decision)
        self._reuse = dict.fromkeys(self._ids, 0.0)

    def placements_only(self) -> PrefixIndex:
        """An empty index of the same engines, capacities and block size (for the router's placements
        alone)."""
        return PrefixIndex(self._specs, self.block_tokens)

    # ---- queries ------------------------------------------------------------------------------------

    def match(self, blocks: Sequence[int]) -> dict[str, int]:
        """Cached prompt tokens per engine: the longest leading run of ``blocks`` each holds (engines with
        none are left out). A ``PromptBlocks`` is hashed only as far as some engine holds its blocks."""
        return leading_runs(self._holders, self._ids, self._all, blocks, self.block_tokens)

    def reuse_ratio(self, instance_id: str) -> float:
        """Of the blocks this engine evicted lately, the share that a later request wanted back: what one
        more evicted block is likely to cost, as a probability of recomputing it."""
        evicted = self._evicted[instance_id]
        return self._regretted[instance_id] / evicted if evicted >= 1.0 else 0.0

    def reuse_ratios(self) -> dict[str, float]:
        return self._reuse.copy()

    def capacity_blocks(self, instance_id: str) -> int:
        """How many blocks the index keeps for this engine (its KV capacity in blocks)."""
        return self._capacity_blocks[instance_id]

    def blocks_held(self, instance_id: str) -> int:
        return len(self._lru[instance_id])

    def __len__(self) -> int:
        """Distinct blocks held anywhere."""
        return len(self._holders)

    # ---- sources ------------------------------------------------------------------------------------

    def placed(self, instance_id: str, blocks: Iterable[int]) -> None:
        """The router sent a prompt with these blocks to this engine (approximate source)."""
        self.stored(instance_id, blocks)

    def stored(self, instance_id: str, blocks: Iterable[int]) -> None:
        """The engine holds these blocks now (most recently used), a prompt's blocks in order: its first
        block is taken as the most recent of them, since an engine frees a request's blocks last first
        (vLLM's KVCacheManager.free, "so that the tail blocks are evicted first"), and ages the tail out
        before the head."""
        lru = self._lru[instance_id]
        bit = self._bit[instance_id]
        holders = self._holders
        ghost = self._ghost[instance_id]
        for b in reversed(blocks if isinstance(blocks, (list, tuple)) else list(blocks)):
            if b in lru:
                lru.move_to_end(b)
            else:
                lru[b] = None
                holders[b] = holders.get(b, 0) | bit
                if b in ghost:
                    del ghost[b]
                    self._regretted[instance_id] += 1.0
        cap = self._capacity_blocks[instance_id]
        while len(lru) > cap:
            old, _ = lru.popitem(last=False)
            self._drop(old, bit)
            self._evict(instance_id, old, cap)
        self._reuse[instance_id] = self.reuse_ratio(instance_id)

    def removed(self, instance_id: str, blocks: Iterable[int]) -> None:
        """The engine evicted these blocks (unknown ones are ignored: events may overtake the index)."""
        lru = self._lru[instance_id]
        bit = self._bit[instance_id]
        cap = self._capacity_blocks[instance_id]
        for b in blocks:
            if b in lru:
                del lru[b]
                self._drop(b, bit)
                self._evict(instance_id, b, cap)
        self._reuse[instance_id] = self.reuse_ratio(instance_id)

    def cleared(self, instance_id: str) -> None:
        """The engine dropped its whole cache (vLLM's AllBlocksCleared; also a restarted engine)."""
        lru = self._lru[instance_id]
        bit = self._bit[instance_id]
        for b in lru:
            self._drop(b, bit)
        lru.clear()

    def _evict(self, instance_id: str, block: int, cap: int) -> None:
        ghost = self._ghost[instance_id]
        ghost[block] = None
        if len(ghost) > cap:
            ghost.popitem(last=False)
        d = self._decay[instance_id]
        self._evicted[instance_id] = self._evicted[instance_id] * d + 1.0
        self._regretted[instance_id] *= d

    def _drop(self, block: int, bit: int) -> None:
        rest = self._holders.get(block, 0) & ~bit
        if rest:
            self._holders[block] = rest
        else:
            self._holders.pop(block, None)
