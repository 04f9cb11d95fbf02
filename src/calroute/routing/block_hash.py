"""Chained hashes of a prompt's full token blocks, for the prefix index (docs/prefix.md).

Block j's hash stands for the prompt's first (j + 1) x block_tokens tokens, as vLLM's chained block hashes
do, so two prompts share their first k hashes exactly when they share their first k blocks of tokens.

vLLM hashes block by block with sha256 (in Python; about half a millisecond for an 8k-token prompt here),
which a router deciding in tens of microseconds cannot afford on every request. This one is vectorized
with numpy: each block's tokens are folded into a 64-bit word and mixed, and the chain is a polynomial in
those words, ``H_j = sum_{b <= j} h_b * P^(j - b)`` mod 2^64, computed for every j at once as
``P^j * cumsum(h_b * P^-b)`` (P odd, so invertible mod 2^64); each H_j is mixed again with j. It is not a
cryptographic hash: a client could craft two prompts whose blocks collide, and the cost would be a
misrouted request (the engine computes what it does not hold). The emulator caches under the same
hashes, so the router's index and the engines' KV events speak of the same blocks. Real vLLM hashes with
its own function, so the proxy translates its events' blocks into these hashes from the tokens they carry
(``extend_chain``: the blocks after a known one, without the tokens before it; proxy/vllm_blocks.py).
"""

from __future__ import annotations

import array
from collections.abc import Sequence
from typing import Final, NamedTuple

import numpy as np
import numpy.typing as npt

_U64 = np.uint64
_FOLD: Final = _U64(0x9E3779B97F4A7C15)  # token position weights within a block: powers of this
_P: Final = 0xD6E8FEB86659FD93  # the chain's base, odd
_P_INV: Final = pow(_P, -1, 1 << 64)
_M1: Final = _U64(0xBF58476D1CE4E5B9)
_M2: Final = _U64(0x94D049BB133111EB)
_S30: Final = _U64(30)
_S27: Final = _U64(27)
_S31: Final = _U64(31)


def _mix(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """splitmix64's finalizer, elementwise (wrapping uint64 arithmetic)."""
    x = (x ^ (x >> _S30)) * _M1
    x = (x ^ (x >> _S27)) * _M2
    return x ^ (x >> _S31)


def _powers(base: int, n: int) -> npt.NDArray[np.uint64]:
    """base^0 .. base^(n-1) mod 2^64 (n >= 1)."""
    out = np.full(n, base, dtype=_U64)
    out[0] = 1
    return np.cumprod(out, dtype=_U64)


# Computed once: the tables a call slices (prompts up to _TABLE_BLOCKS blocks; longer ones compute theirs).
_TABLE_BLOCKS: Final = 8192
with np.errstate(over="ignore"):
    _P_POW: Final = _powers(_P, _TABLE_BLOCKS)
    _P_INV_POW: Final = _powers(_P_INV, _TABLE_BLOCKS)
    _SALT: Final = _mix(np.arange(1, _TABLE_BLOCKS + 1, dtype=_U64))
    _FOLD_POW: Final = _powers(int(_FOLD), _TABLE_BLOCKS)
_P_POW.flags.writeable = False
_P_INV_POW.flags.writeable = False
_SALT.flags.writeable = False
_FOLD_POW.flags.writeable = False


def _block_words(
    token_ids: Sequence[int] | npt.NDArray[np.integer], n: int, block_tokens: int
) -> npt.NDArray[np.uint64]:
    """Each of the first ``n`` full blocks folded into one mixed 64-bit word (ValueError for bad ids).
    Called under ``np.errstate(over="ignore")``: the arithmetic wraps mod 2^64 on purpose."""
    head = token_ids[: n * block_tokens]
    if isinstance(head, np.ndarray):
        if head.size and int(head.min()) < 0:
            raise ValueError("token ids must be >= 0")
        flat = head.astype(_U64, copy=False)
    else:
        try:
            # through array.array: three times faster than np.asarray on a list of ints
            flat = np.frombuffer(array.array("Q", head), dtype=_U64)
        except (OverflowError, TypeError) as e:
            raise ValueError(f"token ids must be integers in [0, 2^64): {e}") from e
    tokens = flat.reshape(n, block_tokens)
    weights = _FOLD_POW[:block_tokens] if block_tokens <= _TABLE_BLOCKS else _powers(int(_FOLD), block_tokens)
    # an integer matmul wraps mod 2^64 like the elementwise ops, at half their cost
    return _mix(tokens @ weights + _U64(block_tokens))


def block_hashes(token_ids: Sequence[int] | npt.NDArray[np.integer], block_tokens: int) -> list[int]:
    """One hash per full block of ``block_tokens`` tokens (a trailing partial block has none).

    ValueError for a token id that is negative or not an integer (a client's prompt is untrusted)."""
    n = len(token_ids) // block_tokens
    if n == 0:
        return []
    with np.errstate(over="ignore"):
        words = _block_words(token_ids, n, block_tokens)
        if n <= _TABLE_BLOCKS:
            p_pow, p_inv_pow, salt = _P_POW[:n], _P_INV_POW[:n], _SALT[:n]
        else:
            p_pow, p_inv_pow = _powers(_P, n), _powers(_P_INV, n)
            salt = _mix(np.arange(1, n + 1, dtype=_U64))
        hashes = _mix(p_pow * np.cumsum(words * p_inv_pow, dtype=_U64) ^ salt)
    return hashes.tolist()  # type: ignore[no-any-return]


class ChainLink(NamedTuple):
    """One block of a chain: its hash, and what the blocks after it need to chain on it without the
    tokens before it (how many blocks the chain has up to it, and the chain's running sum there)."""

    block_hash: int
    blocks: int
    acc: int


def _pow_range(table: npt.NDArray[np.uint64], base: int, start: int, n: int) -> npt.NDArray[np.uint64]:
    """base^start .. base^(start + n - 1) mod 2^64."""
    if start + n <= _TABLE_BLOCKS:
        return table[start : start + n]
    return _U64(pow(base, start, 1 << 64)) * _powers(base, n)


def extend_chain(
    parent: ChainLink | None, token_ids: Sequence[int] | npt.NDArray[np.integer], block_tokens: int
) -> list[ChainLink]:
    """The full blocks of ``token_ids`` chained on ``parent`` (None: they start the prompt), as links whose
    hashes are what ``block_hashes`` gives those blocks within the whole prompt. ValueError for bad ids."""
    n = len(token_ids) // block_tokens
    if n == 0:
        return []
    start, acc0 = (0, 0) if parent is None else (parent.blocks, parent.acc)
    with np.errstate(over="ignore"):
        words = _block_words(token_ids, n, block_tokens)
        p_pow = _pow_range(_P_POW, _P, start, n)
        p_inv_pow = _pow_range(_P_INV_POW, _P_INV, start, n)
        if start + n <= _TABLE_BLOCKS:
            salt = _SALT[start : start + n]
        else:
            salt = _mix(np.arange(start + 1, start + n + 1, dtype=_U64))
        accs = np.cumsum(words * p_inv_pow, dtype=_U64) + _U64(acc0)
        hashes = _mix(p_pow * accs ^ salt)
    return [
        ChainLink(h, start + 1 + i, a)
        for i, (h, a) in enumerate(zip(hashes.tolist(), accs.tolist(), strict=True))
    ]
