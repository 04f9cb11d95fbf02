"""The engines' /tokenize as the proxy's tokenizer (proxy/engine_tokenizer.py): the emulator's /tokenize gives
the emulator tokenizer's ids; an engine's 400 is the client's 400; an engine that cannot answer leaves the
length to the estimate, the next engine asked first. The proxy end to end on it over emulated engines. (On
real vLLM: tests/proxy/test_proxy_vllm.py.)"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from calroute.cli.common import load_tokenizer
from calroute.cluster.file import ClusterFile
from calroute.contract.tokenizer import AsyncTokenizer, TokenizeError, TokenizerUnavailable
from calroute.emulator.api import EmulatorTokenizer
from calroute.emulator.group import RunningEngine
from calroute.proxy.config import ProxyConfig
from calroute.proxy.engine_tokenizer import EngineTokenizer
from calroute.results.records import read_records
from calroute.types import RequestStatus, Role
from tests.emulator.emulated import run_group
from tests.emulator.http import request
from tests.proxy.conftest import CAL
from tests.proxy.harness import RunningProxy

EMULATOR = EmulatorTokenizer()
CHAT = {
    "model": "emulated",
    "messages": [
        {"role": "system", "content": "You are terse. " * 40},
        {"role": "user", "content": "Say something. 🙂"},
    ],
    "max_tokens": 4,
}
TEXT = {"model": "emulated", "prompt": "  the same text, spelled out  " * 20, "max_tokens": 4}
DEAD = "http://127.0.0.1:1"  # nothing listens there


def on_engines(test: Any) -> None:
    async def go(engines: list[RunningEngine], _: Any) -> None:
        tok = EngineTokenizer({e.spec.role.value: e.url for e in engines}, max_model_len=4096)
        try:
            await test(tok, engines)
        finally:
            tok.close()

    run_group(go, roles=(Role.PREFILL,))


def test_its_ids_are_the_engines() -> None:
    async def test(tok: EngineTokenizer, _: list[RunningEngine]) -> None:
        assert isinstance(tok, AsyncTokenizer)
        for body, chat in ((CHAT, True), (TEXT, False)):
            assert await tok.prompt_ids_async(body, chat) == EMULATOR.prompt_ids(body, chat)

    on_engines(test)


@pytest.mark.parametrize(
    ("body", "chat"),
    [
        ({"model": "emulated", "prompt": [1, 2, 3]}, False),
        ({"model": "emulated", "prompt": ["a", "b"]}, False),
    ],
)
def test_a_prompt_that_is_not_text_is_not_sent(body: dict[str, Any], chat: bool) -> None:
    async def test(tok: EngineTokenizer, engines: list[RunningEngine]) -> None:
        with pytest.raises(TokenizeError):
            await tok.prompt_ids_async(body, chat)

    on_engines(test)


def test_an_engines_refusal_is_a_tokenize_error_with_its_message() -> None:
    async def test(tok: EngineTokenizer, _: list[RunningEngine]) -> None:
        with pytest.raises(TokenizeError, match="messages"):
            await tok.prompt_ids_async({"model": "emulated", "messages": "not a list"}, True)

    on_engines(test)


def test_an_engine_that_cannot_answer_leaves_it_to_the_next_then_to_the_estimate() -> None:
    async def go() -> None:
        tok = EngineTokenizer({"a": DEAD}, max_model_len=4096, timeout_s=0.5)
        try:
            with pytest.raises(TokenizerUnavailable):
                await tok.prompt_ids_async(TEXT, False)
            assert tok.unavailable == 1
        finally:
            tok.close()

    asyncio.run(go())

    async def test(tok: EngineTokenizer, engines: list[RunningEngine]) -> None:
        two = EngineTokenizer({"a-dead": DEAD, "b": engines[0].url}, max_model_len=4096, timeout_s=0.5)
        try:
            for _ in range(3):  # whichever it asks first, it answers
                assert await two.prompt_ids_async(TEXT, False) == EMULATOR.prompt_ids(TEXT, False)
            assert two.unavailable == 0
        finally:
            two.close()

    on_engines(test)


def test_the_proxy_prices_and_routes_on_the_engines_ids(cluster: ClusterFile, tmp_path: Path) -> None:
    c = replace(cluster, tokenizer="engine")
    tok = load_tokenizer(c)
    assert isinstance(tok, EngineTokenizer)
    log = tmp_path / "log.jsonl"
    cfg = ProxyConfig(cluster=c, calibration=CAL, log_path=log, prefix_index=True, policy="marginal_cost")
    with RunningProxy(cfg, tok) as p:
        for _ in range(2):
            status, out = request(f"{p.url}/v1/chat/completions", {**CHAT, "ignore_eos": True})
            assert status == 200, out
        assert request(f"{p.url}/v1/completions", TEXT)[0] == 200
        status, out = request(f"{p.url}/v1/chat/completions", {**CHAT, "messages": "not a list"})
        assert status == 400 and "error" in out
    first, second, text, refused = list(read_records(log))
    assert [r.status for r in (first, second, text)] == [RequestStatus.OK] * 3
    assert refused.status is RequestStatus.REJECTED and refused.prefill_id is None
    for r in (first, second, text):
        assert not r.prompt_estimated and r.priced_prompt_tokens == r.prompt_tokens
    assert second.prefill_id == first.prefill_id  # the index matched the engine's own ids
    assert second.predicted_cached_tokens == second.cached_tokens > 0
