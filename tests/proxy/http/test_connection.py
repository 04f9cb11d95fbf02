"""One engine connection: reading a head from its buffer, an engine that closes early, the silence timer."""

from __future__ import annotations

import asyncio

import pytest

from calroute.proxy.http.connection import MAX_HEAD_BYTES, ClosedEarly, Connection, Silence
from calroute.proxy.http.framing import FramingError


async def connected(answer: bytes, close: bool) -> tuple[Connection, asyncio.Server]:
    """A Connection to a server that writes ``answer`` once a request line came (and then maybe closes)."""

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            await r.readline()
            w.write(answer)
            await w.drain()
            if not close:
                await r.read()  # until the client closes
        finally:
            w.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _, conn = await asyncio.get_running_loop().create_connection(Connection, "127.0.0.1", port)
    await conn.send(b"GET / HTTP/1.1\r\n")
    return conn, server


async def closed(conn: Connection, server: asyncio.Server) -> None:
    conn.close()
    server.close()
    await server.wait_closed()
    await asyncio.sleep(0.05)  # the server's side sees the close and closes too


@pytest.mark.parametrize(
    ("answer", "close", "error", "partial"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Le", True, ClosedEarly, b"HTTP/1.1 200 OK\r\nContent-Le"),
        (b"", True, ClosedEarly, b""),
        (b"HTTP/1.1 200 OK\r\nX: " + b"y" * (MAX_HEAD_BYTES + 10), False, FramingError, None),
    ],
    ids=["cut head", "nothing", "endless head"],
)
def test_a_head_that_never_completes_is_an_error(
    answer: bytes, close: bool, error: type[Exception], partial: bytes | None
) -> None:
    async def go() -> None:
        conn, server = await connected(answer, close)
        with pytest.raises(error) as caught:
            await asyncio.wait_for(conn.read_head(), 5.0)
        if partial is not None:
            assert isinstance(caught.value, ClosedEarly) and caught.value.partial == partial
        await closed(conn, server)

    asyncio.run(go())


def test_a_head_and_the_bytes_after_it() -> None:
    async def go() -> tuple[int, bytes]:
        conn, server = await connected(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi", True)
        head = await conn.read_head()
        body = b""
        while part := await conn.read_some():
            body += part
        await closed(conn, server)
        return head.status, body

    assert asyncio.run(go()) == (200, b"hi")


def test_the_silence_timer_aborts_only_a_wait_that_lasts() -> None:
    async def go() -> tuple[bool, bool]:
        conn, server = await connected(b"HTTP/1.1 200 OK\r\n", False)
        watch = Silence(conn, 0.1)
        watch.reading = None  # not waiting: the timer moves on
        await asyncio.sleep(0.25)
        before = watch.fired or conn.closed
        watch.reading = watch.now()
        await asyncio.sleep(0.3)
        watch.cancel()
        fired = watch.fired and conn.closed
        await closed(conn, server)
        return before, fired

    assert asyncio.run(go()) == (False, True)
