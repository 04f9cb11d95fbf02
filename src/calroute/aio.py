"""Running coroutines on uvloop: the proxy, the emulator and the load generator are event-loop bound, and
uvloop's loop roughly halves their per-request overhead (benchmarks/RESULTS.md)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def new_event_loop() -> asyncio.AbstractEventLoop:
    return uvloop.new_event_loop()


def run_until_signalled(
    start: Callable[[], Awaitable[int]], stop: Callable[[], Awaitable[None]], on_ready: Callable[[int], None]
) -> None:
    """Run ``start`` on a uvloop loop, call ``on_ready`` with its port, and ``stop`` on SIGINT or SIGTERM."""

    async def main() -> None:
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopping.set)
        on_ready(await start())
        await stopping.wait()
        await stop()

    run(main())
