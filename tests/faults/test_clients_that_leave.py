"""Fifty clients that leave at random points, on emulated engine processes (one per engine): before their
prefill answers, between prefill and decode, mid-stream. The engines' KV comes back to idle within
IDLE_BOUND_S of the last client leaving, far inside the prefill engines' lease, and every request has
exactly one record (docs/faults.md, "Clients that leave"; docs/proxy.md, "A client that leaves").

One decode engine with room for about 18 of these requests' KV, so that decode requests wait in its queue,
holding their prefill engine's blocks: the case vLLM's decode side frees by telling the prefill engine, and
the emulator does as it does (tests/emulator/test_emulator.py). The real-vLLM version of this test:
tests/proxy/test_proxy_vllm.py."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from calroute.cluster import launch
from calroute.emulator.tokens import text_of_tokens
from calroute.proxy.config import ProxyConfig
from calroute.results.records import RequestRecord, read_records
from calroute.types import RequestStatus
from tests.emulator.http import metric
from tests.faults.test_fault_matrix import wait_for
from tests.proxy.conftest import CAL
from tests.proxy.harness import RunningProxy

pytestmark = pytest.mark.faults

CLIENTS = 50
LEASE_S = 30.0  # the emulator's, as vLLM 0.32's kv_lease_duration: a block left to it would fail the bound
IDLE_BOUND_S = 2.0
SEED = 35


def payload(rng: random.Random, i: int) -> tuple[str, dict[str, Any]]:
    text = f"client {i} " + text_of_tokens(rng.randrange(2500, 3500))
    common = {"model": "emulated", "max_tokens": 300, "ignore_eos": True, "stream": rng.random() < 0.5}
    if rng.random() < 0.5:
        return "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": text}]}
    return "/v1/completions", {**common, "prompt": text}


async def client(port: int, path: str, body: dict[str, Any], start_s: float, leave_s: float) -> float:
    """Send, wait, then leave (close the connection): the moment it left."""
    await asyncio.sleep(start_s)
    data = json.dumps(body).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = f"POST {path} HTTP/1.1\r\nHost: calroute\r\nContent-Type: application/json\r\n"
    writer.write(f"{head}Content-Length: {len(data)}\r\n\r\n".encode() + data)

    async def drain() -> None:
        while await reader.read(65536):
            pass

    reading = asyncio.ensure_future(drain())
    await asyncio.wait({reading}, timeout=leave_s)
    reading.cancel()
    writer.close()
    return time.monotonic()


def where_they_left(recs: Iterable[RequestRecord]) -> Counter[str]:
    """How many requests ended where, by their records: finished, or cancelled before the prefill engine
    answered, before the first token, after it."""
    return Counter(
        "finished"
        if r.status is RequestStatus.OK
        else "before the prefill answered"
        if r.prefill_done_s is None
        else "before the first token"
        if r.first_token_s is None
        else "after the first token"
        for r in recs
    )


def usage(urls: list[str]) -> float:
    return sum(metric(url, "vllm:kv_cache_usage_perc") for url in urls)


def test_fifty_clients_that_leave_at_random_points_leave_no_kv_behind(tmp_path: Path) -> None:
    launched = launch.up_emulated(2, 1, tmp_path / "engines", process_per_engine=True, kv_lease_s=LEASE_S)
    try:
        c = launched.file
        urls = [e.url for e in c.engines]
        assert usage(urls) == 0.0
        log = tmp_path / "log.jsonl"
        cfg = ProxyConfig(cluster=c, calibration=CAL, log_path=log, health_interval_s=0.2)
        with RunningProxy(cfg) as p:
            port = int(p.url.rsplit(":", 1)[1])
            rng = random.Random(SEED)
            jobs = []
            for i in range(CLIENTS):
                path, body = payload(rng, i)
                jobs.append(client(port, path, body, i * 0.04, rng.uniform(0.0, 3.0)))

            async def run_all() -> list[float]:
                return list(await asyncio.gather(*jobs))

            last_left_s = max(asyncio.run(run_all()))
            wait_for(lambda: usage(urls) == 0.0, timeout_s=LEASE_S)
            idle_after_s = time.monotonic() - last_left_s
            wait_for(lambda: len(list(read_records(log))) == CLIENTS, timeout_s=10)
            recs = list(read_records(log))
            released = sum(
                s.value
                for m in p.proxy.metrics.kv_releases.collect()
                for s in m.samples
                if s.name.endswith("_total")
            )
        expired = sum(metric(e.url, "vllm:nixl_num_kv_expired_reqs_total") for e in c.prefill)
    finally:
        launched.stop()
    assert len({r.request_id for r in recs}) == CLIENTS
    where = where_they_left(recs)
    print(
        f"clients left: {dict(where)}; KV idle {idle_after_s:.2f} s after the last left; "
        f"{released:g} release legs; {expired:g} leases expired"
    )
    assert set(where) >= {"before the prefill answered", "before the first token", "after the first token"}
    assert all(r.status in (RequestStatus.OK, RequestStatus.CANCELLED) for r in recs)
    assert idle_after_s <= IDLE_BOUND_S and expired == 0
