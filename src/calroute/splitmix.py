"""splitmix64, the package's one stateless hash of integers: fixed by this code alone, where numpy's Generator
streams may change between numpy versions and Python's ``hash`` of a string changes between processes.

``mix64`` is splitmix64's output function with its xor-shifts as a parameter. Two sets are in use, and
each must stay as it is, since what it made is pinned (prompts' token ids, the emulator's greedy tokens, the
random policies' picks):

- ``SPLITMIX_SHIFTS``, splitmix64's own (Stafford's Mix13): the prompt generators' token streams
  (workload/tokens.py), as ``splitmix64`` over numpy arrays of counters;
- ``HASH_SHIFTS``, no first xor-shift, then 31 and 29: ``hash64``, which folds a few integers into one
  (the routing policies' randomness, the emulator's output tokens).

Both work on Python ints and on numpy uint64 arrays alike (numpy's array arithmetic wraps silently).
"""

from __future__ import annotations

from typing import Any, Final, overload

import numpy as np
import numpy.typing as npt

GOLDEN: Final = 0x9E3779B97F4A7C15  # splitmix64's increment, 2**64 over the golden ratio
_MUL1: Final = 0xBF58476D1CE4E5B9
_MUL2: Final = 0x94D049BB133111EB
MASK64: Final = (1 << 64) - 1

Shifts = tuple[int, int, int]
SPLITMIX_SHIFTS: Final[Shifts] = (30, 27, 31)
HASH_SHIFTS: Final[Shifts] = (0, 31, 29)  # 0: no xor-shift before the first multiplication

U64Array = npt.NDArray[np.uint64]


@overload
def mix64(x: int, shifts: Shifts = ...) -> int: ...
@overload
def mix64(x: U64Array, shifts: Shifts = ...) -> U64Array: ...
def mix64(x: Any, shifts: Shifts = SPLITMIX_SHIFTS) -> Any:
    """A bijection on 64-bit integers (``x`` in [0, 2**64)) that spreads every input bit over the output."""
    # One body for ints and uint64 arrays: numpy's stubs would type an array shifted by an int as signed.
    first, second, last = shifts
    if first:
        x = x ^ (x >> first)
    x = x * _MUL1 & MASK64
    x = (x ^ (x >> second)) * _MUL2 & MASK64
    return x ^ (x >> last)


def splitmix64(counter: U64Array, state: int | U64Array = 0) -> U64Array:
    """Output number ``counter`` (from 0) of the splitmix64 generator seeded with ``state``, for each counter.

    A bijection of the counter for a given state: the counters of a prompt's positions give distinct hashes.
    """
    return mix64(state + (counter + 1) * np.uint64(GOLDEN))


def hash64(*values: int, state: int = GOLDEN) -> int:
    """``values`` folded into ``state`` one at a time, each mixed in with ``HASH_SHIFTS``.

    Any int may be folded in: a value outside [0, 2**64) counts as its low 64 bits.
    """
    x = state & MASK64
    for v in values:
        x = mix64(x ^ (v & MASK64), HASH_SHIFTS)
    return x
