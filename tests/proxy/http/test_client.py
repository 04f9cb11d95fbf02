"""The proxy's engine client: POST bodies, streamed answers, silence, breaks, and which connections it keeps.

(The GET framings and failures are covered through the poller in test_scrape.py.)
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import cast

import pytest

from calroute.proxy.http.client import Endpoint, ProtocolError, UnsafeRequest, UpstreamError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, bytes], Awaitable[bool]]
BODY = {"prompt": "hi", "max_tokens": 3, "stream": True}


class Engine:
    """A raw HTTP/1.1 server: reads each request (head and Content-Length body), lets ``handler`` answer,
    and counts connections and requests."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.bodies: list[bytes] = []
        self.heads: list[bytes] = []

    async def __aenter__(self) -> Endpoint:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.endpoint = Endpoint(f"http://127.0.0.1:{port}", keepalive_s=4.0)
        return self.endpoint

    async def __aexit__(self, *exc: object) -> None:
        self.endpoint.close()
        self.server.close()

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                body = await r.readexactly(length)
                self.heads.append(head)
                self.bodies.append(body)
                if not await self.handler(r, w, body):
                    break
                await w.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            w.close()


async def json_answer(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
    out = json.dumps({"echo": json.loads(body)}).encode()
    w.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(out) + out
    )
    return True


def sse_head(w: asyncio.StreamWriter) -> None:
    w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")


def sse_chunk(w: asyncio.StreamWriter, i: int) -> None:
    event = b'data: {"n": %d}\n\n' % i
    w.write(b"%x\r\n%s\r\n" % (len(event), event))


def collect(into: list[bytes]) -> Callable[[bytes], bool]:
    def on_part(part: bytes) -> bool:
        into.append(part)
        return True

    return on_part


def run(coro: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 10.0))


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


