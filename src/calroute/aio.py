"""Running coroutines on uvloop: the proxy, the emulator and the load generator are event-loop bound, and
uvloop's loop roughly halves their per-request overhead (benchmarks/RESULTS.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def new_event_loop() -> asyncio.AbstractEventLoop:
    return uvloop.new_event_loop()
