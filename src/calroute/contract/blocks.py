"""vLLM's blocks: the block size, a prompt's chained block hashes as calroute computes them, and real vLLM's
KV-event block hashes translated into them (docs/prefix.md, "The real-vLLM tier").

vLLM names a cached block by its own chained hash (sha256 over cbor or pickle, or xxhash, of the parent's
hash, the block's tokens and extra keys, seeded by a NONE_HASH that may be random per process): the proxy
cannot compute it for a prompt, and need not. A ``BlockStored`` event carries the blocks' token ids and its
parent block's hash, so each vLLM hash can be translated into the router's (routing/block_hash.py), chained
on the translated parent, or on nothing for a prompt's first block. That works whatever hash function vLLM
is configured with, and the index then matches prompts hashed by the proxy as it matches the emulator's.

A translation is a function of the chain's tokens, so it is never wrong, only missing: a block whose parent
the translator does not know (events before the subscription, or lost, or a parent dropped at the cap) can
not be placed in the chain and is skipped, and so is every block after it (no leading run could reach them
anyway). Blocks hashed on more than their tokens (a LoRA adapter, a cache salt, multimodal features: vLLM's
extra keys) are skipped too: a prompt without them would not hit them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from calroute.routing.block_hash import block_hashes as chained_block_hashes

# vLLM's default --block-size, and the emulator's.
BLOCK_TOKENS = 16


def block_hashes(prompt_ids: Sequence[int]) -> list[int]:
    """Chained hashes of the prompt's full blocks of ``BLOCK_TOKENS`` (block i's covers every token up to its
    end), as 64-bit ints: the emulator's cache keys, its KV events' block hashes, and the router's
    prefix-index keys. One function (routing/block_hash.py) for all three, so the proxy's index hits
    exactly where the engine's cache does."""
    return chained_block_hashes(prompt_ids, BLOCK_TOKENS)


# Why a stored block was not translated (the ``reason`` label of the skipped-blocks counter).
SKIP_REASONS = ("unknown_parent", "block_size", "layout", "keyed", "token_ids")


class BlockTranslator:
    """One engine's map, vLLM block hash -> the router's hash of the same block (the chain's state there,
    so the blocks after it chain on it alone): entries added on BlockStored, dropped on BlockRemoved, all on
    AllBlocksCleared (or when the subscriber clears the engine's view), and bounded by ``max_blocks`` (least
    recently stored or chained on dropped first)."""

    def __init__(self, block_tokens: int, max_blocks: int) -> None:
        self.block_tokens = block_tokens
        self.max_blocks = max(1, max_blocks)
        self._links: OrderedDict[int, int] = OrderedDict()
        self.dropped = 0  # entries dropped at the cap

    def __len__(self) -> int:
        return len(self._links)

    def stored(
        self,
        blocks: list[int],
        parent: int | None,
        token_ids: Any,
        block_size: Any,
        plain_blocks: int | None,
    ) -> tuple[list[int], str | None]:
        """The router's hashes for a BlockStored's leading blocks that translate, and why the rest do not
        (one of SKIP_REASONS; None when all do). ``plain_blocks``: how many leading blocks are hashed on
        their tokens alone (None: all). Nothing here raises on what an engine sends."""
        if not blocks:
            return [], None
        if isinstance(block_size, bool) or block_size != self.block_tokens:
            # The engine's blocks are not the router's (a cluster file's block_tokens that does not match
            # the engine's --block-size): no hit could ever be counted right.
            return [], "block_size"
        if not isinstance(token_ids, list) or len(token_ids) != len(blocks) * self.block_tokens:
            # Blocks skipped in the event (sliding-window or masked blocks) or partial blocks: the tokens do
            # not line up with the hashes.
            return [], "layout"
        n = len(blocks) if plain_blocks is None else max(0, min(plain_blocks, len(blocks)))
        why = None if n == len(blocks) else "keyed"
        if n == 0:
            return [], why
        link: int | None = None
        if parent is not None:
            link = self._links.get(parent)
            if link is None:
                return [], "unknown_parent"
            self._links.move_to_end(parent)
        try:
            chain = chained_block_hashes(token_ids[: n * self.block_tokens], self.block_tokens, parent=link)
        except ValueError:
            return [], "token_ids"
        links = self._links
        for vllm_hash, own in zip(blocks, chain, strict=False):
            links[vllm_hash] = own
            links.move_to_end(vllm_hash)
        while len(links) > self.max_blocks:
            links.popitem(last=False)
            self.dropped += 1
        return chain, why

    def removed(self, blocks: list[int]) -> list[int]:
        """The router's hashes of the blocks the engine evicted (those it never translated are ignored)."""
        out = []
        for b in blocks:
            own = self._links.pop(b, None)
            if own is not None:
                out.append(own)
        return out

    def cleared(self) -> None:
        self._links.clear()
