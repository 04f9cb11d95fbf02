"""Engine metrics as a periodic poller sees them, without a poll event every period.

A poller scrapes every ``interval_s`` (ticks at k x interval_s); a decision at time t sees the last tick
strictly before t. Rather than schedule an event per tick, each engine *holds* its metrics: before any
change to its state it records the values as of the last tick (its state has not changed since), and a
read returns the held values, or the current state evaluated at the tick when nothing changed since.
The result equals polling at every tick; the cost is one comparison per state change.
"""

from __future__ import annotations

import math
from collections.abc import Callable

Metrics = tuple[int, int, int]  # kv_used_tokens, running, waiting


class HeldMetrics:
    __slots__ = ("_interval_s", "_probe", "_tick", "_values", "_stale_after_s")

    def __init__(self, interval_s: float, probe: Callable[[float], Metrics]) -> None:
        self._interval_s = interval_s
        self._probe = probe  # the engine's metrics at a past time, valid while its state is unchanged
        self._tick = -1
        self._values: Metrics = (0, 0, 0)
        self._stale_after_s = -1.0  # the held values stop being the last tick's after this time

    def _last_tick(self, now_s: float) -> int:
        return math.ceil(now_s / self._interval_s) - 1

    def touch(self, now_s: float) -> None:
        """Call before changing the engine's state at ``now_s``."""
        if now_s > self._stale_after_s:  # cheap test first: most changes fall in an already-held tick
            self._hold(self._last_tick(now_s))

    def _hold(self, k: int) -> None:
        self._values = self._probe(k * self._interval_s)
        self._tick = k
        self._stale_after_s = (k + 1) * self._interval_s

    def read(self, now_s: float) -> tuple[float, Metrics] | None:
        """(tick time, metrics) of the last tick before ``now_s``; None before the first tick."""
        k = self._last_tick(now_s)
        if k < 0:
            return None
        if k > self._tick:  # unchanged since tick k: evaluate the current state there, and hold it
            self._hold(k)
        return k * self._interval_s, self._values
