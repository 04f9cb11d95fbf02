"""The polling client against servers that frame their answers every way HTTP/1.1 allows, and misbehave."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from calroute.proxy.http.scrape import ScrapeError, Scraper

BODY = b"vllm:num_requests_running 1.0\n" * 40

Respond = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[bool]]


def content_length(status: int = 200, extra: bytes = b"") -> Respond:
    async def respond(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> bool:
        w.write(b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n%s\r\n" % (status, len(BODY), extra) + BODY)
        return b"close" not in extra

    return respond


async def chunked(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> bool:
    w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    for i in range(0, len(BODY), 300):
        part = BODY[i : i + 300]
        w.write(b"%x;ext=1\r\n%s\r\n" % (len(part), part))
    w.write(b"0\r\nX-Trailer: y\r\n\r\n")
    return True


async def until_close(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> bool:
    w.write(b"HTTP/1.0 200 OK\r\n\r\n" + BODY)
    return False


async def closes_idle_after_first(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> bool:
    """Answers, then drops the kept-alive connection while the client is away (a keep-alive timeout)."""
    await content_length()(r, w, n)
    return False


async def garbage(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> bool:
    w.write(b"HTTP/1.1 two-hundred\r\n\r\n")
    return False


async def silent(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> bool:
    await asyncio.sleep(5)
    return False


async def serve(respond: Respond, calls: int, timeout_s: float = 0.5) -> tuple[list[object], int]:
    """Run ``calls`` GETs through one Scraper; the outcomes, and how many connections the server saw."""
    connections = 0
    requests = 0

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        nonlocal connections, requests
        connections += 1
        try:
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                assert head.startswith(b"GET /metrics HTTP/1.1\r\n")
                assert b"\r\nAuthorization: Bearer k\r\n" in head
                requests += 1
                keep = await respond(r, w, requests)
                await w.drain()
                if not keep:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            w.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    scraper = Scraper(f"http://127.0.0.1:{port}/metrics", {"Authorization": "Bearer k"}, timeout_s)
    outcomes: list[object] = []
    async with server:
        for _ in range(calls):
            try:
                outcomes.append(await scraper.get())
            except ScrapeError as e:
                outcomes.append(type(e))
            await asyncio.sleep(0.02)
        scraper.close()
    return outcomes, connections


@pytest.mark.parametrize(
    ("respond", "outcome", "connections"),
    [
        (content_length(), (200, BODY), 1),  # kept alive: one connection for every call
        (chunked, (200, BODY), 1),
        (content_length(503), (503, BODY), 1),
        (content_length(extra=b"Connection: close\r\n"), (200, BODY), 3),
        (until_close, (200, BODY), 3),
        (closes_idle_after_first, (200, BODY), 3),  # retried once on a fresh connection, not an error
        (garbage, ScrapeError, 3),
        (silent, ScrapeError, 3),  # the timeout
    ],
)
def test_every_framing_and_failure(respond: Respond, outcome: object, connections: int) -> None:
    outcomes, seen = asyncio.run(serve(respond, 3, timeout_s=0.3))
    assert outcomes == [outcome] * 3
    assert seen == connections


def test_an_engine_that_is_down_is_an_error_not_a_hang() -> None:
    async def go() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        with pytest.raises(ScrapeError):
            await Scraper(f"http://127.0.0.1:{port}/metrics", timeout_s=1.0).get()

    asyncio.run(go())


@pytest.mark.parametrize("url", ["127.0.0.1:8000/metrics", "ftp://host/metrics", "http:///metrics"])
def test_a_bad_url_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="not an http"):
        Scraper(url)


def test_an_endless_metrics_answer_fails_the_poll_within_its_cap() -> None:
    """An engine whose /metrics never ends: the poll fails once the answer passes the cap (with little
    memory held), and the next poll is served on a fresh connection."""
    import tracemalloc

    cap = 256 * 1024
    flood = b"vllm:num_requests_running 1.0\n" * 2000
    answers = 0

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        nonlocal answers
        try:
            await r.readuntil(b"\r\n\r\n")
            answers += 1
            if answers == 2:
                w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY)
                await w.drain()
                return
            w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for _ in range(1000):  # 60 MiB, if read to the end
                w.write(b"%x\r\n%s\r\n" % (len(flood), flood))
                await w.drain()
        except ConnectionError:
            pass
        finally:
            w.close()

    async def go() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        scraper = Scraper(f"http://127.0.0.1:{port}/metrics", timeout_s=5.0, max_bytes=cap)
        tracemalloc.start()
        try:
            with pytest.raises(ScrapeError, match=f"larger than {cap} bytes"):
                await scraper.get()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 3 * cap, peak
        assert await scraper.get() == (200, BODY)
        scraper.close()
        server.close()

    asyncio.run(asyncio.wait_for(go(), 10.0))
