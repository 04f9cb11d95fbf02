"""Chained hashes of a prompt's full token blocks, for the prefix index (docs/prefix.md).

Block j's hash stands for the prompt's first (j + 1) x block_tokens tokens, as vLLM's chained block hashes
do, so two prompts share their first k hashes exactly when they share their first k blocks of tokens.

vLLM hashes block by block with sha256 (in Python; about half a millisecond for an 8k-token prompt here),
which a router deciding in tens of microseconds cannot afford on every request. This one is a polynomial
over the token ids, ``S_t = S_(t-1) x Q + token_t`` mod 2^64 (Q odd), from a root that is the block size,
and block j's hash is S at the block's last token. So a block's hash is the chain's state there: hashing
resumes from any block's hash (``parent``). The loop is in C (``_native.c``: about 3 us for 8k tokens,
against about 20 for the numpy version it replaced, whose fixed cost per call dominated). It is not a
cryptographic hash: a client could craft two prompts whose blocks collide (as for any polynomial hash mod
2^64), and the cost would be a misrouted request (the engine computes what it does not hold). The emulator
caches under the same hashes, so the router's index and the engines' KV events speak of the same blocks;
against real vLLM the precise source needs vLLM's own hash (docs/prefix.md).

Turning a list of Python ints into machine integers costs about 3.5 ns a token, more than hashing them, so
the proxy converts a token-id prompt once (``machine_token_ids``), and a router that needs only the blocks
some engine may hold hashes no further: ``PromptBlocks`` hashes a prompt in stretches as they are asked for
(the prefix index's match stops at the first block no engine holds).
"""

from __future__ import annotations

import array
from collections.abc import Iterator, Sequence
from typing import Any, Final, overload

import numpy as np
import numpy.typing as npt

from calroute.routing._native import chain

_U64 = np.uint64
_MASK64: Final = (1 << 64) - 1
# A sanity bound on the block size (vLLM's are 16 to a few hundred tokens; Mooncake's trace uses 512).
_MAX_BLOCK_TOKENS: Final = 1 << 17

TokenIds = Sequence[int] | npt.NDArray[np.integer]


def root_hash(block_tokens: int) -> int:
    """The chain's state before a prompt's first block: the block size, so that prompts hashed in
    different block sizes do not share hashes."""
    return block_tokens


def _stretch(tokens: TokenIds, start: int, block_tokens: int, n: int, parent: int) -> list[int]:
    """The hashes of ``n`` full blocks of ``tokens`` from token ``start`` on, chained from ``parent``.
    ValueError for a token id that is negative, too large or not an integer."""
    if isinstance(tokens, np.ndarray):
        if tokens.dtype != _U64:
            if not np.issubdtype(tokens.dtype, np.integer):
                raise ValueError(f"token ids must be integers, got an array of {tokens.dtype}")
            signed = tokens[start : start + n * block_tokens]
            if signed.size and int(signed.min()) < 0:
                raise ValueError("token ids must be >= 0")
            return chain(signed.astype(_U64), 0, block_tokens, n, parent)
        # the proxy's array (machine_token_ids): no check and no copy
        machine_ids = tokens if tokens.flags.c_contiguous else np.ascontiguousarray(tokens)
        return chain(machine_ids, start, block_tokens, n, parent)
    head = tokens[start : start + n * block_tokens]
    machine = array.array("Q")
    try:
        # array.array's fromlist converts a list of ints five times faster than np.asarray (3.5 ns a token
        # here), a third faster than array.array("Q", list)
        if isinstance(head, list):
            machine.fromlist(head)
        else:
            machine.extend(head)
    except (OverflowError, TypeError) as e:
        raise ValueError(f"token ids must be integers in [0, 2^64): {e}") from e
    return chain(machine, 0, block_tokens, n, parent)


def machine_token_ids(ids: Any) -> npt.NDArray[np.uint64] | None:
    """A prompt's token ids as machine integers, or None unless ``ids`` is a non-empty list of ints (JSON
    integers: not bools) in [0, 2^64). The conversion checks types and range as it goes, in C (about 3.5
    ns an id, against about 25 for a Python loop over them; a signed array converts four times slower);
    bools pass it as 0 and 1, so the places holding 0 or 1 are looked at one by one. The proxy checks a
    token-id prompt with it and hands the array on to ``PromptBlocks``, which hashes it without converting
    it again."""
    if not isinstance(ids, list) or not ids:
        return None
    machine = array.array("Q")
    try:
        machine.fromlist(ids)
    except (TypeError, OverflowError):
        return None
    out = np.frombuffer(machine, dtype=_U64)
    for i in np.flatnonzero(out <= 1).tolist():
        if type(ids[i]) is not int:
            return None
    return out


