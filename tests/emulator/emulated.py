"""An emulated engine group in this test's event loop, and requests to it: what the emulator's tests share."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from calroute.costmodel.profiles import get_profile
from calroute.emulator.group import EngineGroup, EngineSpec, GroupConfig, RunningEngine
from calroute.emulator.tokens import text_of_tokens
from calroute.types import Role

PROFILE = get_profile("a40-qwen2.5-3b")


def run_group(
    test: Callable[[list[RunningEngine], aiohttp.ClientSession], Awaitable[None]],
    roles: tuple[Role, ...] = (Role.PREFILL, Role.DECODE),
    **config: Any,
) -> None:
    async def main() -> None:
        group = EngineGroup(GroupConfig(profile=config.pop("profile", PROFILE), **config))
        engines = await group.start([EngineSpec(r, 0) for r in roles])
        try:
            async with aiohttp.ClientSession() as session:
                await asyncio.wait_for(test(engines, session), timeout=60)
        finally:
            await group.stop()

    asyncio.run(main())


def body(prompt_tokens: int, max_tokens: int, **kw: Any) -> dict[str, Any]:
    return {"prompt": text_of_tokens(prompt_tokens), "max_tokens": max_tokens, "ignore_eos": True, **kw}


async def timed_stream(
    session: aiohttp.ClientSession, url: str, req: dict[str, Any]
) -> tuple[float, list[float]]:
    """(time to first token, arrival time of every token chunk) measured at the client."""
    t0 = time.monotonic()
    times = []
    async with session.post(f"{url}/v1/completions", json={**req, "stream": True}) as r:
        assert r.status == 200, await r.text()
        async for line in r.content:
            if line.startswith(b"data: {") and b'"text":"' in line:
                times.append(time.monotonic() - t0)
    return times[0], times
