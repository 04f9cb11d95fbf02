"""A decode engine that prefills a prompt itself (a local decision, RouteDecision.local): given a request
without ``kv_transfer_params``, as vLLM's decode engine of a NixlConnector setup (kv_both) serves one, it
computes the prompt in its own steps on the calibrated prefill curve, looks it up in its own prefix cache,
caches its blocks (prompt and answer) and publishes them as KV events; it reports what it served from its
cache in ``usage.prompt_tokens_details.cached_tokens``, as vLLM with --enable-prompt-tokens-details."""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp
import msgpack
import pytest

from calroute.contract.blocks import BLOCK_TOKENS
from calroute.emulator.group import RunningEngine
from calroute.routing import block_hash
from calroute.types import Role
from tests.emulator.emulated import PROFILE, run_group
from tests.emulator.test_emulator import close
from tests.emulator.test_kv_events import EVENTS, receive, subscribe


def ids(n: int, start: int = 100) -> list[int]:
    return [start + k % 3000 for k in range(n)]


async def complete(s: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """(seconds to the whole answer, the answer)."""
    t0 = time.monotonic()
    async with s.post(f"{url}/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        out = dict(await r.json())
    return time.monotonic() - t0, out


def test_a_decode_engine_prefills_locally_on_the_calibrated_curve() -> None:
    """One token out of an uncached 2,048-token prompt: one step, the prompt's whole prefill."""
    cal = PROFILE.calibration
    scale = 2.0

    async def test(engines: list[RunningEngine], s: aiohttp.ClientSession) -> None:
        (d,) = engines
        took, out = await complete(s, d.url, {"prompt": ids(2048), "max_tokens": 1})
        assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert close(took, scale * cal.prefill.single_s(2048)), (took, scale * cal.prefill.single_s(2048))
        assert d.core.stats.prompt_tokens == 2048 and d.core.stats.prefix_hits == 0

    misses: list[str] = []
    for _ in range(3):  # a busy machine only ever adds time (as test_emulator's timing tests)
        try:
            run_group(test, roles=(Role.DECODE,), time_scale=scale)
            return
        except AssertionError as e:
            misses.append(str(e))
    pytest.fail("; ".join(misses))


@pytest.mark.parametrize("streamed", [False, True])
def test_a_second_turn_hits_the_first_turns_prompt_and_answer_and_its_blocks_are_published(
    streamed: bool,
) -> None:
    first = ids(200)  # 12 full blocks and 8 tokens
    answer_tokens = 40

    async def test(engines: list[RunningEngine], s: aiohttp.ClientSession) -> None:
        (d,) = engines
        sub = await subscribe(d, s)
        try:
            _, one = await complete(
                s,
                d.url,
                {"prompt": first, "max_tokens": answer_tokens, "ignore_eos": True, "return_token_ids": True},
            )
            # vLLM 0.32's whole answer: every field of PromptTokenUsageInfo (completions set no creation)
            details = one["usage"]["prompt_tokens_details"]
            assert details == {"cached_tokens": 0, "created_cache_tokens": None, "multimodal_tokens": None}
            answer = one["choices"][0]["token_ids"]
            # every token computed is cached (the last answer token is sampled, never fed back): 239 tokens,
            # 14 full blocks, the prompt's 12 and 2 of prompt and answer; published as the steps filled them
            context = first + answer
            stored: list[int] = []
            while len(stored) < 14:
                _, _, payload = await receive(sub)
                for event in msgpack.unpackb(payload)[1]:
                    assert event[0] == "BlockStored", event
                    stored += event[1]
            assert stored == block_hash.block_hashes(context[: 14 * BLOCK_TOKENS], BLOCK_TOKENS)
            second = {"prompt": context + ids(30, 2000), "max_tokens": 4, "ignore_eos": True}
            if streamed:
                second |= {"stream": True, "stream_options": {"include_usage": True}}
                async with s.post(f"{d.url}/v1/completions", json=second) as r:
                    assert r.status == 200
                    events = [line async for line in r.content if line.startswith(b"data: {")]
                usage = json.loads(events[-1].removeprefix(b"data: "))["usage"]
            else:
                usage = (await complete(s, d.url, second))[1]["usage"]
            assert usage["prompt_tokens_details"]["cached_tokens"] == 14 * BLOCK_TOKENS
            assert d.core.stats.prefix_hits == 14 * BLOCK_TOKENS
        finally:
            sub.close()

    run_group(test, roles=(Role.DECODE,), time_scale=0.05, kv_events=EVENTS)


def test_prompt_tokens_details_are_written_as_vllm_writes_them() -> None:
    """As vLLM 0.32 wrote them on this tier (a 250-token chat prompt, a 128-token block cached, a local
    request): a whole answer every field, a stream's usage chunk only those set, chat alone setting
    created_cache_tokens, the prompt's full blocks the prefill added to the cache."""
    first = ids(40)
    second = first[:16] + ids(24, 1000)

    async def test(engines: list[RunningEngine], s: aiohttp.ClientSession) -> None:
        (d,) = engines
        await complete(s, d.url, {"prompt": first, "max_tokens": 1})
        for path, body in (
            ("completions", {"prompt": second}),
            ("chat/completions", {"messages": [{"role": "user", "content": "hi " * 30}]}),
        ):
            chat = path.startswith("chat")
            for streamed in (False, True):
                req = {**body, "max_tokens": 2}
                if streamed:
                    req |= {"stream": True, "stream_options": {"include_usage": True}}
                async with s.post(f"{d.url}/v1/{path}", json=req) as r:
                    assert r.status == 200
                    if streamed:
                        lines = [line async for line in r.content if line.startswith(b"data: {")]
                        details = json.loads(lines[-1].removeprefix(b"data: "))["usage"][
                            "prompt_tokens_details"
                        ]
                    else:
                        details = (await r.json())["usage"]["prompt_tokens_details"]
                cached = details["cached_tokens"]
                # asked twice: the first time what was cached before (completions: the shared first block),
                # the second its own prompt's full blocks too
                assert cached == (32 if streamed else 0 if chat else BLOCK_TOKENS), (path, streamed, cached)
                keys = ["cached_tokens", "created_cache_tokens", "multimodal_tokens"]
                if streamed:
                    keys = keys[:2] if chat else keys[:1]
                assert list(details) == keys, (path, streamed, details)
                if chat:
                    assert cached + details["created_cache_tokens"] == 32  # its prompt's 2 full blocks
                elif not streamed:
                    assert details["created_cache_tokens"] is None

    run_group(test, roles=(Role.DECODE,), time_scale=0.05)
