"""The emulator's KV events: vLLM's transport and wire format, decoded here independently of the publisher."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import msgpack
import pytest
import zmq

from calroute.contract.blocks import BLOCK_TOKENS
from calroute.contract.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventsConfig,
    binds,
    engine_endpoint,
)
from calroute.emulator.group import RunningEngine
from calroute.emulator.kvcache import KvCache
from calroute.errors import ConfigError
from calroute.routing import block_hash
from calroute.types import Role
from tests.emulator.emulated import run_group

EVENTS = KvEventsConfig(
    enable_kv_cache_events=True, publisher="zmq", endpoint="tcp://127.0.0.1:*", topic="kv"
)


def chain(ids: list[int]) -> list[int]:
    """The emulator's block hashes: routing/block_hash.py's chain over 16-token blocks (tested there)."""
    return block_hash.block_hashes(ids, BLOCK_TOKENS)


async def receive(sub: zmq.Socket[bytes], timeout_s: float = 5.0) -> list[bytes]:
    for _ in range(int(timeout_s / 0.01)):
        if sub.poll(0):
            return sub.recv_multipart()
        await asyncio.sleep(0.01)
    raise AssertionError("no KV event message")


async def subscribe(engine: RunningEngine, session: aiohttp.ClientSession) -> zmq.Socket[bytes]:
    """A SUB socket that receives the engine's events (PUB/SUB joins asynchronously: reset the cache until
    an AllBlocksCleared arrives)."""
    assert engine.kv_events_endpoint is not None
    sub: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    sub.connect(engine.kv_events_endpoint)
    for _ in range(100):
        async with session.post(f"{engine.url}/reset_prefix_cache") as r:
            assert r.status == 200
        await asyncio.sleep(0.02)
        if sub.poll(0):
            while sub.poll(50):  # drain the clears sent while joining
                sub.recv_multipart()
            return sub
    raise AssertionError("subscriber never joined")


def test_emulator_publishes_vllm_events_for_a_prompt_then_a_shared_prefix() -> None:
    first = list(range(3, 3 + 40))  # 2 full blocks and 8 tokens
    second = first[:32] + list(range(1000, 1000 + 20))  # the same 2 blocks, then a third of its own

    async def test(engines: list[RunningEngine], session: aiohttp.ClientSession) -> None:
        sub = await subscribe(engines[0], session)
        try:
            seqs = []
            batches: list[Any] = []
            for prompt in (first, second):
                async with session.post(
                    f"{engines[0].url}/v1/completions", json={"prompt": prompt, "max_tokens": 2}
                ) as r:
                    assert r.status == 200, await r.text()
                topic, seq, payload = await receive(sub)
                assert topic == b"kv" and len(seq) == 8
                seqs.append(int.from_bytes(seq, "big"))
                batches.append(msgpack.unpackb(payload))
            async with session.post(f"{engines[0].url}/reset_prefix_cache") as r:
                assert r.status == 200
            _, seq, payload = await receive(sub)
            seqs.append(int.from_bytes(seq, "big"))
            batches.append(msgpack.unpackb(payload))
        finally:
            sub.close()
        assert seqs == list(range(seqs[0], seqs[0] + 3))  # consecutive: one message per step with events
        for batch in batches:
            ts, events, rank = batch  # EventBatch, array layout: ts, events, data_parallel_rank
            assert isinstance(ts, float) and rank == 0
        h1, h2 = chain(first), chain(second)
        assert h1 == h2[:2]
        # BlockStored: block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name
        assert batches[0][1] == [["BlockStored", h1, None, first[:32], 16, None, "GPU", None]]
        # the shared blocks were hits: only the third is stored, chained on the second
        assert batches[1][1] == [["BlockStored", h2[2:], h2[1], second[32:48], 16, None, "GPU", None]]
        assert batches[2][1] == [["AllBlocksCleared"]]

    run_group(test, roles=(Role.PREFILL, Role.DECODE), time_scale=0.01, kv_events=EVENTS)


def serve(kv: KvCache, ids: list[int]) -> None:
    """A request computed whole and finished on ``kv``: admitted, its full blocks cached, freed."""
    from calroute.contract.blocks import block_hashes
    from calroute.kvcache.pool import RequestBlocks

    rb = RequestBlocks()
    hashes = block_hashes(ids)
    hit = kv.lookup(hashes, len(ids))
    assert kv.admit(rb, hashes, hit, -(-len(ids) // BLOCK_TOKENS) - hit, len(ids))
    kv.cache(rb, hashes, len(hashes), ids)
    kv.free(rb)


def test_eviction_is_a_block_removed_and_events_stay_off_by_default() -> None:
    from calroute.contract.blocks import block_hashes

    kv = KvCache(capacity_tokens=3 * BLOCK_TOKENS, record_events=True)
    a = list(range(3, 3 + 32))
    b = list(range(500, 500 + 32))
    serve(kv, a)
    # b's 2 blocks into 3 where a's 2 are cached: the allocation takes the free block, then evicts a's last
    # block, as vLLM frees a request's blocks last first (a's first stays cached, and still hits)
    serve(kv, b)
    ev = kv.take_events()
    assert ev == [
        BlockStored(chain(a), None, a),
        BlockRemoved(chain(a)[1:]),
        BlockStored(chain(b), None, b),
    ]
    assert kv.lookup(block_hashes(a), len(a) + 1) == 1
    assert kv.take_events() == []
    kv.reset_prefix_cache()
    assert kv.take_events() == [AllBlocksCleared()]

    off = KvCache(capacity_tokens=BLOCK_TOKENS)
    serve(off, a[:BLOCK_TOKENS])
    off.reset_prefix_cache()
    assert off.take_events() == []


def test_kv_events_config_is_vllms_json_and_endpoints_offset_per_engine() -> None:
    cfg = KvEventsConfig.from_json('{"enable_kv_cache_events": true, "publisher": "zmq", "topic": "t"}')
    assert cfg.enabled and cfg.endpoint == "tcp://*:5557" and cfg.topic == "t"
    assert not KvEventsConfig.from_json('{"enable_kv_cache_events": false}').enabled
    assert not KvEventsConfig.from_json('{"enable_kv_cache_events": true, "publisher": "null"}').enabled
    for bad, word in (
        ("[]", "object"),
        ('{"enable_kv_cache_events": true, "nope": 1}', "nope"),
        ('{"publisher": "kafka"}', "publisher"),
        ('{"endpoint": "http://x"}', "endpoint"),
        ('{"replay_endpoint": "tcp://*:5558"}', "replay_endpoint"),
        ("{", "JSON"),
    ):
        with pytest.raises(ConfigError, match=word):
            KvEventsConfig.from_json(bad)
    assert engine_endpoint("tcp://*:5557", 0, "127.0.0.1") == "tcp://127.0.0.1:5557"
    assert engine_endpoint("tcp://*:5557", 2, "127.0.0.1") == "tcp://127.0.0.1:5559"
    assert engine_endpoint("tcp://127.0.0.1:*", 3, "127.0.0.1") == "tcp://127.0.0.1:*"
    assert engine_endpoint("tcp://127.0.0.2:7000", 1, "127.0.0.1") == "tcp://127.0.0.2:7001"
    assert engine_endpoint("ipc:///tmp/kv", 1, "127.0.0.1") == "ipc:///tmp/kv_dp1"
    assert binds("tcp://*:5557") and binds("tcp://127.0.0.1:*") and not binds("tcp://127.0.0.1:5557")


def test_the_cluster_file_carries_each_engines_event_endpoint(tmp_path: Any) -> None:
    from calroute.cluster.file import ClusterEngine, ClusterFile

    cluster = ClusterFile(
        "emulated",
        "emulated",
        1000,
        (
            ClusterEngine("p", Role.PREFILL, "http://127.0.0.1:1", 100, "tcp://127.0.0.1:2"),
            ClusterEngine("d", Role.DECODE, "http://127.0.0.1:3", 100),
        ),
    )
    cluster.save(tmp_path / "c.yaml")
    assert ClusterFile.load(tmp_path / "c.yaml") == cluster
    assert "kv_events_endpoint" not in cluster.to_dict()["engines"][1]  # absent, not null
