"""A minimal discrete-event kernel: a heap of events ordered by (time_s, priority, seq).

Ties in time go to the lower priority value, then to the earlier scheduled event (seq, a per-kernel
counter), so a run is deterministic and independent of any other kernel in the process. The kernel knows
nothing about LLMs; the cluster model schedules plain callbacks. The heap is calroute.routing.heap's, keyed by
time with priority and seq packed into its order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, cast

from calroute.routing.heap import COMPILED, Entry, MinHeap

URGENT: Final = 0  # completions and releases: applied before decisions at the same instant
NORMAL: Final = 1
LATE: Final = 2  # metric samples: observe the state after everything else at that instant

Callback = Callable[[Any], None]

_SEQ_BITS: Final = 56  # order = priority << 56 | seq: one integer compare for both tie-breakers


class _Event(Entry):
    """An entry whose item is the callback, with the callback's argument."""

    __slots__ = ("arg",)

    def __init__(self, time_s: float, order: int, callback: Callback, arg: Any) -> None:
        super().__init__(time_s, order, callback)
        self.arg = arg


class Kernel:
    def __init__(self, written_heap: bool = COMPILED) -> None:
        """``written_heap``: which of the two heaps (calroute.routing.heap); the default suits
        the build."""
        self.now_s = 0.0
        self._heap = MinHeap(written_heap)
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
        self._heap.push(_Event(time_s, (priority << _SEQ_BITS) | seq, callback, arg))

    def run(self) -> None:
        """Process events until none are left."""
        n = 0
        heap = self._heap
        while len(heap):
            event = cast(_Event, heap.pop())
            self.now_s = event.key
            event.item(event.arg)
            n += 1
        self.events_processed += n

    def pending(self) -> int:
        return len(self._heap)
