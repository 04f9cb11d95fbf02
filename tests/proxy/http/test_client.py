"""The proxy's engine client (client.py, Endpoint): POST requests going out whole, which connections it
keeps, replaces and expires, an engine that is down, and what it refuses to send. Reading answers:
test_answer.py.

(The GET framings and failures are covered through the poller in test_scrape.py.)
"""

from __future__ import annotations

import asyncio
import json

import pytest

from calroute.proxy.http.answer import UpstreamError
from calroute.proxy.http.client import Endpoint, UnsafeRequest
from tests.proxy.http.raw_engine import BODY, Engine, json_answer, run, sse_chunk, sse_head


def test_a_post_goes_out_whole_and_the_connection_is_kept() -> None:
    async def go() -> None:
        engine = Engine(json_answer)
        async with engine as ep:
            for i in range(3):
                body = json.dumps({**BODY, "i": i}).encode()
                async with await ep.request(
                    "POST", "/v1/completions", {"X-Request-Id": f"r{i}"}, body
                ) as resp:
                    assert resp.status == 200
                    assert json.loads(await resp.read()) == {"echo": {**BODY, "i": i}}
        assert engine.connections == 1
        assert [json.loads(b)["i"] for b in engine.bodies] == [0, 1, 2]
        assert engine.heads[2].startswith(b"POST /v1/completions HTTP/1.1\r\n")
        assert b"\r\nX-Request-Id: r2\r\n" in engine.heads[2]

    run(go())


def test_only_a_response_read_to_the_end_gives_its_connection_back() -> None:
    async def two_events(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
        sse_head(w)
        sse_chunk(w, 0)
        sse_chunk(w, 1)
        w.write(b"0\r\n\r\n")
        return True

    async def go() -> None:
        engine = Engine(two_events)
        async with engine as ep:
            async with await ep.request("POST", "/v1/completions", {}, b"{}") as resp:
                async for _ in resp.parts():
                    break  # the client went away mid-stream: the rest is never read
            async with await ep.request("POST", "/v1/completions", {}, b"{}") as resp:
                assert len([p async for p in resp.parts()]) == 2
            async with await ep.request("POST", "/v1/completions", {}, b"{}") as resp:
                await resp.read()
        assert engine.connections == 2  # the abandoned one was closed; the finished one kept

    run(go())


def test_a_kept_connection_the_engine_closed_is_replaced_once() -> None:
    async def answer_then_close(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
        await json_answer(r, w, body)
        return False  # closes without saying so (a keep-alive timeout on the engine's side)

    async def go() -> None:
        engine = Engine(answer_then_close)
        async with engine as ep:
            for _ in range(3):
                async with await ep.request("POST", "/v1/completions", {}, b'{"a": 1}') as resp:
                    assert resp.status == 200
                    await resp.read()
                await asyncio.sleep(0.05)
        assert engine.connections == 3
        assert engine.bodies == [b'{"a": 1}'] * 3  # every request reached the engine exactly once

    run(go())


def test_a_fresh_connection_closed_without_an_answer_is_an_error_not_a_loop() -> None:
    async def hang_up(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
        return False

    async def go() -> None:
        engine = Engine(hang_up)
        async with engine as ep:
            with pytest.raises(UpstreamError):
                await ep.request("POST", "/v1/completions", {}, b"{}")
        assert engine.connections == 1

    run(go())


def test_idle_connections_expire() -> None:
    async def go() -> None:
        engine = Engine(json_answer)
        async with engine as ep:
            ep.keepalive_s = 0.05
            for _ in range(2):
                async with await ep.request("POST", "/v1/completions", {}, b"{}") as resp:
                    await resp.read()
                await asyncio.sleep(0.1)
        assert engine.connections == 2

    run(go())


def test_idle_connections_are_closed_without_new_requests() -> None:
    # After a burst of concurrent requests, every connection it opened is closed once idle for keepalive_s.
    async def go() -> None:
        engine = Engine(json_answer)
        async with engine as ep:
            ep.keepalive_s = 0.1

            async def one() -> None:
                async with await ep.request("POST", "/v1/completions", {}, b"{}") as resp:
                    await resp.read()

            await asyncio.gather(*(one() for _ in range(5)))
            assert engine.connections == 5
            kept = [conn for _, conn in ep._idle]
            assert len(kept) == 5 and not any(conn.is_closing() for conn in kept)
            await asyncio.sleep(0.3)
            assert not ep._idle and all(conn.is_closing() for conn in kept)

    run(go())


def test_an_engine_that_is_down_is_an_upstream_error() -> None:
    async def go() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        with pytest.raises(UpstreamError):
            await Endpoint(f"http://127.0.0.1:{port}", 4.0).request("POST", "/v1/completions", {}, b"{}")

    run(go())


UNSAFE = [
    pytest.param("POST\r\nX: 1", "/v1/completions", {}, id="method"),
    pytest.param("POST", "/v1/completions HTTP/1.1\r\nX-Evil: 1\r\n", {}, id="path"),
    pytest.param("POST", "/v1/completions", {"traceparent": "00-1-2-01\nX-Evil: 1"}, id="value-lf"),
    pytest.param("POST", "/v1/completions", {"traceparent": "00-1-2-01\rX-Evil: 1"}, id="value-cr"),
    pytest.param("POST", "/v1/completions", {"tracestate": "a=b\x00"}, id="value-nul"),
    pytest.param("POST", "/v1/completions", {"X-Evil\r\nX-More": "1"}, id="name-crlf"),
    pytest.param("POST", "/v1/completions", {"X-Evil: 1": "v"}, id="name-colon"),
    pytest.param("POST", "/v1/completions", {"": "1"}, id="name-empty"),
]


@pytest.mark.parametrize(("method", "path", "headers"), UNSAFE)
def test_a_request_with_a_line_break_in_a_line_is_refused_before_it_is_sent(
    method: str, path: str, headers: dict[str, str]
) -> None:
    async def go() -> None:
        engine = Engine(json_answer)
        async with engine as ep:
            with pytest.raises(UnsafeRequest):
                await ep.request(method, path, headers, b"{}")
            assert engine.connections == 0  # nothing was sent, no connection opened
            # and a clean request still goes out
            async with await ep.request("POST", "/v1/completions", {"traceparent": "t"}, b"{}") as r:
                assert r.status == 200 and await r.read()

    run(go())
