"""Deterministic, exact-length token-id prompts, distinct per request.

A prompt is a function of (key, length, seed) only, so a run can be replayed byte for byte. Ids lie in
[MIN_TOKEN_ID, MAX_TOKEN_ID) = [10, 1000): valid for the emulator (4,096-token vocabulary) and for the real
tiny model, and clear of the low ids where models keep their special tokens (BOS, EOS, padding).

Prompts must differ from their first tokens on: prefix caching works on whole KV blocks (16 tokens) hashed
from the start of the prompt, so two prompts sharing a first block would share cached KV and make the
second prefill cheaper than the workload says. For an integer key (a request's index in its run) the first
four tokens spell the index in base 990, so distinct indices below 990**4 (about 9.6e11) are guaranteed
distinct first blocks; the rest are a hash of (seed, key, position). A string key is hashed (64 bits) into
every token, distinct with overwhelming probability.

The token stream is splitmix64 over the position (workload/tokens.mix64, in numpy's wrapping uint64
arithmetic): unlike numpy's Generator streams, whose output may change between numpy versions, it is fixed
by this code alone.
"""

from __future__ import annotations

import hashlib

import numpy as np
import numpy.typing as npt

from calroute.errors import ConfigError
from calroute.workload.tokens import GOLDEN, mix64

MIN_TOKEN_ID = 10
MAX_TOKEN_ID = 1000  # exclusive
_SPAN = MAX_TOKEN_ID - MIN_TOKEN_ID
_HEADER_TOKENS = 4  # base-990 digits of an integer key: distinct first blocks for up to 990**4 requests


def _key_hash(key: int | str, seed: int) -> int:
    tag = f"{'i' if isinstance(key, int) else 's'}:{seed}:{key}".encode()
    return int.from_bytes(hashlib.blake2b(tag, digest_size=8).digest(), "little")


def prompt_array(key: int | str, length: int, seed: int = 0) -> npt.NDArray[np.int64]:
    """The prompt as an int64 array of ``length`` ids in [10, 1000)."""
    if length < 1:
        raise ConfigError(f"a prompt needs at least 1 token, got length={length}")
    if isinstance(key, int) and key < 0:
        raise ConfigError(f"a prompt's integer key must be >= 0, got {key}")
    # splitmix64 of (hash + position * golden ratio); arrays wrap on overflow without warnings.
    x = mix64(np.arange(1, length + 1, dtype=np.uint64) * GOLDEN + np.uint64(_key_hash(key, seed)))
    ids: npt.NDArray[np.int64] = (x % np.uint64(_SPAN)).astype(np.int64) + MIN_TOKEN_ID
    if isinstance(key, int):
        digits = [(key // _SPAN**p) % _SPAN + MIN_TOKEN_ID for p in range(_HEADER_TOKENS - 1, -1, -1)]
        n = min(length, _HEADER_TOKENS)
        ids[:n] = digits[:n]
    return ids


def prompt_ids(key: int | str, length: int, seed: int = 0) -> list[int]:
    """The prompt as a list of ``length`` token ids in [10, 1000)."""
    return prompt_array(key, length, seed).tolist()  # type: ignore[no-any-return]


def prompt_json(key: int | str, length: int, seed: int = 0) -> bytes:
    """The prompt as a JSON array, e.g. ``b'[ 17,523, 88]'``, built without a per-token Python loop.

    Every id is written in a 3-character field (ids below 100 get a leading space, which JSON allows as
    whitespace), so the text is a numpy byte-matrix: about 50x faster than ``json.dumps`` of a list for a
    4,096-token prompt, which keeps a load generator's CPU for keeping its schedule.
    """
    return ids_json(prompt_array(key, length, seed))


def ids_json(ids: npt.NDArray[np.int64]) -> bytes:
    """Token ids in [0, 1000) as a JSON array, each in a 3-character field (see prompt_json)."""
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= 1000):
        raise ConfigError("ids_json writes token ids in [0, 1000) only")
    length = len(ids)
    cells = np.empty((length, 4), dtype=np.uint8)
    cells[:, 0] = np.where(ids < 100, ord(" "), ord("0") + ids // 100)
    cells[:, 1] = ord("0") + (ids // 10) % 10
    cells[:, 2] = ord("0") + ids % 10
    cells[:, 3] = ord(",")
    return b"[" + cells.tobytes()[:-1] + b"]"
