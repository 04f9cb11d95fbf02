"""The proxy's part in prefix-aware routing (docs/prefix.md): a prompt's block hashes as the engines cache
them, and what a prefill engine says it served from its cache."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from calroute.contract.blocks import BLOCK_TOKENS
from calroute.contract.tokenizer import AsyncTokenizer, TokenizeError, Tokenizer
from calroute.routing.block_hash import PromptBlocks

# On a streamed answer: the prompt tokens the prefill engine served from its prefix cache, as it said (the
# client's view of prefix reuse; the load generator records it, harness/loadgen.py).
CACHED_TOKENS_HEADER = "x-calroute-cached-tokens"


def cached_tokens(out: dict[str, Any], kv: Any) -> int:
    """What the prefill engine served from its prefix cache: vLLM's (and OpenAI's)
    ``usage.prompt_tokens_details.cached_tokens`` where the engine reports it (vLLM with
    --enable-prompt-tokens-details), else the emulator's ``kv_transfer_params.remote_prefill_cached_tokens``;
    0 when neither is a count."""
    details = out.get("usage", {}).get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if cached is None and isinstance(kv, dict):
        cached = kv.get("remote_prefill_cached_tokens")
    return cached if isinstance(cached, int) and not isinstance(cached, bool) and cached >= 0 else 0


def prompt_blocks(
    body: dict[str, Any],
    chat: bool,
    tokenizer: Tokenizer | AsyncTokenizer | None,
    block_tokens: int = BLOCK_TOKENS,
    prompt_ids: npt.NDArray[np.uint64] | None = None,
) -> PromptBlocks:
    """The prompt's full blocks of ``block_tokens`` (the engines' block size), hashed as the engines' blocks
    are keyed in the index (routing/block_hash.py) from the token ids they would prefill: the ids as given
    for a token-id prompt, the ``tokenizer``'s for text and chat (none without one, or when it cannot read
    the body: the engine answers that body's error whatever the routing).

    Nothing is hashed here: the router hashes as far as its index can match (a few microseconds per 64
    blocks) and the rest only to record a placement. A token-id prompt is taken as ``prompt_ids``, the
    machine integers the proxy converted it to when it checked it (flight.board), or else as the body holds
    it; a negative id ends the prompt's blocks. The emulator's tokenizer costs about 2 ms for 8k tokens of
    text (its pieces memoised)."""
    if prompt_ids is not None:
        return PromptBlocks(prompt_ids, block_tokens)
    prompt = body.get("prompt")
    if not chat and isinstance(prompt, list) and prompt and type(prompt[0]) is int:
        return PromptBlocks(prompt, block_tokens)
    if tokenizer is None or isinstance(tokenizer, AsyncTokenizer):  # an async one answered at boarding
        return PromptBlocks([], block_tokens)
    try:
        return PromptBlocks(tokenizer.prompt_ids(body, chat), block_tokens)
    except TokenizeError:
        return PromptBlocks([], block_tokens)