def _check_block_tokens(block_tokens: int) -> None:
    if not 1 <= block_tokens <= _MAX_BLOCK_TOKENS:
        raise ValueError(f"block_tokens must be in [1, {_MAX_BLOCK_TOKENS}], got {block_tokens}")


def block_hashes(token_ids: TokenIds, block_tokens: int, parent: int | None = None) -> list[int]:
    """One hash per full block of ``block_tokens`` tokens (a trailing partial block has none), chained from
    ``parent`` (the hash of the block before the first of ``token_ids``; None: they start a prompt), so
    ``block_hashes(ids[k * B:], B, parent=block_hashes(ids, B)[k - 1]) == block_hashes(ids, B)[k:]``.

    ValueError for a token id that is negative or not an integer (a client's prompt is untrusted)."""
    _check_block_tokens(block_tokens)
    state = root_hash(block_tokens) if parent is None else parent & _MASK64
    return _stretch(token_ids, 0, block_tokens, len(token_ids) // block_tokens, state)


class PromptBlocks(Sequence[int]):
    """A prompt's block hashes (those of ``block_hashes``), computed in stretches as they are asked for.

    ``stretches()`` hashes from the first block on, each stretch twice as long as the one before (from
    ``first_blocks``): a reader that stops early, as the prefix index's match does at the first block no
    engine holds, leaves the rest of the prompt unconverted. Indexing or iterating hashes as far as needed.
    A token id that cannot be hashed (negative, not an integer) ends the prompt's blocks where its stretch
    begins, and ``len`` shrinks to that; an engine refuses such a prompt anyway.
    """

    __slots__ = ("_tokens", "block_tokens", "_n", "_hashes", "_next_size")

    def __init__(self, token_ids: TokenIds, block_tokens: int, first_blocks: int = 64) -> None:
        _check_block_tokens(block_tokens)
        if first_blocks < 1:
            raise ValueError(f"first_blocks must be >= 1, got {first_blocks}")
        self._tokens = token_ids
        self.block_tokens = block_tokens
        self._n = len(token_ids) // block_tokens
        self._hashes: list[int] = []
        self._next_size = first_blocks

    def __len__(self) -> int:
        return self._n

    @property
    def hashed(self) -> int:
        """How many blocks are hashed so far."""
        return len(self._hashes)

    def _extend(self) -> list[int]:
        """Hash the next stretch; [] when every block is hashed (or a bad token id ended the prompt)."""
        done = len(self._hashes)
        k = min(self._n - done, self._next_size)
        if k <= 0:
            return []
        parent = self._hashes[-1] if done else root_hash(self.block_tokens)
        try:
            part = _stretch(self._tokens, done * self.block_tokens, self.block_tokens, k, parent)
        except ValueError:
            self._n = done
            return []
        self._hashes += part
        self._next_size *= 2
        return part

    def stretches(self) -> Iterator[list[int]]:
        """The hashes from the first block on, in consecutive stretches (already hashed ones first)."""
        if self._hashes:
            yield self._hashes[:]
        while part := self._extend():
            yield part

    def all(self) -> list[int]:
        """Every block's hash (hashing the rest)."""
        while self._extend():
            pass
        return self._hashes

    @overload
    def __getitem__(self, i: int) -> int: ...

    @overload
    def __getitem__(self, i: slice) -> list[int]: ...

    def __getitem__(self, i: int | slice) -> int | list[int]:
        if isinstance(i, slice):
            start, stop, _ = i.indices(self._n)
            while len(self._hashes) < stop and self._extend():
                pass
            return self._hashes[i]
        j = i + self._n if i < 0 else i
        while len(self._hashes) <= j < self._n and self._extend():
            pass
        if not 0 <= j < len(self._hashes):
            raise IndexError("block index out of range")
        return self._hashes[j]

    def __iter__(self) -> Iterator[int]:
        for part in self.stretches():
            yield from part
