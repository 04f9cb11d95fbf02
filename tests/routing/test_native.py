"""The C loops of a prefix-aware decision (routing/_native.c): what they refuse. What they compute is tested
through block_hash.py and prefix_index.py, against the definitions."""

from __future__ import annotations

import array

import numpy as np
import pytest

from calroute.routing._native import chain, walk


def test_chain_is_the_polynomial_over_the_tokens() -> None:
    q, mask = 0xD6E8FEB86659FD93, (1 << 64) - 1
    tokens = [3, 2**64 - 1, 0, 17, 5, 8]
    state, want = 7, []
    for k, t in enumerate(tokens):
        state = (state * q + t) & mask
        if k % 2 == 1:
            want.append(state)
    assert chain(array.array("Q", tokens), 0, 2, 3, 7) == want
    assert chain(np.array(tokens, dtype=np.uint64), 2, 2, 2, want[0]) == want[1:]
    assert chain(np.array(tokens, dtype=np.uint64), 6, 2, 0, 7) == []


@pytest.mark.parametrize(
    ("tokens", "start", "block_tokens", "n", "error"),
    [
        (np.arange(8, dtype=np.int64), 0, 2, 1, TypeError),  # signed: the caller checks and converts
        (np.arange(8, dtype=np.uint32), 0, 2, 1, TypeError),
        (np.arange(16, dtype=np.uint64)[::2], 0, 2, 1, (TypeError, BufferError, ValueError)),
        (b"\x00" * 64, 0, 2, 1, TypeError),
        (np.arange(8, dtype=np.uint64), 0, 2, 5, ValueError),  # past the end
        (np.arange(8, dtype=np.uint64), 7, 2, 1, ValueError),
        (np.arange(8, dtype=np.uint64), 9, 2, 0, ValueError),
        (np.arange(8, dtype=np.uint64), -1, 2, 1, ValueError),
        (np.arange(8, dtype=np.uint64), 0, 0, 1, ValueError),
        (np.arange(8, dtype=np.uint64), 0, 2, -1, ValueError),
        (np.arange(8, dtype=np.uint64), 0, 2**62, 2**62, ValueError),  # no overflow in the bounds check
    ],
)
def test_chain_refuses_what_it_cannot_read(
    tokens: object, start: int, block_tokens: int, n: int, error: type[Exception]
) -> None:
    with pytest.raises(error):
        chain(tokens, start, block_tokens, n, 0)


@pytest.mark.parametrize(
    ("holders", "blocks", "running", "result"),
    [
        ({}, [1, 2], 0b11, (0, [], 0b11, True)),
        ({1: 0b11, 2: 0b01}, [1, 2], 0b11, (2, [(1, 0b10)], 0b01, False)),
        ({1: 0b11, 2: 0b01, 3: 0b10}, [1, 2, 3], 0b11, (2, [(1, 0b10), (2, 0b01)], 0, True)),
        ({1: 0b11}, [1, 1, 9], 0b11, (2, [], 0b11, True)),
        ({1: 0b11}, [], 0b11, (0, [], 0b11, False)),
        ({1: 0b11}, [1], 0, (0, [], 0, True)),
        # a wide pool, and a running set that fits a word over holders that do not
        ({1: (1 << 70) | 1, 2: 1 << 70}, [1, 2], (1 << 70) | 1, (2, [(1, 1)], 1 << 70, False)),
        ({1: (1 << 70) | 1, 2: (1 << 70) | 1}, [1, 2], 1, (2, [], 1, False)),
    ],
)
def test_walk_reports_where_engines_leave_the_running_set(
    holders: dict[int, int], blocks: list[int], running: int, result: tuple[object, ...]
) -> None:
    assert walk(holders, blocks, running) == result


@pytest.mark.parametrize(
    "args",
    [({}, (1, 2), 1), ([], [1], 1), ({}, [1], 1.0), ({1: "x"}, [1], 1), ({1: "x"}, [1], 1 << 70)],
)
def test_walk_refuses_what_it_cannot_read(args: tuple[object, object, object]) -> None:
    with pytest.raises(TypeError):
        walk(*args)  # type: ignore[arg-type]


def test_walk_survives_a_block_that_changes_the_list_under_it() -> None:
    blocks: list[object] = []

    class Evil:
        # hashes as block 1 and, compared with it, empties the list the walk is reading
        def __hash__(self) -> int:
            return hash(1)

        def __eq__(self, other: object) -> bool:
            blocks.clear()
            return True

    blocks.extend([Evil(), 2, 3])
    assert walk({1: 0b1, 2: 0b1, 3: 0b1}, blocks, 0b1) == (1, [], 0b1, False)  # type: ignore[arg-type]
