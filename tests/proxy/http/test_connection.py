"""One engine connection: answers parsed from bytes cut anywhere (1xx skipped, every body framing, bytes
after the end), what it cannot read, an engine that closes early, the silence timer."""

from __future__ import annotations

import asyncio

import pytest

from calroute.proxy.http.connection import ClosedEarly, Connection, Silence
from calroute.proxy.http.framing import FramingError
from calroute.proxy.http.head import MAX_HEAD_BYTES


class Wire:
    def is_closing(self) -> bool:
        return False


def cut(raw: bytes, how: str) -> list[bytes]:
    step = {"whole": len(raw) or 1, "bytes": 1, "sevens": 7}[how]
    return [raw[i : i + step] for i in range(0, len(raw), step)]


def parse(pieces: list[bytes], closed: bool = False) -> Connection:
    """A Connection that sent a request and got ``pieces`` (then, if ``closed``, the engine's close)."""

    async def go() -> Connection:
        conn = Connection()
        conn.connection_made(Wire())  # type: ignore[arg-type]
        conn.start()
        for piece in pieces:
            conn.data_received(piece)
        if closed:
            conn.eof_received()
        return conn

    return asyncio.run(go())


H200 = b"HTTP/1.1 200 OK\r\n"
HINTS = b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"
CHUNKED = H200 + b"Transfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: 1\r\n\r\n"


@pytest.mark.parametrize("how", ["whole", "bytes", "sevens"])
@pytest.mark.parametrize(
    ("raw", "closed", "status", "body", "done", "keep_alive", "extra"),
    [
        (OK, False, 200, b"hi", True, True, False),
        (CHUNKED, False, 200, b"abcde", True, True, False),
        (b"HTTP/1.1 100 Continue\r\n\r\n" + OK, False, 200, b"hi", True, True, False),  # 1xx skipped
        (HINTS + b"HTTP/1.1 100 Continue\r\n\r\n" + CHUNKED, False, 200, b"abcde", True, True, False),
        (b"HTTP/1.1 204 No Content\r\n\r\n", False, 204, b"", True, True, False),
        (b"HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n", False, 503, b"", True, True, False),
        (H200 + b"Content-Length: 2\r\nConnection: close\r\n\r\nhi", False, 200, b"hi", True, False, False),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nhi", False, 200, b"hi", True, False, False),
        # Close-delimited: the body ends with the connection (the client reads the close as its end).
        (b"HTTP/1.0 200 OK\r\n\r\nuntil close", True, 200, b"until close", False, False, False),
        # Bytes after the end (a misframing engine): the answer stands, the connection is not reused.
        (OK + b"HTTP/1.1 200 OK\r\n\r\n", False, 200, b"hi", True, True, True),
        (OK + b"junk", False, 200, b"hi", True, True, True),
    ],
)  # fmt: skip
def test_reads_an_answer_however_it_is_cut(
    raw: bytes, closed: bool, status: int, body: bytes, done: bool, keep_alive: bool, extra: bool, how: str
) -> None:
    conn = parse(cut(raw, how), closed)
    assert conn.failure is None and conn.head_done
    assert (conn.status, b"".join(conn.parts), conn.body_done) == (status, body, done)
    assert (conn.keep_alive, conn.extra) == (keep_alive, extra)
    assert conn.reusable() is (not extra and not closed)
    assert conn.until_close is (closed and not done)


def test_headers_lower_cased_and_the_last_of_a_repeat_kept() -> None:
    conn = parse(
        [b"HTTP/1.1 200 OK\r\nX-A: 1\r\nContent-Type: text/plain \r\nx-a: 2\r\nContent-Length: 0\r\n\r\n"]
    )
    assert conn.headers == {b"x-a": b"2", b"content-type": b"text/plain", b"content-length": b"0"}


def test_bytes_with_no_request_sent_make_the_connection_not_reusable() -> None:
    async def go() -> bool:
        conn = Connection()
        conn.connection_made(Wire())  # type: ignore[arg-type]
        conn.data_received(OK)  # an answer to nothing
        return conn.extra

    assert asyncio.run(go())


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"garbage\r\n\r\n", "unreadable"),
        (b"HTTP/1.1 two-hundred\r\n\r\n", "unreadable"),
        (b"HTTP/1.1 OK\r\n\r\n", "unreadable"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -3\r\n\r\n", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n", "chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY", "chunk data"),
        (b"HTTP/1.1 200 OK\nContent-Length: 0\n\n", "unreadable"),  # bare LF
        (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n", "switched"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"y" * (MAX_HEAD_BYTES + 10), "larger than"),
    ],
)
def test_what_cannot_be_read_is_a_framing_error(raw: bytes, says: str) -> None:
    for how in ("whole", "sevens"):
        conn = parse(cut(raw, how))
        assert isinstance(conn.failure, FramingError) and says in str(conn.failure)
        assert not conn.reusable()


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
    conn.start()
    await conn.send(b"GET / HTTP/1.1\r\n")
    return conn, server


async def closed(conn: Connection, server: asyncio.Server) -> None:
    conn.close()
    server.close()
    await server.wait_closed()
    await asyncio.sleep(0.05)  # the server's side sees the close and closes too


@pytest.mark.parametrize(
    ("answer", "close", "error", "received"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Le", True, ClosedEarly, 27),
        (b"", True, ClosedEarly, 0),
        (b"HTTP/1.1 200 OK\r\nX: " + b"y" * (MAX_HEAD_BYTES + 10), False, FramingError, None),
    ],
    ids=["cut head", "nothing", "endless head"],
)
def test_a_head_that_never_completes_is_an_error(
    answer: bytes, close: bool, error: type[Exception], received: int | None
) -> None:
    async def go() -> None:
        conn, server = await connected(answer, close)
        with pytest.raises(error) as caught:
            await asyncio.wait_for(conn.read_head(), 5.0)
        if received is not None:
            assert isinstance(caught.value, ClosedEarly) and caught.value.received == received
        await closed(conn, server)

    asyncio.run(go())


def test_a_head_and_the_body_after_it() -> None:
    async def go() -> tuple[int, bytes, bool]:
        conn, server = await connected(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi", True)
        await conn.read_head()
        while not conn.body_done:
            await conn.wait()
        body = b"".join(conn.parts)
        await closed(conn, server)
        return conn.status, body, conn.body_done

    assert asyncio.run(go()) == (200, b"hi", True)


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
