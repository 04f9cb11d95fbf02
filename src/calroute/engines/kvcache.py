"""The emulated engine's KV cache: paged blocks, a prefix cache over freed blocks, and blocks held for a
remote decode engine (the prefill side of NixlConnector) until they are pulled or their lease expires."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

BLOCK_TOKENS = 16


def blocks_for(tokens: int) -> int:
    return -(-tokens // BLOCK_TOKENS)


def block_hashes(prompt_ids: Sequence[int]) -> list[bytes]:
    """Chained hashes of the prompt's full blocks: block i's hash covers every token up to its end."""
    out = []
    h = b""
    for start in range(0, len(prompt_ids) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
        chunk = b"".join(t.to_bytes(4, "little") for t in prompt_ids[start : start + BLOCK_TOKENS])
        h = hashlib.blake2b(h + chunk, digest_size=16).digest()
        out.append(h)
    return out


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

    def __init__(self, capacity_tokens: int) -> None:
        self.total_blocks = max(1, capacity_tokens // BLOCK_TOKENS)
        self.used_blocks = 0
        self._prefix: OrderedDict[bytes, None] = OrderedDict()
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

    def cached_prefix_tokens(self, hashes: Sequence[bytes]) -> int:
        hit = 0
        for h in hashes:
            if h not in self._prefix:
                break
            self._prefix.move_to_end(h)
            hit += 1
        return hit * BLOCK_TOKENS

    def remember(self, hashes: Sequence[bytes]) -> None:
        for h in hashes:
            self._prefix[h] = None
            self._prefix.move_to_end(h)
        while len(self._prefix) > self.total_blocks:
            self._prefix.popitem(last=False)

    def reset_prefix_cache(self) -> None:
        self._prefix.clear()

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
