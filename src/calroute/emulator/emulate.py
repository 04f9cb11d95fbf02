"""Run emulated engines in this process until SIGTERM or SIGINT (`calroute engines emulate`)."""

from __future__ import annotations

import asyncio
import logging
import signal

from calroute import aio
from calroute.emulator.group import EngineGroup, EngineSpec, GroupConfig

logger = logging.getLogger(__name__)


async def serve(config: GroupConfig, specs: list[EngineSpec]) -> None:
    group = EngineGroup(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        for e in await group.start(specs):
            logger.info("engine %s (%s) on %s", e.core.engine_id, e.spec.role.value, e.url)
            if e.kv_events_endpoint is not None:
                logger.info("engine %s publishes KV events on %s", e.core.engine_id, e.kv_events_endpoint)
        await stop.wait()
    finally:
        await group.stop()


def run(config: GroupConfig, specs: list[EngineSpec]) -> None:
    aio.run(serve(config, specs))
