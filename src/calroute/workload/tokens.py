"""Prompt token ids for a workload's requests, with the reuse its ``prefix_blocks`` describe, for every tier.

Block id ``b`` always becomes the same PREFIX_BLOCK_TOKENS token ids, a hash of ``b`` alone: two prompts
that name the same leading blocks start with the same tokens, so a real or emulated engine's prefix cache
(which hashes the tokens) sees the reuse the simulator models; different blocks differ from their first
tokens on (but for a chance of ``1 / (vocab_size - FIRST_TOKEN_ID)`` per token). The tokens past the last
named block hash ``(seed, request_id)``: the prompt's own.

Ids lie in ``[FIRST_TOKEN_ID, vocab_size)``. The default ``vocab_size`` of 1000 gives harness/prompts.py's
range, which every tier accepts: the emulator's 4,096-token vocabulary, the tiny test model's ~2k and any
real tokenizer, and clear of the low ids where tokenizers keep BOS, EOS and padding. A larger
``vocab_size`` may be given for a real model, but never past its regular vocabulary: the special tokens sit
above it (Qwen2.5's from 151,643). The stream is splitmix64 in numpy's wrapping uint64 arithmetic, fixed
by this code alone (numpy's Generator streams may change between versions).
"""

from __future__ import annotations

import hashlib

import numpy as np
import numpy.typing as npt

from calroute.errors import ConfigError
from calroute.types import PREFIX_BLOCK_TOKENS, RequestSpec

FIRST_TOKEN_ID = 10
DEFAULT_VOCAB_SIZE = 1000  # exclusive; harness/prompts.py's MAX_TOKEN_ID

GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # splitmix64's increment
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
# Keep a block's stream and a prompt's own stream apart even if a block id equals a tail's key.
_BLOCK_DOMAIN = np.uint64(0x626C6F636B000000)
_MASK64 = (1 << 64) - 1

U64Array = npt.NDArray[np.uint64]


def mix64(x: U64Array) -> U64Array:
    """splitmix64's output function, a bijection on uint64 (numpy's arithmetic wraps): the prompt
    generators' token streams are this of a counter (here, harness/prompts.py)."""
    x = (x ^ (x >> np.uint64(30))) * _MIX1
    x = (x ^ (x >> np.uint64(27))) * _MIX2
    out: U64Array = x ^ (x >> np.uint64(31))
    return out


def _splitmix(x: U64Array) -> U64Array:
    return mix64(x * GOLDEN + GOLDEN)


def _tail_key(request_id: str, seed: int) -> int:
    digest = hashlib.blake2b(f"{seed}:{request_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def prompt_token_ids(
    spec: RequestSpec, vocab_size: int = DEFAULT_VOCAB_SIZE, seed: int = 0
) -> npt.NDArray[np.int64]:
    """The ``spec.prompt_tokens`` token ids of the request's prompt (see the module docstring)."""
    if vocab_size <= FIRST_TOKEN_ID:
        raise ConfigError(f"vocab_size must be > {FIRST_TOKEN_ID}, got {vocab_size}")
    if spec.prompt_tokens < 1:
        raise ConfigError(f"{spec.request_id}: a prompt needs at least 1 token, got {spec.prompt_tokens}")
    blocks = spec.prefix_blocks
    if len(blocks) * PREFIX_BLOCK_TOKENS > spec.prompt_tokens:
        raise ConfigError(
            f"{spec.request_id}: {len(blocks)} prefix blocks of {PREFIX_BLOCK_TOKENS} tokens do not fit in "
            f"{spec.prompt_tokens} prompt tokens"
        )
    if any(b < 0 or b > _MASK64 for b in blocks):
        raise ConfigError(f"{spec.request_id}: block ids must be in [0, 2**64)")
    positions = np.arange(PREFIX_BLOCK_TOKENS, dtype=np.uint64)
    keys = _splitmix(np.array(blocks, dtype=np.uint64) ^ _BLOCK_DOMAIN)
    # Position j of block b: splitmix of (hash(b) + j), distinct over j since splitmix is a bijection.
    block_hashes = _splitmix(keys[:, None] + positions[None, :]).ravel()
    tail_tokens = spec.prompt_tokens - len(blocks) * PREFIX_BLOCK_TOKENS
    tail_hashes = _splitmix(
        np.arange(tail_tokens, dtype=np.uint64) + np.uint64(_tail_key(spec.request_id, seed))
    )
    hashes = np.concatenate((block_hashes, tail_hashes))
    ids: npt.NDArray[np.int64] = (hashes % np.uint64(vocab_size - FIRST_TOKEN_ID)).astype(np.int64)
    ids += FIRST_TOKEN_ID
    return ids
