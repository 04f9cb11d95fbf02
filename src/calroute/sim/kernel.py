"""A minimal discrete-event kernel: a heap of (time_s, priority, seq, callback, arg).

Ties in time go to the lower priority value, then to the earlier scheduled event (seq, a per-kernel
counter), so a run is deterministic and independent of any other kernel in the process. The kernel knows
nothing about LLMs; the cluster model schedules plain callbacks.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

URGENT = 0  # completions and releases: applied before decisions at the same instant
NORMAL = 1
LATE = 2  # metric samples: observe the state after everything else at that instant

Callback = Callable[[Any], None]


class Kernel:
    def __init__(self) -> None:
        self.now_s = 0.0
        self._queue: list[tuple[float, int, int, Callback, Any]] = []
        self._seq = 0
        self.events_processed = 0

    def at(self, time_s: float, callback: Callback, arg: Any = None, priority: int = NORMAL) -> None:
        """Schedule ``callback(arg)`` at absolute time ``time_s`` (never in the past)."""
        if time_s < self.now_s:
            raise ValueError(f"cannot schedule at {time_s} before now ({self.now_s})")
        seq = self._seq
        self._seq = seq + 1
        heapq.heappush(self._queue, (time_s, priority, seq, callback, arg))

    def run(self) -> None:
        """Process events until none are left."""
        queue = self._queue
        pop = heapq.heappop
        n = 0
        while queue:
            t, _, _, callback, arg = pop(queue)
            self.now_s = t
            callback(arg)
            n += 1
        self.events_processed += n

    def pending(self) -> int:
        return len(self._queue)
