"""A min-heap of entries ordered by (key, order): the one priority queue on a simulated request's path.

The kernel's events, a decode engine's finishing requests, the ledger's predicted expiries and the
simulator's pending first tokens all use it. ``order`` breaks ties and must be unique within a heap (a
counter or an id), so two entries never compare equal and their items are never compared.

Two implementations give the same order, because each is about twice as slow in the other build: heapq
over ``(key, order, entry)`` tuples for the pure-Python sources (C code, but it compares tuples through
the object protocol), and a heap written out here over ``Entry`` objects for the compiled build
(setup.py), which compares their two fields as machine numbers. Compiled, heapq's tuple comparisons made
scheduling a fifth of a simulated request's instructions; interpreted, the written heap doubled the
kernel's time per event. tests/test_heap.py runs both against a reference.
"""

from __future__ import annotations

import heapq
from typing import Any, Final

COMPILED: Final = not __file__.endswith(".py")  # this module, built by setup.py
INF: Final = float("inf")


class Entry:
    """``item`` is the caller's; subclasses may carry more (the kernel's events do)."""

    __slots__ = ("key", "order", "item")

    def __init__(self, key: float, order: int, item: Any = None) -> None:
        self.key = key
        self.order = order
        self.item = item


def _sift_up(nodes: list[Entry], pos: int, entry: Entry) -> None:
    """Place ``entry`` at the hole ``pos`` or above it, moving later parents down (the written heap)."""
    key, order = entry.key, entry.order
    while pos > 0:
        parent_pos = (pos - 1) >> 1
        parent = nodes[parent_pos]
        if key > parent.key or (key == parent.key and order > parent.order):
            break
        nodes[pos] = parent
        pos = parent_pos
    nodes[pos] = entry


class MinHeap:
    __slots__ = ("_written", "_nodes", "_tuples")

    def __init__(self, written: bool = COMPILED) -> None:
        """``written``: which of the two implementations (module docstring); the default suits the build."""
        self._written = written
        self._nodes: list[Entry] = []
        self._tuples: list[tuple[float, int, Entry]] = []

    def __len__(self) -> int:
        return len(self._nodes) + len(self._tuples)

    def push(self, entry: Entry) -> None:
        if not self._written:
            heapq.heappush(self._tuples, (entry.key, entry.order, entry))
            return
        nodes = self._nodes
        nodes.append(entry)
        _sift_up(nodes, len(nodes) - 1, entry)

    def top_key(self) -> float:
        """The least key, or infinity when the heap is empty (so ``top_key() <= t`` asks both at once)."""
        if not self._written:
            return self._tuples[0][0] if self._tuples else INF
        return self._nodes[0].key if self._nodes else INF

    def pop(self) -> Entry:
        """Remove and return the least entry; IndexError when the heap is empty."""
        if not self._written:
            return heapq.heappop(self._tuples)[2]
        nodes = self._nodes
        last = nodes.pop()
        n = len(nodes)
        if n == 0:
            return last
        top = nodes[0]
        # Move the hole at the root down to a leaf along the lesser children, then sift ``last`` up from
        # there: fewer comparisons than sifting it down from the root (as heapq does).
        pos = 0
        child = 1
        while child < n:
            right = child + 1
            if right < n:
                a, b = nodes[child], nodes[right]
                if b.key < a.key or (b.key == a.key and b.order < a.order):
                    child = right
            nodes[pos] = nodes[child]
            pos = child
            child = 2 * pos + 1
        _sift_up(nodes, pos, last)
        return top
