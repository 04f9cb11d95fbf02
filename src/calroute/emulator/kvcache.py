"""The emulated engine's KV cache: vLLM's block pool in 16-token blocks (kvcache/pool.py, the model the
simulator's engines share), and blocks held for a remote decode engine (the prefill side of NixlConnector)
until they are pulled or their lease expires.

With events on, the pool's changes are recorded as vLLM's block pool queues them as KV events (docs/prefix.md,
"KV events on the wire"): blocks stored as they are cached, blocks evicted as an allocation takes their room,
the whole cache cleared. The engine core takes them once per step and publishes them (publisher.py, in
vLLM's wire format: contract/kv_events.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from calroute.contract.blocks import BLOCK_TOKENS
from calroute.contract.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from calroute.kvcache.pool import BlockPool, RequestBlocks


def blocks_for(tokens: int) -> int:
    return -(-tokens // BLOCK_TOKENS)


def held_blocks(rb: RequestBlocks) -> int:
    """The blocks a request holds: its cached ones and the rest, whole blocks (the emulator allocates no
    less)."""
    return len(rb.held) + rb.anon_tokens // BLOCK_TOKENS


@dataclass
class HeldKv:
    """Blocks a prefill engine keeps for a decode engine to pull."""

    request_id: str
    kv: RequestBlocks
    prompt_tokens: int
    block_ids: list[int]
    expires_at_s: float


class KvCache:
    """An engine's blocks. Cached blocks nobody holds are free (evictable), as in vLLM: usage counts only
    blocks held by requests, running or waiting to be pulled."""

    def __init__(self, capacity_tokens: int, record_events: bool = False) -> None:
        self.total_blocks = max(1, capacity_tokens // BLOCK_TOKENS)
        # None: events off (the default), so an engine nobody subscribes to keeps no event list.
        self._events: list[KvEvent] | None = [] if record_events else None
        self.pool = BlockPool(self.total_blocks * BLOCK_TOKENS, BLOCK_TOKENS, self if record_events else None)
        self.held: dict[str, HeldKv] = {}
        self._next_block_id = 0

    @property
    def free_blocks(self) -> int:
        return self.pool.free_tokens // BLOCK_TOKENS

    @property
    def used_blocks(self) -> int:
        return self.total_blocks - self.free_blocks

    def usage(self) -> float:
        return self.used_blocks / self.total_blocks

    # ---- a request's blocks ---------------------------------------------------------------------------

    def lookup(self, hashes: Sequence[int], num_tokens: int) -> int:
        """Blocks of ``hashes`` cached now, at most ``num_tokens - 1`` tokens' worth (vLLM's hit)."""
        return self.pool.lookup(hashes, num_tokens)

    def admission_blocks(self, hashes: Sequence[int], hit_blocks: int, new_blocks: int) -> int:
        return self.pool.admission_tokens(hashes, hit_blocks, new_blocks * BLOCK_TOKENS) // BLOCK_TOKENS

    def admit(
        self, rb: RequestBlocks, hashes: Sequence[int], hit_blocks: int, new_blocks: int, num_tokens: int
    ) -> bool:
        return self.pool.admit(rb, hashes, hit_blocks, new_blocks * BLOCK_TOKENS, num_tokens)

    def allocate(self, rb: RequestBlocks, blocks: int) -> bool:
        return self.pool.allocate(rb, blocks * BLOCK_TOKENS)

    def cache(
        self, rb: RequestBlocks, hashes: Sequence[int], full_blocks: int, tokens: Sequence[int]
    ) -> None:
        self.pool.cache(rb, hashes, full_blocks, tokens)

    def free(self, rb: RequestBlocks) -> None:
        self.pool.free(rb)

    def reset_prefix_cache(self) -> None:
        self.pool.clear()

    # ---- the pool's events, as vLLM's block pool queues them ------------------------------------------

    def stored(
        self, hashes: list[int], parent: int | None, first_block: int, tokens: Sequence[int] | None
    ) -> None:
        if self._events is not None:
            start = first_block * BLOCK_TOKENS
            ids = [] if tokens is None else list(tokens[start : start + len(hashes) * BLOCK_TOKENS])
            self._events.append(BlockStored(list(hashes), parent, ids))

    def removed(self, hashes: list[int]) -> None:
        if self._events is not None:
            self._events.append(BlockRemoved(list(hashes)))

    def cleared(self) -> None:
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

    def hold(self, request_id: str, rb: RequestBlocks, prompt_tokens: int, expires_at_s: float) -> HeldKv:
        blocks = held_blocks(rb)
        ids = list(range(self._next_block_id, self._next_block_id + blocks))
        self._next_block_id += blocks
        held = HeldKv(request_id, rb, prompt_tokens, ids, expires_at_s)
        self.held[request_id] = held
        return held

    def release_held(self, request_id: str) -> HeldKv | None:
        held = self.held.pop(request_id, None)
        if held is not None:
            self.free(held.kv)
        return held

    def expire_held(self, now_s: float) -> list[HeldKv]:
        expired = [h for h in self.held.values() if h.expires_at_s <= now_s]
        for h in expired:
            self.release_held(h.request_id)
        return expired

    def next_expiry_s(self) -> float | None:
        return min((h.expires_at_s for h in self.held.values()), default=None)
