"""The proxy's part in prefix-aware routing (docs/prefix.md): a prompt's block hashes as the engines cache
them, and what a prefill engine says it served from its cache."""

from __future__ import annotations

from typing import Any

from calroute.engines.api import ApiError, prompt_token_ids
from calroute.engines.kvcache import BLOCK_TOKENS
from calroute.routing.block_hash import block_hashes as chained_block_hashes

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


def prompt_blocks(body: dict[str, Any], chat: bool, block_tokens: int = BLOCK_TOKENS) -> list[int]:
    """The prompt's full blocks of ``block_tokens`` (the engines' block size), hashed as the emulator hashes
    them (routing/block_hash.py) from the token ids it would prefill (its tokenizer for text, the ids as
    given otherwise). Measured on this machine: about 2 ms to tokenize an 8k-token text prompt (its pieces
    memoised) and 0.1 ms to hash its 512 blocks. Real vLLM tokenizes text with its own tokenizer, which the
    proxy does not load: there only token-id prompts hash as the engine does. A body the engine would refuse
    has no blocks: the engine's 400 is the answer, not a routing question."""
    try:
        return chained_block_hashes(prompt_token_ids(body, chat), block_tokens)
    except (ApiError, ValueError):
        return []
