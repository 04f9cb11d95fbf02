"""Hostile clients against the whole proxy on 127.0.0.1 (fake engines behind it, tests/proxy/fakes.py): heads
and bodies trickled or stalled, more connections than the cap, big bodies that never end, a half-close.
Every one is bounded by a limit of the proxy's server (proxy/http/reader.py Limits), short here so that each
test takes a few seconds; what they held (connections, file descriptors, memory) is let go after."""

from __future__ import annotations

import asyncio
import json
import os
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from calroute.aio import run
from calroute.proxy.http import server as server_mod
from calroute.types import RequestStatus
from tests.proxy.fakes import FakeCluster, Faults, ProxyOnFakes, until

pytestmark = pytest.mark.faults

HEALTH = b"GET /health HTTP/1.1\r\nHost: calroute\r\n\r\n"
MIB = 1024 * 1024


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture(autouse=True)
def short_linger(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_mod, "LINGER_S", 0.2)  # after a refusal, read and drop this long


async def status_of(reader: asyncio.StreamReader) -> int | None:
    """The status of the answer on ``reader``, once the proxy has closed the connection (None: no answer,
    or the connection was reset)."""
    data = b""
    try:
        while chunk := await reader.read(65536):
            data += chunk
    except ConnectionError:
        pass  # a reset after the answer: what came before it still counts
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else None


def serving(tmp_path: Path, test: Callable[[ProxyOnFakes], Awaitable[None]], **limits: Any) -> None:
    """Run ``test`` against a proxy with ``limits``; afterwards the proxy still serves, holds no client
    connection, and this process has the file descriptors it had before the clients came."""

    async def go() -> None:
        async with ProxyOnFakes(FakeCluster(1, 1), tmp_path, **limits) as p:
            before = fds()
            await test(p)
            server = p.proxy._server
            await until(lambda: not server.connections and fds() == before, 3.0)
            assert server.buffered_body_bytes == 0
            assert (await p.get("/health")).status == 200

    run(go())


def test_slow_heads_are_all_closed_at_their_deadline(tmp_path: Path) -> None:
    async def test(p: ProxyOnFakes) -> None:
        async def slow_head() -> tuple[int | None, float]:
            reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
            t0 = time.monotonic()
            writer.write(HEALTH[:5])

            async def trickle() -> None:  # a byte every 0.2 s, never the end of the head
                for i in range(5, 30):
                    await asyncio.sleep(0.2)
                    writer.write(HEALTH[i : i + 1])

            dribbling = asyncio.create_task(trickle())
            try:
                return await status_of(reader), time.monotonic() - t0
            finally:
                dribbling.cancel()
                writer.close()

        got = await asyncio.gather(*(slow_head() for _ in range(200)))
        assert [status for status, _ in got] == [408] * 200
        assert max(took for _, took in got) < 0.5 + 0.2 + 1.0  # the deadline, the linger, slack

    serving(tmp_path, test, head_timeout_s=0.5)


def test_slow_and_stalled_bodies_are_cut(tmp_path: Path) -> None:
    async def test(p: ProxyOnFakes) -> None:
        body = json.dumps({"model": "emulated", "prompt": "x" * 2000, "max_tokens": 1}).encode()
        head = b"POST /v1/completions HTTP/1.1\r\nHost: calroute\r\nContent-Length: %d\r\n\r\n" % len(body)

        async def slow_body(stall: bool) -> int | None:
            reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
            writer.write(head + body[:100])
            first = b""
            try:
                for i in range(100, len(body), 50):  # 50 bytes every 0.1 s: 500 B/s, below the 1 KB/s floor
                    try:
                        first = await asyncio.wait_for(reader.read(65536), 0.1)
                        break  # the answer came: stop sending
                    except TimeoutError:
                        if not stall:
                            writer.write(body[i : i + 50])
                status = await status_of(reader)
                return int(first.split(b" ", 2)[1]) if first.startswith(b"HTTP/1.1 ") else status
            finally:
                writer.close()

        t0 = time.monotonic()
        got = await asyncio.gather(*(slow_body(stall=i % 2 == 0) for i in range(40)))
        assert got == [408] * 40
        assert time.monotonic() - t0 < 2.0 + 1.0  # max(0.5 s, ~2 KB at 1 KB/s), the linger, slack
        assert not p.records()  # never admitted

    serving(tmp_path, test, body_timeout_s=0.5, body_min_rate_bytes_s=1000.0)


