"""How late the proxy's event loop runs a timer: a stall of the loop delays every request in flight.

Every request's steps run on one event loop, so a callback that holds it (a slow handler, a garbage
collection, a blocking call) or a process that gets no CPU adds the same delay to each request under way.
A timer due every ``interval_s`` records how late it fired; the histogram tells such stalls from the
per-request cost. Ten timers a second cost nothing measurable.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class LoopLag:
    def __init__(self, observe: Callable[[float], None], interval_s: float = 0.1) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self._observe = observe
        self.interval_s = interval_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._due_s = 0.0

    def start(self) -> None:
        """Start timing the running loop (call from inside it)."""
        self._loop = asyncio.get_running_loop()
        self._arm(self._loop.time())

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _arm(self, now_s: float) -> None:
        assert self._loop is not None
        self._due_s = now_s + self.interval_s
        self._handle = self._loop.call_at(self._due_s, self._tick)

    def _tick(self) -> None:
        assert self._loop is not None
        now_s = self._loop.time()
        self._observe(max(0.0, now_s - self._due_s))
        self._arm(now_s)
