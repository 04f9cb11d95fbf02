"""A simulated engine's prefix cache, with vLLM's semantics at the workload's block size (docs/prefix.md).

A request pins its prompt's blocks while the engine holds its KV; an unpinned block stays cached, free, in
an LRU, until the room it takes is needed; a request's blocks are freed last block first, as vLLM frees
them, so the tail of a prompt is evicted before its head. A hit is the longest leading run of a prompt's
blocks that the engine holds, pinned by another request or free. As in vLLM, a prompt is never served
whole from cache: its last token is always computed, so at most ``(prompt_tokens - 1) // block_tokens``
blocks hit.

The engine's KV accounting (sim/prefill.py, sim/decode.py) counts each held prompt whole, a shared block
once per request that holds it; the cache keeps free blocks only in the room that accounting leaves
(``trim``). Both err the same way: a cluster under heavy sharing holds somewhat fewer blocks than vLLM.

``listener``, when given, hears what vLLM's KV events would say: blocks stored (first cached) and removed
(evicted), in the order they happen. The simulator delays them to the router's precise index.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

# (stored, blocks): True for BlockStored, False for BlockRemoved
CacheListener = Callable[[bool, tuple[int, ...]], None]


class BlockCache:
    __slots__ = ("block_tokens", "_pinned", "_free", "hits_tokens", "queried_tokens", "listener")

    def __init__(self, block_tokens: int, listener: CacheListener | None = None) -> None:
        self.block_tokens = block_tokens
        self._pinned: dict[int, int] = {}  # block -> requests holding it
        self._free: OrderedDict[int, None] = OrderedDict()  # cached, unpinned; oldest first
        self.hits_tokens = 0  # prompt tokens served from cache, over the run
        self.queried_tokens = 0  # prompt tokens of the requests that asked
        self.listener = listener

    def acquire(self, blocks: tuple[int, ...], prompt_tokens: int) -> int:
        """Pin ``blocks`` for a request; returns its prompt tokens served from cache."""
        pinned = self._pinned
        free = self._free
        limit = (prompt_tokens - 1) // self.block_tokens
        run = 0
        counting = True
        stored: list[int] = []
        for b in blocks:
            n = pinned.get(b, 0)
            if n:
                pinned[b] = n + 1
            elif b in free:
                del free[b]
                pinned[b] = 1
            else:
                pinned[b] = 1
                stored.append(b)
                counting = False
                continue
            if counting and run < limit:
                run += 1
            else:
                counting = False
        if stored and self.listener is not None:
            self.listener(True, tuple(stored))
        cached = run * self.block_tokens
        self.hits_tokens += cached
        self.queried_tokens += prompt_tokens
        return cached

    def peek(self, blocks: tuple[int, ...], prompt_tokens: int) -> int:
        """What ``acquire`` would serve from cache now, changing nothing (the oracle's view)."""
        pinned = self._pinned
        free = self._free
        limit = (prompt_tokens - 1) // self.block_tokens
        run = 0
        for b in blocks:
            if run >= limit or (b not in pinned and b not in free):
                break
            run += 1
        return run * self.block_tokens

    def peek_ahead(self, blocks: tuple[int, ...], prompt_tokens: int, coming: set[int]) -> int:
        """As ``peek``, counting also the ``coming`` blocks: those of prompts queued ahead, which will be
        cached by the time this one starts."""
        pinned = self._pinned
        free = self._free
        limit = (prompt_tokens - 1) // self.block_tokens
        run = 0
        for b in blocks:
            if run >= limit or (b not in pinned and b not in free and b not in coming):
                break
            run += 1
        return run * self.block_tokens

    def release(self, blocks: tuple[int, ...]) -> None:
        """The request no longer holds its KV: its blocks stay cached, the prompt's first block the most
        recently used. vLLM frees a request's blocks in reverse order "so that the tail blocks are evicted
        first" (KVCacheManager.free): a prompt's cached run shortens from its end under pressure, rather
        than losing its first block and with it every hit on the rest."""
        pinned = self._pinned
        free = self._free
        for b in reversed(blocks):
            n = pinned[b] - 1
            if n:
                pinned[b] = n
            else:
                del pinned[b]
                free[b] = None

    def trim(self, room_tokens: int) -> None:
        """Evict the least recently used free blocks until they fit in ``room_tokens``."""
        free = self._free
        keep = room_tokens // self.block_tokens if room_tokens > 0 else 0
        if len(free) <= keep:
            return
        removed: list[int] = []
        while len(free) > keep:
            removed.append(free.popitem(last=False)[0])
        if self.listener is not None:
            self.listener(False, tuple(removed))

    def holds(self, block: int) -> bool:
        return block in self._pinned or block in self._free

    @property
    def free_blocks(self) -> int:
        return len(self._free)