def test_the_connection_cap_holds(tmp_path: Path) -> None:
    async def test(p: ProxyOnFakes) -> None:
        held = [await asyncio.open_connection("127.0.0.1", p.port) for _ in range(50)]
        await until(lambda: len(p.proxy._server.connections) == 50)
        extra = [await asyncio.open_connection("127.0.0.1", p.port) for _ in range(20)]
        for reader, writer in extra:  # past the cap: 503 and closed, before they send anything
            data = await asyncio.wait_for(reader.read(), 2.0)
            assert data.startswith(b"HTTP/1.1 503 ") and b"client connections open" in data
            writer.close()
        assert len(p.proxy._server.connections) == 50
        for _, writer in held[:10]:
            writer.close()
        await until(lambda: len(p.proxy._server.connections) == 40)
        reader, writer = await asyncio.open_connection("127.0.0.1", p.port)  # room again
        writer.write(HEALTH)
        assert (await reader.readuntil(b"\r\n")).startswith(b"HTTP/1.1 200 ")
        writer.close()
        for _, writer in held[10:]:
            writer.close()

    serving(tmp_path, test, max_client_connections=50)


def test_stalled_big_bodies_hold_bounded_memory_and_free_it(tmp_path: Path) -> None:
    cap = 16 * MIB
    payload = b"p" * (8 * MIB - 1024)  # near the 8 MiB limit; made before memory is traced
    head = b"POST /v1/completions HTTP/1.1\r\nHost: calroute\r\nContent-Length: %d\r\n\r\n" % (
        len(payload) + 1
    )
    step = 64 * 1024

    async def test(p: ProxyOnFakes) -> None:
        server = p.proxy._server
        most = 0

        async def watch() -> None:
            nonlocal most
            while True:
                most = max(most, server.buffered_body_bytes)
                await asyncio.sleep(0.002)

        async def stalled() -> int | None:
            reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
            view = memoryview(payload)
            try:
                writer.write(head)
                for i in range(0, len(view), step):  # all but its last byte, then silence
                    writer.write(view[i : i + step])
                    await writer.drain()
            except ConnectionError:
                pass
            try:
                return await status_of(reader)
            finally:
                writer.close()

        watching = asyncio.create_task(watch())
        tracemalloc.start()
        try:
            base, _ = tracemalloc.get_traced_memory()
            got = await asyncio.gather(*(stalled() for _ in range(25)))
            await until(lambda: server.buffered_body_bytes == 0 and not server.connections, 3.0)
            await asyncio.sleep(0.1)
            after, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
            watching.cancel()
        assert most <= cap
        assert set(got) <= {408, 503, None} and 408 in got and (503 in got or None in got)
        # 25 bodies of 8 MiB would be 200 MiB: the cap, and reads and client buffers in flight, are much
        # less (16.7 MiB measured); and it is all let go, without waiting for a garbage collection.
        assert peak - base < cap + 4 * MIB, (peak - base) / MIB
        assert after - base < 2 * MIB, (after - base) / MIB

    # A flat 1 s for the body, whatever its length: the stalled ones are let go soon.
    serving(tmp_path, test, body_timeout_s=1.0, body_min_rate_bytes_s=1e12, max_buffered_body_bytes=cap)


def test_a_half_closed_client_gets_its_answer_and_one_that_left_is_cancelled(tmp_path: Path) -> None:
    async def test(p: ProxyOnFakes) -> None:
        p.fakes["decode-0"].faults = Faults(first_byte_s=0.3)  # the answer is under way when the FIN comes
        body = json.dumps({"model": "emulated", "prompt": "hi", "max_tokens": 3}).encode()
        head = b"POST /v1/completions HTTP/1.1\r\nHost: calroute\r\nContent-Length: %d\r\n\r\n" % len(body)
        reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
        writer.write(head + body)
        writer.write_eof()  # shutdown(SHUT_WR): the request is all it will send
        data = await asyncio.wait_for(reader.read(), 3.0)  # the answer, then the proxy's close
        writer.close()
        data = data.removeprefix(b"HTTP/1.1 100 Continue\r\n\r\n")  # drawn to tell it from a close
        assert data.startswith(b"HTTP/1.1 200 "), data[:200]
        # A client that closes for good (the same FIN) while its answer is under way: cancelled, as before.
        reader, writer = await asyncio.open_connection("127.0.0.1", p.port)
        writer.write(head + body)
        await asyncio.sleep(0.05)
        writer.close()
        await until(lambda: len(p.records()) == 2, 3.0)
        assert [r.status for r in p.records()] == [RequestStatus.OK, RequestStatus.CANCELLED]

    serving(tmp_path, test)