def test_a_stream_is_handed_on_as_it_arrives() -> None:
    got_first = asyncio.Event()

    async def stream(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
        sse_head(w)
        sse_chunk(w, 0)
        await w.drain()
        await got_first.wait()  # the second event exists only once the client has the first
        sse_chunk(w, 1)
        w.write(b"0\r\n\r\n")
        return True

    async def go() -> None:
        async with Engine(stream) as ep:
            parts = []
            async with await ep.request("POST", "/v1/completions", {}, b"{}", read_timeout_s=2.0) as resp:
                async for part in resp.parts():
                    parts.append(part)
                    got_first.set()
            assert parts == [b'data: {"n": 0}\n\n', b'data: {"n": 1}\n\n']

    run(go())


async def silent_after_one(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
    sse_head(w)
    sse_chunk(w, 0)
    await w.drain()
    await asyncio.sleep(5)
    return False


async def breaks_after_one(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
    sse_head(w)
    sse_chunk(w, 0)
    await w.drain()
    await asyncio.sleep(0.05)
    w.write(b"5\r\nda")  # half a chunk, then the connection goes
    return False


async def silent_until_close(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
    w.write(b'HTTP/1.0 200 OK\r\n\r\ndata: {"n": 0}\n\n')
    await w.drain()
    await asyncio.sleep(5)
    return False


@pytest.mark.parametrize("read", ["parts", "relay"])
@pytest.mark.parametrize(
    ("handler", "error"),
    [(silent_after_one, TimeoutError), (silent_until_close, TimeoutError), (breaks_after_one, UpstreamError)],
)
def test_silence_is_a_timeout_and_a_break_is_an_upstream_error(
    handler: Handler, error: type[Exception], read: str
) -> None:
    async def go() -> None:
        async with Engine(handler) as ep:
            got: list[bytes] = []
            async with await ep.request("POST", "/v1/completions", {}, b"{}", read_timeout_s=0.3) as resp:
                with pytest.raises(error):  # after what came (a cut chunk's first bytes, too)
                    if read == "relay":
                        await resp.relay(collect(got))
                    else:
                        async for part in resp.parts():
                            got.append(part)
            assert b"".join(got).startswith(b'data: {"n": 0}\n\n')

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


async def three_events_apart(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
    sse_head(w)
    for i in range(3):
        sse_chunk(w, i)
        await w.drain()
        await asyncio.sleep(0.01)
    w.write(b"0\r\n\r\n")
    return True


def test_a_relay_hands_on_each_piece_from_the_callback_and_keeps_the_connection() -> None:
    async def go() -> None:
        engine = Engine(three_events_apart)
        async with engine as ep:
            for _ in range(2):
                got: list[bytes] = []
                async with await ep.request("POST", "/v1/completions", {}, b"{}", read_timeout_s=2.0) as resp:
                    first = await resp.next_part()
                    assert await resp.relay(collect(got)) is True
                assert first is not None and first + b"".join(got) == b"".join(
                    b'data: {"n": %d}\n\n' % i for i in range(3)
                )
        assert engine.connections == 1

    run(go())


def test_a_relay_stopped_early_drops_its_connection() -> None:
    async def go() -> None:
        engine = Engine(three_events_apart)
        async with engine as ep:
            for _ in range(2):
                async with await ep.request("POST", "/v1/completions", {}, b"{}") as resp:
                    assert await resp.relay(lambda part: False) is False
        assert engine.connections == 2

    run(go())


async def continue_then_stream(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
    w.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    await w.drain()
    await asyncio.sleep(0.01)
    return await three_events_apart(r, w, body)


async def misframes_after_one(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
    sse_head(w)
    sse_chunk(w, 0)
    await w.drain()
    await asyncio.sleep(0.01)
    w.write(b"zz\r\n")  # not a chunk size
    return True


@pytest.mark.parametrize("read", ["parts", "relay"])
def test_an_interim_answer_is_skipped(read: str) -> None:
    async def go() -> None:
        engine = Engine(continue_then_stream)
        async with engine as ep:
            for _ in range(2):
                async with await ep.request("POST", "/v1/completions", {}, b"{}", read_timeout_s=2.0) as resp:
                    assert resp.status == 200 and resp.headers[b"transfer-encoding"] == b"chunked"
                    got: list[bytes] = []
                    if read == "relay":
                        assert await resp.relay(collect(got)) is True
                    else:
                        got = [part async for part in resp.parts()]
                assert b"".join(got) == b"".join(b'data: {"n": %d}\n\n' % i for i in range(3))
        assert engine.connections == 1

    run(go())


@pytest.mark.parametrize("read", ["parts", "relay"])
def test_misframing_is_an_upstream_error_and_the_connection_is_dropped(read: str) -> None:
    async def go() -> None:
        engine = Engine(misframes_after_one)
        async with engine as ep:
            got: list[bytes] = []
            async with await ep.request("POST", "/v1/completions", {}, b"{}", read_timeout_s=2.0) as resp:
                with pytest.raises(ProtocolError, match="chunk size"):
                    if read == "relay":
                        await resp.relay(collect(got))
                    else:
                        async for part in resp.parts():
                            got.append(part)
            assert b"".join(got) == b'data: {"n": 0}\n\n'
            assert not ep._idle

    run(go())


# ---- hostile engines, at the socket --------------------------------------------------------------------

CAP = 256 * 1024
FLOOD = b"x" * (64 * 1024)


async def declares_too_much(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
    w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (1 << 40))  # a terabyte, it says
    w.write(FLOOD)
    await w.drain()
    await asyncio.sleep(5)
    return False


async def chunked_without_end(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
    w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    for _ in range(1024):  # 64 MiB, if the client read it all
        w.write(b"%x\r\n%s\r\n" % (len(FLOOD), FLOOD))
        await w.drain()
    return False


async def until_close_without_end(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
    w.write(b"HTTP/1.0 200 OK\r\n\r\n")
    for _ in range(1024):
        w.write(FLOOD)
        await w.drain()
    return False


async def garbage_head(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
    w.write(b"HTTP/1.1 2OO OK\r\n\r\n{}")
    return True


HOSTILE = [
    # (the engine, the protocol error's kind, where it is raised)
    pytest.param(declares_too_much, "too_large", "read", id="content-length-over-the-cap"),
    pytest.param(chunked_without_end, "too_large", "read", id="chunked-without-end"),
    pytest.param(until_close_without_end, "too_large", "read", id="until-close-without-end"),
    pytest.param(misframes_after_one, "framing", "read", id="misframed-chunk"),
    pytest.param(garbage_head, "framing", "request", id="garbage-status-line"),
]


@pytest.mark.parametrize(("handler", "kind", "where"), HOSTILE)
def test_a_hostile_answer_is_a_protocol_error_within_bounded_memory(
    handler: Handler, kind: str, where: str
) -> None:
    import tracemalloc

    async def go() -> None:
        engine = Engine(handler)
        async with engine as ep:
            tracemalloc.start()
            try:
                with pytest.raises(ProtocolError) as raised:
                    async with await ep.request(
                        "POST", "/v1/completions", {}, b"{}", read_timeout_s=5.0
                    ) as r:
                        assert where == "read"
                        await r.read(CAP)
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert raised.value.kind == kind and isinstance(raised.value, UpstreamError)
            assert peak < 3 * CAP, peak
            assert not ep._idle  # its connection is not kept

    run(go())


def test_an_answer_within_its_cap_is_read_whole() -> None:
    async def exactly_the_cap(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(CAP // len(FLOOD)):
            w.write(b"%x\r\n%s\r\n" % (len(FLOOD), FLOOD))
        w.write(b"0\r\n\r\n")
        return True

    async def go() -> None:
        async with Engine(exactly_the_cap) as ep:
            async with await ep.request("POST", "/v1/completions", {}, b"{}") as r:
                assert await r.read(CAP) == FLOOD * (CAP // len(FLOOD))

    run(go())


def test_an_event_without_end_is_cut_at_its_cap_while_relayed() -> None:
    """The relay (proxy/relay.py) over a real connection: an engine that sends one SSE event forever ends
    the relay with a ProtocolError once the event passes its cap."""
    from calroute.proxy.relay import StreamRelay

    class Client:
        def write(self, data: bytes) -> None:
            pass

        def is_closing(self) -> bool:
            return False

        def get_write_buffer_size(self) -> int:
            return 0

    async def go() -> None:
        async with Engine(chunked_without_end) as ep:
            async with await ep.request("POST", "/v1/completions", {}, b"{}", read_timeout_s=5.0) as r:
                relay = StreamRelay(False, lambda: 0.0, lambda now: None, max_event_bytes=CAP)
                relay.attach(cast(asyncio.Transport, Client()), True, r)
                with pytest.raises(ProtocolError, match="SSE event longer than") as raised:
                    await r.relay(relay.piece)
                assert raised.value.kind == "event_too_large" and not relay.started

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
