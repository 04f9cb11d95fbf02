"""Prompt token ids, the one generator for every tier: the simulated workloads' and the load generator's.

Ids lie in ``[FIRST_TOKEN_ID, vocab_size)``. The default ``vocab_size`` of 1000 is valid on every tier: the
emulator's 4,096-token vocabulary, the tiny test model's ~2k and any real tokenizer, and clear of the low ids
where tokenizers keep BOS, EOS and padding. A larger ``vocab_size`` may be given for a real model, but never
past its regular vocabulary: the special tokens sit above it (Qwen2.5's from 151,643).

A prompt is a few stretches, each a splitmix64 generator's stream (workload/splitmix.py) taken modulo the id
range, so it is fixed by this code alone (numpy's Generator streams may change between versions):

- ``prompt_token_ids(spec)``: the reuse a request's ``prefix_blocks`` describe. Block id ``b`` always becomes
  the same PREFIX_BLOCK_TOKENS ids, a stream seeded by ``b`` alone: two prompts that name the same leading
  blocks start with the same tokens, so a real or emulated engine's prefix cache (which hashes the tokens)
  sees the reuse the simulator models; different blocks differ from their first tokens on (but for a chance
  of ``1 / (vocab_size - FIRST_TOKEN_ID)`` per token). The tokens past the last named block are a stream
  seeded by ``(seed, request_id)``: the prompt's own.
- ``distinct_prompt_ids(key, length)``: a prompt all its own, for a request that reuses nothing. Prefix
  caching works on whole KV blocks (16 tokens) hashed from the start of the prompt, so two prompts sharing a
  first block would share cached KV and make the second prefill cheaper than the workload says. For an
  integer key (a request's index in its run) the first four tokens spell the index in base 990, so distinct
  indices below 990**4 (about 9.6e11) are guaranteed distinct first blocks; the rest is a stream seeded by
  ``(seed, key)``. A string key's stream alone tells prompts apart, with overwhelming probability.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from calroute.errors import ConfigError
from calroute.splitmix import GOLDEN, MASK64, splitmix64
from calroute.types import PREFIX_BLOCK_TOKENS, RequestSpec

FIRST_TOKEN_ID = 10
DEFAULT_VOCAB_SIZE = 1000  # exclusive
# Keep a block's stream and a prompt's own stream apart even if a block id equals a tail's key.
_BLOCK_DOMAIN = np.uint64(0x626C6F636B000000)
_HEADER_TOKENS = 4  # base-990 digits of an integer key: distinct first blocks for up to 990**4 requests

Int64Array = npt.NDArray[np.int64]


def _blake64(tag: str) -> int:
    return int.from_bytes(hashlib.blake2b(tag.encode(), digest_size=8).digest(), "little")


def _token_ids(length: int, state: int, blocks: Sequence[int], vocab_size: int) -> Int64Array:
    """``length`` ids: PREFIX_BLOCK_TOKENS for each of ``blocks``, then the stream seeded with ``state``.

    A block's stream is seeded with its hash times GOLDEN, which continues the generator seeded with 0 from
    its output number ``hash``: the recipe the workloads' token ids were first made with, kept as it was.
    """
    positions = np.arange(PREFIX_BLOCK_TOKENS, dtype=np.uint64)
    block_states = splitmix64(np.array(blocks, dtype=np.uint64) ^ _BLOCK_DOMAIN) * np.uint64(GOLDEN)
    block_hashes = splitmix64(positions[None, :], block_states[:, None]).ravel()
    own_hashes = splitmix64(np.arange(length - len(block_hashes), dtype=np.uint64), state)
    hashes = np.concatenate((block_hashes, own_hashes))
    ids: Int64Array = (hashes % np.uint64(vocab_size - FIRST_TOKEN_ID)).astype(np.int64)
    ids += FIRST_TOKEN_ID
    return ids


def prompt_token_ids(spec: RequestSpec, vocab_size: int = DEFAULT_VOCAB_SIZE, seed: int = 0) -> Int64Array:
    """The ``spec.prompt_tokens`` token ids of the request's prompt, its prefix blocks' first."""
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
    if any(b < 0 or b > MASK64 for b in blocks):
        raise ConfigError(f"{spec.request_id}: block ids must be in [0, 2**64)")
    state = _blake64(f"{seed}:{spec.request_id}") * GOLDEN & MASK64
    return _token_ids(spec.prompt_tokens, state, blocks, vocab_size)


def distinct_prompt_ids(key: int | str, length: int, seed: int = 0) -> Int64Array:
    """``length`` token ids in ``[FIRST_TOKEN_ID, DEFAULT_VOCAB_SIZE)``, distinct per key from the first
    block on (see the module docstring)."""
    if length < 1:
        raise ConfigError(f"a prompt needs at least 1 token, got length={length}")
    if isinstance(key, int) and key < 0:
        raise ConfigError(f"a prompt's integer key must be >= 0, got {key}")
    state = _blake64(f"{'i' if isinstance(key, int) else 's'}:{seed}:{key}")
    ids = _token_ids(length, state, (), DEFAULT_VOCAB_SIZE)
    if isinstance(key, int):
        span = DEFAULT_VOCAB_SIZE - FIRST_TOKEN_ID
        digits = [(key // span**p) % span + FIRST_TOKEN_ID for p in range(_HEADER_TOKENS - 1, -1, -1)]
        n = min(length, _HEADER_TOKENS)
        ids[:n] = digits[:n]
    return ids
