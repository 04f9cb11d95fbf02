"""HfTokenizer against real vLLM 0.32 serving the tiny model: the same body to the engine's /tokenize and
to HfTokenizer gives the same ids, every one, over 221 generated requests (tests/tokenizer/corpus.py); the
chat completions' ``usage.prompt_tokens`` is the length of those ids; and the bodies vLLM refuses in its
own renderer are refused here with its message.

A prefill engine answers: the proxy's tests, which run before these (tests/conftest.py), end by killing the
decode engine.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from calroute.cluster import vllm
from calroute.cluster.file import ClusterFile
from calroute.contract.tokenizer import TokenizeError
from calroute.proxy.engine_tokenizer import EngineTokenizer
from calroute.proxy.prompt_length import Refused, exact_prompt
from calroute.tokenizer import HfTokenizer
from tests.conftest import REPO
from tests.emulator.http import request
from tests.tokenizer.corpus import corpus

pytestmark = pytest.mark.real_vllm

TINY_MODEL = vllm.default_vllm_paths(REPO)[1]  # the folder the engines serve: its tokenizer files
CORPUS = corpus()


@pytest.fixture(scope="module")
def engine(real_vllm_cluster: ClusterFile) -> str:
    return real_vllm_cluster.prefill[0].url


@pytest.fixture(scope="module")
def tok(real_vllm_cluster: ClusterFile) -> HfTokenizer:
    return HfTokenizer(TINY_MODEL, name=real_vllm_cluster.model)


def test_the_corpus_covers_the_cases() -> None:
    ids = [case_id for case_id, _ in CORPUS]
    assert len(ids) >= 200 and len(set(ids)) == len(ids)
    kinds = {case_id.rsplit("-", 1)[0] for case_id in ids}
    assert {"text", "chat", "parts", "continue", "developer", "tools", "long-text", "long-chat"} <= kinds


def test_every_id_equals_vllms(engine: str, tok: HfTokenizer) -> None:
    mismatched = []
    longest = 0
    for case_id, body in CORPUS:
        status, answer = request(f"{engine}/tokenize", body)
        assert status == 200, (case_id, answer)
        ours = tok.prompt_ids(body, chat="messages" in body)
        longest = max(longest, len(ours))
        if ours != answer["tokens"]:
            at = next(
                (i for i, (a, b) in enumerate(zip(ours, answer["tokens"], strict=False)) if a != b), None
            )
            mismatched.append(
                f"{case_id}: {len(ours)} vs {len(answer['tokens'])} ids, first difference at {at}"
            )
    assert not mismatched, "\n".join(mismatched)
    assert longest >= 8000  # the long prompts are ~8k tokens (/tokenize does not check the context length)


def test_the_engine_tokenizer_gives_the_same_ids(engine: str, tok: HfTokenizer) -> None:
    """``tokenizer: engine`` (proxy/engine_tokenizer.py) sends /tokenize only the fields it reads: the ids
    are those of the model's files, every one, over the corpus."""

    async def go() -> list[str]:
        remote = EngineTokenizer({"prefill-0": engine}, max_model_len=8192)
        try:
            return [
                case_id
                for case_id, body in CORPUS
                if await remote.prompt_ids_async(body, "messages" in body)
                != tok.prompt_ids(body, "messages" in body)
            ]
        finally:
            remote.close()

    assert asyncio.run(go()) == []


@pytest.mark.parametrize(
    "case_id", ["chat-0", "chat-7", "parts-3", "continue-2", "developer-1", "tools-2", "chat-bos-1", "text-1"]
)
def test_usage_prompt_tokens_is_the_length_of_the_ids(
    engine: str, tok: HfTokenizer, real_vllm_cluster: ClusterFile, case_id: str
) -> None:
    body: dict[str, Any] = {**dict(CORPUS)[case_id], "model": real_vllm_cluster.model, "max_tokens": 1}
    chat = "messages" in body
    status, answer = request(f"{engine}/v1/{'chat/completions' if chat else 'completions'}", body)
    assert status == 200, answer
    assert answer["usage"]["prompt_tokens"] == len(tok.prompt_ids(body, chat))


def test_every_priced_length_is_the_engines_usage(
    engine: str, tok: HfTokenizer, real_vllm_cluster: ClusterFile
) -> None:
    """Every corpus body as a one-token request: the engine's ``usage.prompt_tokens`` is the length the
    proxy prices (its tokenizer's ids), and a body past the model's length is refused by both (exact_prompt
    with vLLM's words, the engine with a 400)."""
    limit = real_vllm_cluster.max_model_len
    wrong, served, refused = [], 0, 0
    for case_id, case in CORPUS:
        body: dict[str, Any] = {**case, "model": real_vllm_cluster.model, "max_tokens": 1}
        chat = "messages" in body
        ids = tok.prompt_ids(body, chat)
        status, answer = request(f"{engine}/v1/{'chat/completions' if chat else 'completions'}", body)
        priced = asyncio.run(exact_prompt(tok, None, body, chat, None, limit))
        if len(ids) + 1 > limit:  # the prompt and its one token do not fit
            refused += 1
            if status != 400 or (len(ids) > limit and not isinstance(priced, Refused)):
                wrong.append(f"{case_id}: {len(ids)} ids, the engine answered {status}")
            continue
        served += 1
        if status != 200 or answer["usage"]["prompt_tokens"] != len(ids) or priced != ids:
            wrong.append(f"{case_id}: {len(ids)} ids, the engine answered {status}: {str(answer)[:200]}")
    assert not wrong, "\n".join(wrong)
    assert served >= 200 and refused >= 1


REFUSED = {
    "both flags": {
        "messages": [{"role": "user", "content": "hi"}],
        "add_generation_prompt": True,
        "continue_final_message": True,
    },
    "no messages": {"messages": []},
    "an untrusted template": {"messages": [{"role": "user", "content": "hi"}], "chat_template": "{{ 1 }}"},
}


@pytest.mark.parametrize("body", REFUSED.values(), ids=REFUSED.keys())
def test_a_refused_body_is_refused_with_vllms_message(
    engine: str, tok: HfTokenizer, body: dict[str, Any]
) -> None:
    status, answer = request(f"{engine}/tokenize", body)
    assert status == 400
    with pytest.raises(TokenizeError) as caught:
        tok.prompt_ids(body, chat=True)
    assert str(caught.value) == answer["error"]["message"]
