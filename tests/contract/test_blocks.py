"""Translating real vLLM's block hashes into the router's, from crafted BlockStored events (no vLLM): the
index then matches a prompt hashed by the proxy exactly where the engine's cache would hit."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from calroute.contract.blocks import BlockTranslator
from calroute.routing.block_hash import block_hashes

B = 32


def vllm_hashes(tokens: list[int], parent: int | None = None) -> list[int]:
    """Stand-in for vLLM's hash: chained sha256 folded to 64 bits, unrelated to the router's."""
    out = []
    for i in range(len(tokens) // B):
        d = hashlib.sha256(f"{parent}:{tokens[i * B : (i + 1) * B]}".encode()).digest()
        parent = int.from_bytes(d[-8:], "big")
        out.append(parent)
    return out


PROMPT = [(7 * i) % 1000 for i in range(4 * B + 5)]
V = vllm_hashes(PROMPT)  # the engine's hashes of PROMPT's 4 full blocks
OWN = block_hashes(PROMPT, B)


def stored(tr: BlockTranslator, first: int, last: int, **kw: Any) -> tuple[list[int], str | None]:
    """The event vLLM publishes when it caches PROMPT's blocks first..last-1 (parent: the block before)."""
    args: dict[str, Any] = {
        "blocks": V[first:last],
        "parent": V[first - 1] if first else None,
        "token_ids": PROMPT[first * B : last * B],
        "block_size": B,
        "plain_blocks": None,
    }
    args.update(kw)
    return tr.stored(**args)


def test_blocks_chained_from_the_root_and_from_a_known_parent_get_the_routers_hashes() -> None:
    tr = BlockTranslator(B, max_blocks=100)
    assert stored(tr, 0, 2) == (OWN[:2], None)
    assert stored(tr, 2, 4) == (OWN[2:4], None)  # one step later, chained on block 1
    assert len(tr) == 4
    # another prompt sharing the first block: its second block chains on the shared one
    other = PROMPT[:B] + [999] * B
    v2 = vllm_hashes(other)
    assert tr.stored([v2[1]], V[0], other[B:], B, None) == ([block_hashes(other, B)[1]], None)


def test_an_unknown_parent_skips_the_event_and_what_chains_on_it() -> None:
    tr = BlockTranslator(B, max_blocks=100)
    assert stored(tr, 2, 3) == ([], "unknown_parent")  # the subscriber never saw blocks 0 and 1
    assert stored(tr, 3, 4) == ([], "unknown_parent")  # nor, then, block 2
    assert len(tr) == 0


def test_removal_drops_the_translation_and_a_clear_drops_all() -> None:
    tr = BlockTranslator(B, max_blocks=100)
    stored(tr, 0, 4)
    assert tr.removed([V[3], 12345]) == [OWN[3]]  # a hash never translated is ignored
    assert tr.removed([V[3]]) == []
    assert stored(tr, 3, 4) == ([OWN[3]], None)  # cached again on its (still known) parent
    tr.cleared()
    assert len(tr) == 0 and tr.removed(V) == []
    assert stored(tr, 1, 2) == ([], "unknown_parent")


def test_the_map_is_bounded_and_drops_the_least_recently_used() -> None:
    tr = BlockTranslator(B, max_blocks=3)
    stored(tr, 0, 1)
    stored(tr, 1, 4)  # chains on block 0 (used), then 4 entries: the oldest goes
    assert len(tr) == 3 and tr.dropped == 1
    assert tr.removed([V[0]]) == []  # block 0 was the least recently used
    assert stored(tr, 1, 2, blocks=[V[1]]) == ([], "unknown_parent")


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"block_size": 128}, "block_size"),  # the engine's blocks are not the cluster file's block_tokens
        ({"block_size": True}, "block_size"),
        ({"token_ids": PROMPT[: 2 * B - 1]}, "layout"),  # tokens and hashes do not line up
        ({"token_ids": None}, "layout"),
        ({"token_ids": ["x"] * 2 * B}, "token_ids"),
        ({"token_ids": [-1] * 2 * B}, "token_ids"),
        ({"plain_blocks": 0}, "keyed"),  # a LoRA adapter or a salt on the first block
    ],
)
def test_garbage_and_what_cannot_match_a_plain_prompt_is_skipped(change: dict[str, Any], why: str) -> None:
    tr = BlockTranslator(B, max_blocks=100)
    assert stored(tr, 0, 2, **change) == ([], why)
    assert len(tr) == 0


def test_blocks_before_the_first_keyed_one_are_translated() -> None:
    tr = BlockTranslator(B, max_blocks=100)
    assert stored(tr, 0, 4, plain_blocks=2) == (OWN[:2], "keyed")
    assert tr.removed(V) == OWN[:2]


def test_an_empty_event_is_nothing() -> None:
    assert BlockTranslator(B, 10).stored([], None, [], B, None) == ([], None)
