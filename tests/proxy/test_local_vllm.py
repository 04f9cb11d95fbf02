"""The local path on real vLLM (the session's shared 2P+1D cluster, NIXL, KV events): a decode engine of the
NixlConnector setup (kv_both) given a request without kv_transfer_params prefills it itself, on its own
prefix cache, and publishes its blocks; a conversation kept local there (``aggregated``, inner
``cache_aware``) finds its next turn in that cache, as the router predicted from the engine's events.

These run before test_proxy_vllm.py's (their file sorts first), whose last test kills the decode engine."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from calroute.cluster.file import ClusterFile
from calroute.proxy.config import ProxyConfig
from calroute.results.records import RequestRecord, read_records
from calroute.routing.block_hash import block_hashes
from calroute.tokenizer.hf import HfTokenizer
from calroute.types import RequestStatus
from tests.emulator.http import metric, request, stream
from tests.proxy.conftest import CAL
from tests.proxy.harness import RunningProxy

pytestmark = pytest.mark.real_vllm

BLOCK = 128  # the real-vLLM tier's block size
# prefill engines' counters that move with any request they serve
SERVED = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")


@pytest.fixture
def real_cluster(real_vllm_cluster: ClusterFile) -> ClusterFile:
    c = real_vllm_cluster
    assert c.block_tokens == BLOCK and all(e.kv_events_endpoint is not None for e in c.engines)
    for e in c.engines:  # earlier tests' prompts must not count
        assert request(f"{e.url}/reset_prefix_cache", {})[0] == 200
    return c


def until(cond: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def served(c: ClusterFile) -> list[float]:
    return [metric(e.url, name) for e in c.prefill for name in SERVED]


def local_proxy(c: ClusterFile, tmp_path: Path) -> RunningProxy:
    cfg = ProxyConfig(
        cluster=c,
        calibration=CAL,
        log_path=tmp_path / "log.jsonl",
        policy="aggregated",
        policy_params={"inner": "cache_aware"},
        prefix_index=True,
    )
    p = RunningProxy(cfg)
    try:
        subscriber = p.proxy.kv_events
        assert subscriber is not None
        until(lambda: all(subscriber.is_live(e.id) for e in c.engines), "KV event streams not live")
    except BaseException:
        p.stop()
        raise
    time.sleep(0.3)  # PUB/SUB: the subscription reaches the publisher after the connection
    return p


def last(tmp_path: Path) -> RequestRecord:
    return list(read_records(tmp_path / "log.jsonl"))[-1]


def is_local(rec: RequestRecord) -> bool:
    return (
        rec.status is RequestStatus.OK
        and rec.local_prefill
        and rec.path_reason == "aggregated"
        and rec.prefill_id == rec.decode_id == "decode-0"
        and rec.prefill_done_s == rec.first_token_s
    )


def test_a_conversation_kept_local_finds_its_next_turn_in_the_real_decode_engines_cache(
    real_cluster: ClusterFile, tmp_path: Path
) -> None:
    """Token ids: the second turn is the first's prompt, its answer and a new question. The decode engine
    caches the prompt's blocks and the answer's as it computes them, and says so in KV events; the second
    turn hits all of them, as the router predicted, and vLLM reports them in prompt_tokens_details."""
    c = real_cluster
    before = served(c)
    question = [100 + (i * 41) % 1800 for i in range(3 * BLOCK + 44)]  # 3 full blocks and 44 tokens
    with local_proxy(c, tmp_path) as p:
        index = p.proxy.prefix
        assert index is not None
        status, first = request(
            f"{p.url}/v1/completions",
            {
                "model": c.model,
                "prompt": question,
                "max_tokens": 100,
                "temperature": 0,
                "ignore_eos": True,
                "return_token_ids": True,
            },
        )
        assert status == 200, first
        one = last(tmp_path)
        assert is_local(one) and one.cached_tokens == 0 and one.predicted_cached_tokens == 0
        answer = first["choices"][0]["token_ids"]
        assert len(answer) == 100
        # 527 tokens computed (the last answer token is sampled, never fed back): 4 full blocks, the
        # fourth of prompt and answer, which the decode engine's BlockStored events name
        context = question + answer
        until(
            lambda: index.match(block_hashes(context, BLOCK)).get("decode-0") == 4 * BLOCK,
            "no BlockStored from the decode engine for the first turn's prompt and answer",
        )
        follow_up = context + [1900 + i % 90 for i in range(20)]
        status, events = stream(
            f"{p.url}/v1/completions",
            {
                "model": c.model,
                "prompt": follow_up,
                "max_tokens": 8,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
        assert status == 200 and events[-1] == "[DONE]"
        two = last(tmp_path)
        usage: dict[str, Any] = events[-2]["usage"]
    assert is_local(two) and two.prompt_tokens == len(follow_up)
    assert two.predicted_cached_tokens == 4 * BLOCK  # from the decode engine's events
    assert two.cached_tokens == two.predicted_cached_tokens  # what vLLM said it served from its cache
    assert usage["prompt_tokens_details"]["cached_tokens"] == two.cached_tokens
    assert served(c) == before  # no prefill engine served anything


def test_a_chat_conversation_kept_local_hits_the_real_decode_engines_cache(
    real_cluster: ClusterFile, tmp_path: Path
) -> None:
    """Chat, rendered with the model's own template and tokenizer: the next turn repeats the first turn's
    prompt (and the answer as the template renders it back), and the decode engine serves from its cache,
    to the block, what the router predicted from its events."""
    c = real_cluster
    assert c.tokenizer is not None and c.tokenizer != "emulator"
    system = "".join(f"Rule {i}: answer in the style of handler_{i}, briefly.\n" for i in range(40))
    turn: list[dict[str, str]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": "How do I add a handler?"},
    ]
    body = {"model": c.model, "max_tokens": 16, "temperature": 0, "ignore_eos": True}
    before = served(c)
    with local_proxy(c, tmp_path) as p:
        index, tokenizer = p.proxy.prefix, p.proxy.generation.tokenizer
        assert index is not None and isinstance(tokenizer, HfTokenizer)
        status, first = request(f"{p.url}/v1/chat/completions", {**body, "messages": turn})
        assert status == 200, first
        one = last(tmp_path)
        assert is_local(one)
        ids = tokenizer.prompt_ids({"messages": turn}, True)
        full = len(ids) // BLOCK * BLOCK
        assert full >= BLOCK
        until(
            lambda: index.match(block_hashes(ids, BLOCK)).get("decode-0", 0) == full,
            "no BlockStored from the decode engine for the first chat",
        )
        turn += [
            {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
            {"role": "user", "content": "Where is the router?"},
        ]
        status, second = request(f"{p.url}/v1/chat/completions", {**body, "messages": turn})
        assert status == 200, second
        two = last(tmp_path)
    assert is_local(two)
    assert two.predicted_cached_tokens >= full and two.predicted_cached_tokens % BLOCK == 0
    assert two.cached_tokens == two.predicted_cached_tokens
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == two.cached_tokens
    assert served(c) == before
