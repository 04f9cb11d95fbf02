"""The emulator's prefix cache as vLLM 0.32 keeps it (kvcache/pool.py): blocks cached as they are computed,
answers cached as prompts are, and a decode engine pulling only what its own cache lacks."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import aiohttp

from calroute.contract.blocks import BLOCK_TOKENS
from calroute.contract.handoff import decode_body, prefill_body
from calroute.emulator.group import RunningEngine
from calroute.types import Role
from tests.emulator.emulated import PROFILE, run_group


def prompt(n: int, start: int = 100) -> list[int]:
    return [start + k % 3000 for k in range(n)]


async def complete(s: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with s.post(f"{url}/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        return dict(await r.json())


def test_a_decode_engine_pulls_only_the_blocks_it_lacks() -> None:
    ids = prompt(100)  # 6 full blocks and 4 tokens

    async def test(engines: list[RunningEngine], s: aiohttp.ClientSession) -> None:
        p, d = engines
        pulled: list[int | None] = []
        serve_pull = p.server.serve_pull

        async def recording(rid: str, tokens: int | None = None) -> tuple[int, bool]:
            pulled.append(tokens)
            return await serve_pull(rid, tokens)

        p.server.serve_pull = recording  # type: ignore[method-assign,assignment]
        client = {"prompt": ids, "max_tokens": 4, "ignore_eos": True}
        for _ in range(2):
            first = await complete(s, p.url, prefill_body(client))
            await complete(s, d.url, decode_body(client, first["kv_transfer_params"]))
        # the first pull moves the whole prompt; the second finds 6 blocks in the decode engine's own cache
        # (at most 99 tokens hit: the last is always computed) and pulls the 4 tokens past them
        assert pulled == [100, 100 - 6 * BLOCK_TOKENS]
        assert d.core.stats.prefix_hits == 6 * BLOCK_TOKENS

    run_group(test, roles=(Role.PREFILL, Role.DECODE), time_scale=0.05)


def test_a_prompt_is_cached_as_it_is_computed_not_when_it_ends() -> None:
    # a 2,048-token step budget: a 6,000-token prompt takes three steps, and a request sharing its first
    # 4,000 tokens is scheduled in the third, beside the first's last chunk, before the first has ended: it
    # hits the 250 blocks the first two steps computed (when caches kept a prompt only once its request
    # ended, it hit none)
    profile = replace(PROFILE, limits=replace(PROFILE.limits, max_batched_tokens=2048))
    long = prompt(6000)

    async def test(engines: list[RunningEngine], s: aiohttp.ClientSession) -> None:
        (e,) = engines
        first = asyncio.ensure_future(complete(s, e.url, {"prompt": long, "max_tokens": 1}))
        for _ in range(500):
            if e.core.kv.pool.cached_blocks:
                break
            await asyncio.sleep(0.002)
        assert not first.done()
        await complete(s, e.url, {"prompt": long[:4000] + prompt(50, 2000), "max_tokens": 1})
        await first
        assert e.core.stats.prefix_hits == 4000 // BLOCK_TOKENS * BLOCK_TOKENS

    run_group(test, roles=(Role.PREFILL,), profile=profile, time_scale=1.0)


def test_a_decode_engine_caches_the_answer_as_well_as_the_prompt() -> None:
    async def test(engines: list[RunningEngine], s: aiohttp.ClientSession) -> None:
        (d,) = engines
        answer = await complete(
            s, d.url, {"prompt": prompt(40), "max_tokens": 40, "ignore_eos": True, "return_token_ids": True}
        )
        assert answer["usage"]["completion_tokens"] == 40
        # 79 tokens computed (the last answer token is sampled, never fed back): 4 full blocks, the
        # prompt's 2 and 2 made of the answer, as vLLM caches a request's tokens up to those computed
        assert d.core.kv.pool.cached_blocks == 79 // BLOCK_TOKENS

    run_group(test, roles=(Role.DECODE,), time_scale=0.05)
