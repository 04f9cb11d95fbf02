"""An engine's answer as the client reads it (answer.py, EngineResponse): streamed pieces handed on as they
arrive, silence and breaks, relays from the data callback, interim answers skipped, misframing, and hostile
answers read within their caps."""

from __future__ import annotations

import asyncio
import tracemalloc
from typing import cast

import pytest

from calroute.proxy.http.answer import ProtocolError, UpstreamError
from tests.proxy.http.raw_engine import Engine, Handler, collect, run, sse_chunk, sse_head


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
