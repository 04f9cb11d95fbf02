"""The prompt's tokens at admission: exact with the served model's tokenizer (the priced length, the ids the
prefix index hashes), the engine's 400 for a prompt it would refuse, an estimate without one; and the
counters that show a tokenizer drifting from the engine's."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from calroute.aio import run
from calroute.contract.tokenizer import TokenizeError
from calroute.proxy.prompt_length import INLINE_TOKENIZE_CHARS, Refused, exact_prompt
from calroute.types import RequestStatus
from tests.proxy.fakes import MODEL, FakeCluster, ProxyOnFakes

ROLES = "Conversation roles must alternate user/assistant/user/assistant/..."


class Words:
    """A tokenizer that counts as the fake engines do (fakes.prompt_length): a token a word, four more for a
    chat's template; ``off`` tokens more, to play one that drifted; a chat whose role is "refused" fails to
    render, as a template's raise_exception would."""

    name = "words"

    def __init__(self, off: int = 0) -> None:
        self.off = off
        self.threads: set[str] = set()

    def counters(self) -> Mapping[str, float]:
        return {"calls_total": len(self.threads)}

    def prompt_ids(self, body: Mapping[str, Any], chat: bool) -> list[int]:
        import threading

        self.threads.add(threading.current_thread().name)
        if chat:
            messages = body["messages"]
            if any(m.get("role") == "refused" for m in messages):
                raise TokenizeError(ROLES)
            n = 4 + sum(len(str(m.get("content", "")).split()) for m in messages)
        else:
            prompt = body["prompt"]
            if not isinstance(prompt, str):
                raise TokenizeError("a batch of prompts")
            n = len(prompt.split())
        return list(range(3, 3 + n + self.off))


def text(words: int) -> dict[str, Any]:
    return {"model": MODEL, "prompt": " ".join(["word"] * words), "max_tokens": 4}


def chat(*messages: tuple[str, str]) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": r, "content": c} for r, c in messages], "max_tokens": 4}


# ---- exact_prompt, alone -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "is_chat", "expected"),
    [
        (text(5), False, 5),
        (chat(("user", "hi there")), True, 6),
        (
            chat(("refused", "hi")),
            True,
            Refused(ROLES),
        ),
        ({"prompt": ["a", "b"]}, False, None),  # a batch: the engine judges it, on the estimate
        (text(2049), False, "too long"),
    ],
    ids=["text", "chat", "template refuses", "batch", "past the model length"],
)
def test_exact_prompt(body: dict[str, Any], is_chat: bool, expected: Any) -> None:
    got = run(exact_prompt(Words(), None, body, is_chat, None, 2048))
    if expected == "too long":
        assert isinstance(got, Refused) and got.param == "input_tokens"
        assert got.message.startswith("This model's maximum context length is 2048 tokens. However, your "
                                      "prompt contains 2049 input tokens")  # fmt: skip
    elif isinstance(expected, int):
        assert isinstance(got, list) and len(got) == expected
    else:
        assert got == expected


def test_a_long_prompt_is_tokenized_off_the_event_loop_and_a_short_one_on_it() -> None:
    words = Words()
    pool = ThreadPoolExecutor(1, thread_name_prefix="tokenize-test")

    async def go() -> None:
        short, long = text(10), text(INLINE_TOKENIZE_CHARS)  # 'word ' x n: over the inline bound
        assert len(await exact_prompt(words, pool, short, False, len(short["prompt"]), 10**6) or []) == 10
        loop_thread = {__import__("threading").current_thread().name}
        assert words.threads == loop_thread
        ids = await exact_prompt(words, pool, long, False, len(long["prompt"]), 10**6)
        assert isinstance(ids, list) and len(ids) == INLINE_TOKENIZE_CHARS
        assert any(t.startswith("tokenize-test") for t in words.threads)

    try:
        asyncio.run(go())
    finally:
        pool.shutdown()


# ---- through the proxy ----------------------------------------------------------------------------------


def test_a_prompt_the_template_refuses_gets_a_400_reaches_no_engine_and_has_one_rejected_record(
    tmp_path: Path,
) -> None:
    fakes = FakeCluster(1, 1)

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path, tokenizer=Words()) as p:
            answer = await p.post(chat(("refused", "hi")), "/v1/chat/completions")
            assert answer.status == 400
            assert answer.json()["error"]["message"].startswith("Conversation roles must alternate")
            assert answer.json()["error"]["type"] == "BadRequestError"
            long = await p.post(text(32769))  # the fakes' model length is 32,768 tokens
            assert long.status == 400 and long.json()["error"]["param"] == "input_tokens"
        return p

    p = run(go())
    recs = p.records()
    assert [r.status for r in recs] == [RequestStatus.REJECTED] * 2
    assert all((r.error or "").startswith("HTTP 400") for r in recs)
    assert fakes.log == []


@pytest.mark.parametrize(("off", "mismatches"), [(0, 0), (1, 2)])
def test_the_priced_length_is_the_tokenizers_and_a_drift_from_the_engine_is_counted(
    off: int, mismatches: int, tmp_path: Path
) -> None:
    fakes = FakeCluster(1, 1)

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path, tokenizer=Words(off)) as p:
            assert (await p.post(text(7))).status == 200
            assert (await p.post(chat(("user", "hello there")), "/v1/chat/completions")).status == 200
        return p

    p = run(go())
    assert p.metric("calroute_prompt_tokens_mismatch_total") == mismatches
    assert p.metric("calroute_prompt_length_estimated_total") == 0
    priced = [line for line in (tmp_path / "decisions.jsonl").read_text().splitlines()]
    assert len(priced) == 2
    assert f'"prompt_tokens":{7 + off}' in priced[0].replace(" ", "")
    assert f'"prompt_tokens":{6 + off}' in priced[1].replace(" ", "")
    # the records: what the router priced beside what the engine reported (the fakes count 7 and 6)
    recs = p.records()
    assert [(r.priced_prompt_tokens, r.prompt_tokens) for r in recs] == [(7 + off, 7), (6 + off, 6)]
    assert not any(r.prompt_estimated for r in recs)
    assert p.metric("calroute_tokenizer_calls_total") >= 1  # the tokenizer's own counters, exported


def test_without_a_tokenizer_text_is_estimated_and_counted_and_token_ids_are_not(tmp_path: Path) -> None:
    fakes = FakeCluster(1, 1)

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path, tokenizer=None) as p:
            assert (await p.post(text(7))).status == 200
            assert (await p.post(chat(("user", "hi")), "/v1/chat/completions")).status == 200
            assert (await p.post({"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 4})).status == 200
        return p

    p = run(go())
    assert p.metric("calroute_prompt_length_estimated_total") == 2
    assert p.metric("calroute_prompt_tokens_mismatch_total") == 0
    assert [r.prompt_estimated for r in p.records()] == [True, True, False]
