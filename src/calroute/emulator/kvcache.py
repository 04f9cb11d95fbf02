"""The emulated engine's KV cache: paged blocks, a prefix cache over freed blocks, and blocks held for a
remote decode engine (the prefill side of NixlConnector) until they are pulled or their lease expires.

With events on, the prefix cache records what vLLM's block pool publishes as KV events (docs/prefix.md, "KV
events on the wire"): blocks stored, blocks evicted, the whole cache cleared. The engine core takes them
once per step and publishes them (publisher.py, in vLLM's wire format: contract/kv_events.py).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from calroute.contract.blocks import BLOCK_TOKENS
from calroute.contract.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent


def blocks_for(tokens: int) -> int:
    return -(-tokens // BLOCK_TOKENS)


@dataclass
class HeldKv:
    """Blocks a prefill engine keeps for a decode engine to pull."""

    request_id: str
    blocks: int
    prompt_tokens: int
    block_ids: list[int]
    expires_at_s: float


class KvCache:
    """Block accounting. Cached prefix blocks are free (evictable), as in vLLM: usage counts only blocks
    held by requests, running or waiting to be pulled."""

    def __init__(self, capacity_tokens: int, record_events: bool = False) -> None:
        self.total_blocks = max(1, capacity_tokens // BLOCK_TOKENS)
        # None: events off (the default), so an engine nobody subscribes to keeps no event list.
        self._events: list[KvEvent] | None = [] if record_events else None
        self.used_blocks = 0
        self._prefix: OrderedDict[int, None] = OrderedDict()
        self.held: dict[str, HeldKv] = {}
        self._next_block_id = 0

    @property
    def free_blocks(self) -> int:
        return self.total_blocks - self.used_blocks

    def usage(self) -> float:
        return self.used_blocks / self.total_blocks

    def try_allocate(self, blocks: int) -> bool:
        if blocks > self.free_blocks:
            return False
        self.used_blocks += blocks
        return True

    def free(self, blocks: int) -> None:
        self.used_blocks -= blocks
        if self.used_blocks < 0:
            raise RuntimeError("KV blocks freed twice")

    # ---- prefix cache ---------------------------------------------------------------------------------

    def cached_prefix_tokens(self, hashes: Sequence[int]) -> int:
        prefix = self._prefix
        hit = 0
        for h in hashes:
            if h not in prefix:
                break
            hit += 1
        for h in reversed(hashes[:hit]):  # touched as ``remember`` orders them: the first block last
            prefix.move_to_end(h)
        return hit * BLOCK_TOKENS

    def remember(self, hashes: Sequence[int], prompt_ids: Sequence[int] = ()) -> None:
        """Cache a finished prompt's full blocks (``prompt_ids``: its tokens, for the BlockStored events)."""
        events = self._events
        prefix = self._prefix
        if events is not None:
            run_start = -1  # first block of the current run of newly cached blocks
            for i, h in enumerate(hashes):
                if h in prefix:
                    if run_start >= 0:
                        events.append(self._stored(hashes, run_start, i, prompt_ids))
                        run_start = -1
                elif run_start < 0:
                    run_start = i
            if run_start >= 0:
                events.append(self._stored(hashes, run_start, len(hashes), prompt_ids))
        # Most recently used in reverse, the first block last: vLLM frees a request's blocks "in reverse
        # order so that the tail blocks are evicted first" (KVCacheManager.free), so a prompt's cached run
        # shortens from its end instead of losing its first block and every hit with it.
        for h in reversed(hashes):
            prefix[h] = None
            prefix.move_to_end(h)
        evicted = []
        while len(prefix) > self.total_blocks:
            old, _ = prefix.popitem(last=False)
            evicted.append(old)
        if events is not None and evicted:
            events.append(BlockRemoved(evicted))

    @staticmethod
    def _stored(hashes: Sequence[int], start: int, end: int, prompt_ids: Sequence[int]) -> BlockStored:
        # A run that starts past block 0 chains on the block before it, which is cached (a hit or stored
        # earlier in this call), as vLLM's BlockStored names the parent of a run it stores.
        parent = hashes[start - 1] if start else None
        tokens = list(prompt_ids[start * BLOCK_TOKENS : end * BLOCK_TOKENS])
        return BlockStored(list(hashes[start:end]), parent, tokens)

    def reset_prefix_cache(self) -> None:
        self._prefix.clear()
        if self._events is not None:
            self._events.append(AllBlocksCleared())

    def take_events(self) -> list[KvEvent]:
        """The events recorded since the last call (none with events off)."""
        events = self._events
        if not events:
            return []
        self._events = []
        return events

    # ---- blocks held for a remote decode ----------------------------------------------------------------

    def hold(self, request_id: str, blocks: int, prompt_tokens: int, expires_at_s: float) -> HeldKv:
        ids = list(range(self._next_block_id, self._next_block_id + blocks))
        self._next_block_id += blocks
        held = HeldKv(request_id, blocks, prompt_tokens, ids, expires_at_s)
        self.held[request_id] = held
        return held

    def release_held(self, request_id: str) -> HeldKv | None:
        held = self.held.pop(request_id, None)
        if held is not None:
            self.free(held.blocks)
        return held

    def expire_held(self, now_s: float) -> list[HeldKv]:
        expired = [h for h in self.held.values() if h.expires_at_s <= now_s]
        for h in expired:
            self.release_held(h.request_id)
        return expired

    def next_expiry_s(self) -> float | None:
        return min((h.expires_at_s for h in self.held.values()), default=None)
