"""A client that leaves between prefill and decode (proxy/release.py), on in-memory fake engines: the decode
engine that had not taken the request gets the release leg (one token, not streamed, the prefill engine's
KV params), which frees the prefill engine's blocks; where the decode engine had taken it, or the prefill
had not answered, no release is sent. The same on emulated engine processes, with clients leaving at random
points: tests/faults/test_clients_that_leave.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from calroute.aio import run
from calroute.proxy.config import PREFILL_GRACE_S
from calroute.types import RequestStatus
from tests.proxy.fakes import MODEL, FakeCluster, Faults, ProxyOnFakes, read_head, send, until


def body(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "leave early " * 30, "max_tokens": 300, "ignore_eos": True, **kw}


async def leave_when(
    p: ProxyOnFakes,
    payload: dict[str, Any],
    ready: Callable[[], bool],
    path: str = "/v1/completions",
    then: Callable[[], None] = lambda: None,
) -> None:
    """Send ``payload``, wait until ``ready()`` holds and a moment more (the engine's answer under way),
    call ``then()``, then close the connection without reading."""
    _, writer = await send(p.port, path, json.dumps(payload).encode())
    await until(ready)
    await asyncio.sleep(0.1)
    then()
    writer.close()
    await until(lambda: len(p.records()) == 1)
    await p.proxy.generation.releases.done()


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_client_that_leaves_before_the_decode_engine_answers_gets_its_kv_released(
    tmp_path: Path, path: str
) -> None:
    fakes = FakeCluster(1, 1)
    decode = fakes["decode-0"]
    # The decode engine is slow to answer: a JSON answer, which says nothing until it is whole.
    decode.faults = Faults(first_byte_s=5.0)
    payload = body(min_tokens=4)
    if path.endswith("chat/completions"):
        payload.pop("prompt")
        payload["messages"] = [{"role": "user", "content": "leave early " * 30}]

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path, stall_timeout_s=10.0) as p:

            def answer_at_once() -> None:  # what comes next (the release) is answered at once
                decode.faults = Faults()

            await leave_when(p, payload, lambda: bool(decode.sent), path, answer_at_once)
        return p

    p = run(go())
    (rec,) = p.records()
    assert rec.status is RequestStatus.CANCELLED, rec
    assert len(decode.sent) == 2, (rec, decode.sent)
    first, release = decode.sent  # the client's decode leg, then the release
    kv = first.body["kv_transfer_params"]
    assert kv["do_remote_prefill"] is True and release.body["kv_transfer_params"] == kv
    assert release.path == path and release.request_id == rec.request_id
    assert release.body["max_tokens"] == 1 and release.body["stream"] is False
    assert "stream_options" not in release.body and "min_tokens" not in release.body
    assert not fakes.held  # the release pulled the blocks: the prefill engine holds nothing
    assert p.metric("calroute_kv_releases_total", outcome="ok") == 1
    assert p.metric("calroute_engine_errors_total") == 0  # the client left; no engine is at fault


def test_a_stream_whose_client_left_before_its_first_token_gets_no_release(tmp_path: Path) -> None:
    """A stream's head goes out with the decode engine's, so its client's close shows at the first write:
    by then the decode engine made a token, which it could only make after pulling the blocks."""
    fakes = FakeCluster(1, 1)
    decode = fakes["decode-0"]
    decode.faults = Faults(first_byte_s=0.5)

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path, stall_timeout_s=10.0) as p:
            await leave_when(p, body(stream=True), lambda: bool(decode.sent))
        return p

    p = run(go())
    assert p.records()[0].status is RequestStatus.CANCELLED
    assert len(decode.sent) == 1 and not fakes.held
    assert p.metric("calroute_kv_releases_total") == 0


def test_a_client_that_leaves_mid_stream_gets_no_release(tmp_path: Path) -> None:
    fakes = FakeCluster(1, 1)
    fakes["decode-0"].faults = Faults(token_interval_s=0.01)

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path) as p:
            reader, writer = await send(p.port, "/v1/completions", json.dumps(body(stream=True)).encode())
            await read_head(reader)
            await reader.readuntil(b"\n\n")  # a token: the decode engine pulled the blocks
            writer.close()
            await until(lambda: len(p.records()) == 1)
            await p.proxy.generation.releases.done()
        return p

    p = run(go())
    assert p.records()[0].status is RequestStatus.CANCELLED
    assert len(fakes["decode-0"].sent) == 1 and not fakes.held
    assert p.metric("calroute_kv_releases_total") == 0


@pytest.mark.parametrize(
    ("prefill_s", "released"),
    [
        # the prefill engine still silent when the grace ends: its request is closed, which vLLM aborts,
        # freeing its blocks at once; nothing to release
        (5.0, False),
        # it answers within PREFILL_GRACE_S of the client leaving (leave_when leaves after 0.1 s): its KV is
        # released, not left to the lease
        (0.1 + PREFILL_GRACE_S / 2, True),
    ],
    ids=["aborted", "answered in the grace"],
)
def test_a_client_that_leaves_during_the_prefill(tmp_path: Path, prefill_s: float, released: bool) -> None:
    fakes = FakeCluster(1, 1)
    prefill = fakes["prefill-0"]
    prefill.faults = Faults(first_byte_s=prefill_s)

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path, prefill_timeout_s=10.0) as p:
            await leave_when(p, body(), lambda: bool(prefill.sent))
        return p

    p = run(go())
    assert p.records()[0].status is RequestStatus.CANCELLED
    sent = fakes["decode-0"].sent
    if not released:
        assert not sent and p.metric("calroute_kv_releases_total") == 0
        assert not prefill.answers  # closed while the engine was still silent
        return
    (release,) = sent
    assert release.body["max_tokens"] == 1 and release.body["kv_transfer_params"]["do_remote_prefill"]
    assert not fakes.held and p.metric("calroute_kv_releases_total", outcome="ok") == 1


def test_a_release_the_decode_engine_cannot_serve_is_counted_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fakes = FakeCluster(1, 1)
    decode = fakes["decode-0"]
    decode.faults = Faults(first_byte_s=5.0)

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path, stall_timeout_s=10.0, prefill_timeout_s=0.2) as p:

            def refuse() -> None:
                decode.faults = Faults(refuse=True)

            await leave_when(p, body(), lambda: bool(decode.sent), then=refuse)
        return p

    p = run(go())
    assert p.metric("calroute_kv_releases_total", outcome="failed") == 1
    assert "release of request" in caplog.text and "decode-0" in caplog.text
    assert len(p.records()) == 1


def test_a_stopping_proxy_lets_a_release_under_way_finish(tmp_path: Path) -> None:
    fakes = FakeCluster(1, 1)
    decode = fakes["decode-0"]
    decode.faults = Faults(first_byte_s=5.0)

    async def go() -> ProxyOnFakes:
        p = ProxyOnFakes(fakes, tmp_path, stall_timeout_s=10.0, prefill_timeout_s=5.0)
        async with p:
            _, writer = await send(p.port, "/v1/completions", json.dumps(body()).encode())

            await until(lambda: bool(decode.sent))
            await asyncio.sleep(0.1)
            decode.faults = Faults(first_byte_s=0.3)  # the release takes a moment
            writer.close()
            await until(lambda: len(p.records()) == 1)
            await asyncio.sleep(0.05)  # the release is under way; the proxy stops now
        return p

    run(go())
    assert not fakes.held and len(decode.sent) == 2
