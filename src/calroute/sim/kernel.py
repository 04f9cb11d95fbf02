"""A minimal discrete-event kernel: a binary heap of events ordered by (time_s, priority, seq).

Ties in time go to the lower priority value, then to the earlier scheduled event (seq, a per-kernel
counter), so a run is deterministic and independent of any other kernel in the process. The kernel knows
nothing about LLMs; the cluster model schedules plain callbacks.

Two heaps give the same order, one per build, because each is twice as slow in the other: heapq over
tuples for the pure-Python sources (C code, but it compares tuples through the object protocol), and a
heap written out here over ``_Event`` objects for the compiled build (setup.py), which compares their
fields as machine numbers. Compiled, heapq made scheduling about a fifth of a simulated request's
instructions; interpreted, the written heap doubled the kernel's time per event. tests/sim/test_kernel.py
runs both against a reference.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any, Final

URGENT: Final = 0  # completions and releases: applied before decisions at the same instant
NORMAL: Final = 1
LATE: Final = 2  # metric samples: observe the state after everything else at that instant

Callback = Callable[[Any], None]

_SEQ_BITS: Final = 56  # order = priority << 56 | seq: one integer compare for both tie-breakers
COMPILED: Final = not __file__.endswith(".py")  # this module, built by setup.py


class _Event:
    __slots__ = ("time_s", "order", "callback", "arg")

    def __init__(self, time_s: float, order: int, callback: Callback, arg: Any) -> None:
        self.time_s = time_s
        self.order = order
        self.callback = callback
        self.arg = arg


def _sift_up(heap: list[_Event], pos: int, event: _Event) -> None:
    """Place ``event`` at the hole ``pos`` or above it, moving later parents down (the written heap)."""
    time_s, order = event.time_s, event.order
    while pos > 0:
        parent_pos = (pos - 1) >> 1
        parent = heap[parent_pos]
        if time_s > parent.time_s or (time_s == parent.time_s and order > parent.order):
            break
        heap[pos] = parent
        pos = parent_pos
    heap[pos] = event


class Kernel:
    def __init__(self, written_heap: bool = COMPILED) -> None:
        """``written_heap``: which of the two heaps (module docstring); the default suits the build."""
        self.now_s = 0.0
        self._written = written_heap
        self._heap: list[_Event] = []  # the written heap
        self._tuples: list[tuple[float, int, Callback, Any]] = []  # heapq's (order is unique: no ties)
        self._seq = 0
        self.events_processed = 0

    def at(self, time_s: float, callback: Callback, arg: Any = None, priority: int = NORMAL) -> None:
        """Schedule ``callback(arg)`` at absolute time ``time_s`` (never in the past)."""
        if time_s < self.now_s:
            raise ValueError(f"cannot schedule at {time_s} before now ({self.now_s})")
        if not URGENT <= priority <= LATE:
            raise ValueError(f"priority must be URGENT, NORMAL or LATE, got {priority}")
        seq = self._seq
        self._seq = seq + 1
        order = (priority << _SEQ_BITS) | seq
        if not self._written:
            heapq.heappush(self._tuples, (time_s, order, callback, arg))
            return
        event = _Event(time_s, order, callback, arg)
        heap = self._heap
        heap.append(event)
        _sift_up(heap, len(heap) - 1, event)

    def _pop(self) -> _Event:
        """Remove and return the earliest event (the heap is not empty)."""
        heap = self._heap
        last = heap.pop()
        n = len(heap)
        if n == 0:
            return last
        top = heap[0]
        # Move the hole at the root down to a leaf along the earlier children, then sift ``last`` up from
        # there: fewer comparisons than sifting it down from the root (as heapq does).
        pos = 0
        child = 1
        while child < n:
            right = child + 1
            if right < n:
                a, b = heap[child], heap[right]
                if b.time_s < a.time_s or (b.time_s == a.time_s and b.order < a.order):
                    child = right
            heap[pos] = heap[child]
            pos = child
            child = 2 * pos + 1
        _sift_up(heap, pos, last)
        return top

    def run(self) -> None:
        """Process events until none are left."""
        n = 0
        if self._written:
            heap = self._heap
            while heap:
                event = self._pop()
                self.now_s = event.time_s
                event.callback(event.arg)
                n += 1
        else:
            tuples = self._tuples
            pop = heapq.heappop
            while tuples:
                time_s, _, callback, arg = pop(tuples)
                self.now_s = time_s
                callback(arg)
                n += 1
        self.events_processed += n

    def pending(self) -> int:
        return len(self._heap) + len(self._tuples)
