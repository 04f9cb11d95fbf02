"""End to end, the precise source: emulated engines publish KV events, the proxy's index follows them, and
a prompt sharing a prefix goes to the engine that holds it, with the cached tokens the engine reports."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from calroute import aio
from calroute.cluster import launch
from calroute.cluster.file import ClusterFile
from calroute.contract.blocks import block_hashes as prefix_block_ids
from calroute.emulator import tokens
from calroute.harness.loadgen import drive
from calroute.proxy.prefix import prompt_blocks
from calroute.types import PREFIX_BLOCK_TOKENS, RequestSpec, RequestStatus, SloClass
from tests.emulator.http import request
from tests.proxy.harness import EMULATOR, RunningProxy
from tests.proxy.test_proxy import records, wait_for


@pytest.fixture
def event_cluster(tmp_path: Path) -> Iterator[ClusterFile]:
    launched = launch.up_emulated(2, 1, tmp_path / "engines", kv_events=True)
    try:
        yield launched.file
    finally:
        launched.stop()  # kills the engines' process groups


def completion(prompt: Any) -> dict[str, Any]:
    return {"model": "emulated", "prompt": prompt, "max_tokens": 2, "ignore_eos": True}


def samples(url: str, name: str) -> list[tuple[dict[str, str], float]]:
    _, text = request(f"{url}/metrics")
    return [
        (s.labels, s.value)
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name
    ]


def prefix_hits(url: str) -> float:
    return sum(v for _, v in samples(url, "vllm:prefix_cache_hits_total"))


def test_a_shared_prefix_goes_where_the_events_say_it_is_cached(
    event_cluster: ClusterFile, proxy_for: Callable[..., RunningProxy]
) -> None:
    assert all(e.kv_events_endpoint for e in event_cluster.engines)
    p = proxy_for(event_cluster, prefix_index=True)
    subscriber, index = p.proxy.kv_events, p.proxy.prefix
    assert subscriber is not None and index is not None
    wait_for(lambda: all(subscriber.is_live(e.id) for e in event_cluster.engines), timeout_s=10)
    time.sleep(0.3)  # PUB/SUB: the subscriptions reach the engines just after the connections
    shared = [3 + (i * 7919) % 4000 for i in range(640)]  # 40 full blocks
    status, _ = request(f"{p.url}/v1/completions", completion(shared + [11] * 10), timeout_s=30)
    assert status == 200
    first = records(p)[-1].prefill_id
    # the engine's BlockStored, not the router's placement (live engines' placements do not count)
    wait_for(lambda: index.blocks_held(first) >= 40, timeout_s=10)
    hits_before = prefix_hits(next(e.url for e in event_cluster.engines if e.id == first))

    status, _ = request(f"{p.url}/v1/completions", completion(shared + [12] * 30), timeout_s=30)
    assert status == 200
    rec = records(p)[-1]
    assert rec.prefill_id == first
    # the hit the router predicted for it (the first request's was 0: the index was empty)
    predicted = sum(v for _, v in samples(p.url, "calroute_prefix_predicted_cached_tokens_total"))
    assert predicted == 640
    assert rec.cached_tokens == predicted  # what the engine said it served from its cache
    engine_hits = prefix_hits(next(e.url for e in event_cluster.engines if e.id == first)) - hits_before
    assert engine_hits == predicted
    live = {labels["engine"]: v for labels, v in samples(p.url, "calroute_kv_events_live")}
    assert live == {e.id: 1.0 for e in event_cluster.engines}
    # the hit ratio's parts on /metrics: 640 of 650 + 670 prompt tokens, as served and as predicted
    totals = {
        name: sum(v for _, v in samples(p.url, f"calroute_{name}_total"))
        for name in ("prompt_tokens", "prefix_cached_tokens", "prefix_predicted_cached_tokens")
    }
    assert totals == {
        "prompt_tokens": 1320,
        "prefix_cached_tokens": 640,
        "prefix_predicted_cached_tokens": 640,
    }

    # The load generator's prompts for requests naming blocks share those blocks' tokens, and the client
    # records what the proxy says the prefill engine served from cache (x-calroute-cached-tokens).
    blocks = (70_001, 70_002)
    specs = [
        RequestSpec(f"lg{i}", 1.0 * i, 2 * PREFIX_BLOCK_TOKENS + 100 + i, 4, SloClass.LOOSE, blocks)
        for i in range(2)
    ]
    result = aio.run(drive(p.url, specs, "emulated", pause_gc=False))
    assert [r.status for r in result.records] == [RequestStatus.OK] * 2
    assert result.records[0].cached_tokens == 0
    assert result.records[1].cached_tokens == 2 * PREFIX_BLOCK_TOKENS == records(p)[-1].cached_tokens


def test_the_proxy_hashes_text_and_token_prompts_as_the_emulator_does() -> None:
    text = tokens.text_of_tokens(100, salt=1)
    ids = tokens.encode(text)
    assert list(prompt_blocks({"prompt": text}, False, EMULATOR)) == prefix_block_ids(ids)
    assert list(prompt_blocks({"prompt": ids}, False, EMULATOR)) == prefix_block_ids(ids)
    assert list(prompt_blocks({"prompt": [ids]}, False, EMULATOR)) == prefix_block_ids(ids)
    chat = {"messages": [{"role": "user", "content": text}]}
    assert list(prompt_blocks(chat, True, EMULATOR)) == prefix_block_ids(
        tokens.encode(tokens.chat_prompt([("user", text)]))
    )
    # the engine refuses these: a negative id ends the blocks (here the first), a body it cannot read has none
    negative = prompt_blocks({"prompt": [-1] * 40}, False, EMULATOR)
    assert list(negative) == [] and len(negative) == 0
    assert list(prompt_blocks({"prompt": [[1], [2]]}, False, EMULATOR)) == []
    # without a tokenizer only token-id prompts have blocks
    assert list(prompt_blocks({"prompt": text}, False, None)) == []
    assert list(prompt_blocks(chat, True, None)) == []
    assert list(prompt_blocks({"prompt": ids}, False, None)) == prefix_block_ids(ids)
