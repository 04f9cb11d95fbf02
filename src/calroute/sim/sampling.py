"""Engine metrics as a periodic poller sees them, without a poll event every period.

A poller scrapes every ``interval_s`` (ticks at k x interval_s); a decision at time t sees the last tick
strictly before t. Rather than schedule an event per tick, each engine *holds* its metrics: before any
change to its state it records the values as of the last tick (its state has not changed since), and a
read returns the held values, or the current state evaluated at the tick when nothing changed since.
The result equals polling at every tick; the cost is one comparison per state change.

A reader that knows when it will next read (the simulator reads at arrivals, known in advance) shares a
ReadHorizon with the engines: a touch in tick k then holds only if the next read falls in tick k. A read
in a later tick evaluates the current state at its own tick, which is right unless the state changed
after that tick and before the read; such a change is a touch in the read's tick, and it holds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Final

from calroute.routing.ledger import Ledger
from calroute.types import SlottedValue


class Sample(SlottedValue):
    """An engine's metrics as the poll at ``tick_s`` saw them.

    Held samples are one object per tick, so a reader tells by identity that it already has these values
    (an object, not a tuple: the compiled build would box a tuple afresh at each read, losing identity).
    """

    _fields = ("tick_s", "kv_used_tokens", "running", "waiting")
    __slots__ = _fields

    def __init__(self, tick_s: float, kv_used_tokens: int, running: int, waiting: int) -> None:
        self.tick_s: Final = tick_s
        self.kv_used_tokens: Final = kv_used_tokens
        self.running: Final = running
        self.waiting: Final = waiting


Probe = Callable[[float], Sample]  # the engine's metrics at a past time, valid while its state is unchanged


class ReadHorizon:
    """A promise by the only reader of some engines: no read happens before ``next_read_s``.

    The reader may only raise it (after its read at a time t, to the time of its next read).
    """

    __slots__ = ("next_read_s",)

    def __init__(self) -> None:
        self.next_read_s = -math.inf  # unknown: every touch holds


class HeldMetrics:
    __slots__ = ("_interval_s", "_probe", "_tick", "_sample", "_stale_after_s", "horizon")

    def __init__(self, interval_s: float, probe: Probe, horizon: ReadHorizon | None = None) -> None:
        self.horizon = horizon
        self._interval_s = interval_s
        self._probe = probe
        self._tick = -1
        self._sample = Sample(-self._interval_s, 0, 0, 0)
        self._stale_after_s = -1.0  # the held values stop being the last tick's after this time

    def touch(self, now_s: float) -> None:
        """Call before changing the engine's state at ``now_s``."""
        if now_s > self._stale_after_s:  # cheap test first: most changes fall in an already-held tick
            interval = self._interval_s
            k = math.ceil(now_s / interval) - 1
            h = self.horizon
            # ceil(r / interval) - 1 <= k, as read computes it: the next read falls in tick k
            if h is None or h.next_read_s / interval <= k + 1:
                self._hold(k)
            else:  # no read can see tick k; nor can one see it after later changes in this tick
                self._stale_after_s = (k + 1) * interval

    def _hold(self, k: int) -> None:
        self._sample = self._probe(k * self._interval_s)
        self._tick = k
        self._stale_after_s = (k + 1) * self._interval_s

    def read(self, now_s: float) -> Sample | None:
        """The metrics of the last tick before ``now_s``; None before the first tick."""
        k = math.ceil(now_s / self._interval_s) - 1
        if k > self._tick:  # unchanged since tick k: evaluate the current state there, and hold it
            self._hold(k)  # (k >= 0 here: the held tick starts at -1)
        elif k < 0:
            return None
        return self._sample


def poll(
    engines: list[tuple[str, HeldMetrics]], last: list[Sample | None], now_s: float, ledger: Ledger
) -> None:
    """Read every engine's metrics at ``now_s`` and hand the ledger those not handed over before.

    ``last[i]`` is the sample last handed over for ``engines[i]``. This is ``read`` (and ``_hold``) inlined
    over the engines: the simulator polls all of them at every arrival.
    """
    for i, (instance_id, m) in enumerate(engines):
        interval = m._interval_s
        k = math.ceil(now_s / interval) - 1
        if k > m._tick:
            sample = m._sample = m._probe(k * interval)
            m._tick = k
            m._stale_after_s = (k + 1) * interval
        elif k < 0:
            continue
        else:
            sample = m._sample
        if sample is not last[i]:
            last[i] = sample
            ledger.record_sample(
                instance_id, sample.kv_used_tokens, sample.running, sample.waiting, sample.tick_s
            )
