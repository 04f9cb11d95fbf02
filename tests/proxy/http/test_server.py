"""The proxy's HTTP/1.1 server: requests parsed from bytes cut anywhere (on a fake transport, no socket),
what it refuses and how, and on raw sockets framing, limits, keep-alive, cancellation, shutdown."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calroute import aio
from calroute.proxy.config import ClientLimits
from calroute.proxy.http import server as server_mod
from calroute.proxy.http.head import MAX_HEAD_BYTES
from calroute.proxy.http.messages import Request, Response, Stream, json_response
from calroute.proxy.http.server import Server

POST = b"POST /echo HTTP/1.1\r\nHost: x\r\n"
GET = b"GET /echo HTTP/1.1\r\nHost: x\r\n"
MAX_BODY = 1000
LIMITS = ClientLimits(max_body_bytes=MAX_BODY)  # the others: the proxy's defaults
TIMEOUT_S = 5.0


class App:
    """Handlers that show what the server gave them."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.release = asyncio.Event()

    async def echo(self, request: Request) -> Response:
        return json_response(
            {
                "body": request.body.decode(),
                "query": request.query,
                "x": request.headers.get("X-Thing"),
                "has_x": "x-THING" in request.headers,
            }
        )

    async def stream(self, request: Request) -> Stream:
        s = request.stream(200, {"Content-Type": "text/event-stream"})
        for i in range(3):
            await s.write(f"data: {i}\n\n".encode())
        return s

    async def boom(self, request: Request) -> Response:
        raise RuntimeError("handler bug")

    async def hang(self, request: Request) -> Response:
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return json_response({"released": True})

    def server(self) -> Server:
        return Server(
            {
                ("POST", "/echo"): self.echo,
                ("GET", "/echo"): self.echo,
                ("GET", "/stream"): self.stream,
                ("GET", "/boom"): self.boom,
                ("GET", "/hang"): self.hang,
            },
            LIMITS,
        )


Test = Callable[[App, Server, int], Awaitable[None]]
Runner = Callable[[Test], None]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Runner:
    """The server runs on uvloop in `calroute serve` and on asyncio's loop in the in-process tests."""

    def runner(test: Test) -> None:
        async def main() -> None:
            app = App()
            srv = app.server()
            port = await srv.start("127.0.0.1", 0)
            try:
                await asyncio.wait_for(test(app, srv, port), TIMEOUT_S)
            finally:
                await srv.stop(grace_s=0.5)

        (aio.run if request.param == "uvloop" else asyncio.run)(main())

    return runner


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One response; its body by Content-Length, chunked framing, or (neither) the connection's close."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(head[0].split(" ")[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:] if line)}
    if "content-length" in headers:
        return status, headers, await reader.readexactly(int(headers["content-length"]))
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
            chunk = await reader.readexactly(size + 2)
            if not size:
                return status, headers, body
            body += chunk[:-2]
    if status == 100:
        return status, headers, b""
    return status, headers, await reader.read()


@asynccontextmanager
async def connected(
    port: int, raw: bytes
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A client connection that has sent ``raw``; closed on the way out."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    try:
        yield reader, writer
    finally:
        writer.close()


async def exchange(port: int, raw: bytes, responses: int = 1) -> list[tuple[int, dict[str, str], bytes]]:
    async with connected(port, raw) as (reader, _):
        return [await read_response(reader) for _ in range(responses)]


def post(path: str, body: bytes, extra: str = "") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


@pytest.mark.parametrize(
    ("raw", "status", "error"),
    [
        # One of each kind of refusal reaches the client over a socket (the fake-transport table below
        # has them all).
        (b"GARBAGE\r\n\r\n", 400, "malformed request line"),
        (b"GET /echo HTTP/2.0\r\n\r\n", 400, "unsupported version"),
        (b"GET /echo HTTP/1.1\r\nHost : x\r\n\r\n", 400, "malformed request head"),
        (POST + b"Transfer-Encoding: gzip\r\n\r\n", 400, "Transfer-Encoding"),
        (POST + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n", 400, "chunk size"),
        (GET + b"X-Big: " + b"a" * 70_000 + b"\r\n\r\n", 431, "head larger"),
        (
            GET + b"X-Big: " + b"a" * 9_000 + b"\r\n\r\n",
            431,
            "line longer than 8192",
        ),
        (post("/echo", b"x" * (MAX_BODY + 1)), 413, "larger than 1000 bytes"),
        (
            POST
            + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
            % (MAX_BODY + 1, b"y" * (MAX_BODY + 1)),
            413,
            "larger than 1000 bytes",
        ),
        (
            b"GET /echo HTTP/1.1\nHost: x\n\n",
            400,
            "malformed request head",
        ),  # bare LF: an answer, not silence
        (b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n", 404, "no route /nowhere"),
        (b"DELETE /echo HTTP/1.1\r\nHost: x\r\n\r\n", 405, "use GET, POST"),
        (b"GET /boom HTTP/1.1\r\nHost: x\r\n\r\n", 500, "internal error"),
    ],
)
def test_what_cannot_be_served_gets_a_json_error(raw: bytes, status: int, error: str, run: Runner) -> None:
    async def test(app: App, srv: Server, port: int) -> None:
        [(got, headers, body)] = await exchange(port, raw)
        assert got == status
        assert headers["content-type"] == "application/json"
        assert error in json.loads(body)["error"]["message"]

    run(test)


def test_keep_alive_pipelining_and_bodies_by_length_or_chunks(run: Runner) -> None:
    async def test(app: App, srv: Server, port: int) -> None:
        chunked = POST + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\n\r\n"
        raw = post("/echo?q=1", b"hello", "X-Thing: yes\r\n") + chunked + GET + b"\r\n"
        answers = await exchange(port, raw, responses=3)
        bodies = [json.loads(b) for _, _, b in answers]
        assert [s for s, _, _ in answers] == [200, 200, 200]
        assert bodies[0] == {"body": "hello", "query": "q=1", "x": "yes", "has_x": True}
        assert bodies[1]["body"] == "abcde" and bodies[2]["body"] == ""
        assert all("connection" not in h and "date" in h for _, h, _ in answers)

    run(test)


@pytest.mark.parametrize(
    ("version", "connection", "stays_open"),
    [("1.1", "", True), ("1.1", "close", False), ("1.0", "", False), ("1.0", "keep-alive", True)],
)
def test_which_connections_stay_open(version: str, connection: str, stays_open: bool, run: Runner) -> None:
    async def test(app: App, srv: Server, port: int) -> None:
        extra = f"Connection: {connection}\r\n" if connection else ""
        async with connected(port, f"GET /echo HTTP/{version}\r\nHost: x\r\n{extra}\r\n".encode()) as (
            reader,
            writer,
        ):
            status, headers, _ = await read_response(reader)
            assert status == 200 and (headers.get("connection") == "close") is not stays_open
            if stays_open:
                writer.write(GET + b"\r\n")
                assert (await read_response(reader))[0] == 200
            else:
                assert await reader.read() == b""  # closed by the server

    run(test)


def test_expect_continue_is_answered_before_the_body_comes(run: Runner) -> None:
    async def test(app: App, srv: Server, port: int) -> None:
        head = POST + b"Content-Length: 4\r\nExpect: 100-continue\r\n\r\n"
        async with connected(port, head) as (reader, writer):
            assert (await read_response(reader))[0] == 100
            writer.write(b"body")
            status, _, body = await read_response(reader)
        assert status == 200 and json.loads(body)["body"] == "body"

    run(test)


def test_an_oversized_body_is_refused_before_it_is_read_and_the_refusal_arrives(run: Runner) -> None:
    async def test(app: App, srv: Server, port: int) -> None:
        head = POST + b"Content-Length: 5000000\r\n\r\n"
        async with connected(port, head) as (reader, writer):
            for _ in range(50):  # the client keeps sending after the refusal: no reset loses the answer
                writer.write(b"z" * 100_000)
                await writer.drain()
            status, _, body = await read_response(reader)
        assert status == 413 and "larger than" in json.loads(body)["error"]["message"]

    run(test)


@pytest.mark.parametrize(
    ("version", "ask", "encoding", "connection"),
    [("1.1", "", "chunked", None), ("1.1", "close", "chunked", "close"), ("1.0", "", None, "close")],
)
def test_a_stream_is_chunked_for_http11_and_close_delimited_for_http10(
    version: str, ask: str, encoding: str | None, connection: str | None, run: Runner
) -> None:
    async def test(app: App, srv: Server, port: int) -> None:
        extra = f"Connection: {ask}\r\n" if ask else ""
        async with connected(port, f"GET /stream HTTP/{version}\r\nHost: x\r\n{extra}\r\n".encode()) as (
            reader,
            _,
        ):
            status, headers, body = await read_response(reader)
            closed = connection != "close" or await reader.read() == b""
        assert status == 200 and headers["content-type"] == "text/event-stream"
        assert headers.get("transfer-encoding") == encoding and headers.get("connection") == connection
        assert body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n" and closed

    run(test)


def test_a_client_that_leaves_cancels_its_handler(run: Runner) -> None:
    async def test(app: App, srv: Server, port: int) -> None:
        async with connected(port, b"GET /hang HTTP/1.1\r\nHost: x\r\n\r\n"):
            await asyncio.sleep(0.1)
        await asyncio.wait_for(app.cancelled.wait(), 2.0)

    run(test)


def test_an_idle_connection_is_closed(run: Runner) -> None:
    async def test(app: App, srv: Server, port: int) -> None:
        srv.limits = replace(LIMITS, keepalive_timeout_s=0.2)
        async with connected(port, GET + b"\r\n") as (reader, _):
            assert (await read_response(reader))[0] == 200
            assert await asyncio.wait_for(reader.read(), 2.0) == b""

    run(test)


def test_stop_lets_a_request_under_way_finish_then_closes(run: Runner) -> None:
    async def test(app: App, srv: Server, port: int) -> None:
        async with connected(port, b"GET /hang HTTP/1.1\r\nHost: x\r\n\r\n") as (reader, _):
            await asyncio.sleep(0.1)
            stopping = asyncio.create_task(srv.stop(grace_s=2.0))
            await asyncio.sleep(0.1)
            app.release.set()
            status, _, body = await read_response(reader)
            assert status == 200 and json.loads(body) == {"released": True}
            await stopping
            assert await reader.read() == b""
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", port)

    run(test)


# ---- requests parsed from bytes cut anywhere, on a fake transport ---------------------------------------


class Wire:
    """The client's end of a connection, without a socket: what the server wrote, and what it did."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.closing = self.eof = self.paused = False

    def write(self, data: bytes) -> None:
        self.out += data

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def get_write_buffer_size(self) -> int:
        return 0


Answer = tuple[int, dict[str, str], bytes]


def answers(out: bytes) -> list[Answer]:
    """The server's answers, each whole (a Content-Length body, or none for 100 Continue)."""
    got: list[Answer] = []
    while out:
        head, _, out = out.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        got.append((int(lines[0].split(" ")[1]), headers, out[:length]))
        out = out[length:]
    return got


def cut(raw: bytes, how: str) -> list[bytes]:
    if how == "whole":
        return [raw]
    if how == "bytes":
        return [raw[i : i + 1] for i in range(len(raw))]
    return [raw[i : i + 7] for i in range(0, len(raw), 7)]


def serve(
    pieces: list[bytes], limits: ClientLimits = LIMITS, eof: bool = False
) -> tuple[list[Answer], list[Request], Wire]:
    """Feed ``pieces`` to one connection, letting handlers run after each (then, with ``eof``, shut the
    client's side); the answers written, the requests the handlers saw, the transport."""
    seen: list[Request] = []

    async def echo(request: Request) -> Response:
        seen.append(request)
        await asyncio.sleep(0)  # an answer under way while more arrives
        return json_response({"body": request.body.decode()})

    async def main() -> Wire:
        srv = Server({("POST", "/echo"): echo, ("GET", "/echo"): echo}, limits)
        conn = server_mod._Connection(srv)
        wire = Wire()
        conn.connection_made(wire)  # type: ignore[arg-type]
        for piece in pieces:
            conn.data_received(piece)
            for _ in range(5 if len(pieces) < 10 else 1):  # a client that waits for answers, unless cut fine
                await asyncio.sleep(0)
        if eof and not conn.eof_received():
            wire.close()  # as the transport does when its protocol does not keep it open
        for _ in range(20):
            await asyncio.sleep(0)
        conn.connection_lost(None)
        return wire

    wire = asyncio.run(main())
    return answers(bytes(wire.out)), seen, wire


@pytest.mark.parametrize("how", ["whole", "bytes", "sevens"])
@pytest.mark.parametrize(
    ("raw", "method", "target", "http11", "keep_alive", "body"),
    [
        (GET + b"\r\n", "GET", "/echo", True, True, b""),
        (GET + b"Connection: close\r\n\r\n", "GET", "/echo", True, False, b""),
        (b"GET /echo HTTP/1.0\r\n\r\n", "GET", "/echo", False, False, b""),
        (b"GET /echo HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", "GET", "/echo", False, True, b""),
        # A stray CRLF first.
        (b"\r\nGET /echo?a=1 HTTP/1.1\r\nHost: x\r\n\r\n", "GET", "/echo?a=1", True, True, b""),
        (post("/echo", b"hello"), "POST", "/echo", True, True, b"hello"),
        (
            POST + b"Transfer-Encoding: Chunked\r\n\r\n3\r\nabc\r\n2;x=1\r\nde\r\n0\r\nT: 1\r\n\r\n",
            "POST", "/echo", True, True, b"abcde",
        ),
        # An Upgrade the server does not take: served as a plain request.
        (GET + b"Upgrade: h2c\r\nConnection: Upgrade\r\n\r\n", "GET", "/echo", True, True, b""),
    ],
)  # fmt: skip
def test_reads_a_request_however_it_is_cut(
    raw: bytes, method: str, target: str, http11: bool, keep_alive: bool, body: bytes, how: str
) -> None:
    got, seen, wire = serve(cut(raw, how))
    [request] = seen
    path, _, query = target.partition("?")
    assert (request.method, request.path, request.query, request.body) == (method, path, query, body)
    assert (request.http11, request.keep_alive) == (http11, keep_alive)
    assert [status for status, _, _ in got] == [200]
    assert wire.closing is not keep_alive


def test_headers_any_case_repeats_joined_trailers_not_kept() -> None:
    raw = (
        POST + b"X-Tag: a\r\nx-tag: b  \r\nAuthorization: Bearer t\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n1\r\nz\r\n0\r\nX-Trailer: 1\r\n\r\n"
    )
    _, [request], _ = serve([raw])
    assert request.headers.get("X-TAG") == "a, b" and "AUTHORIZATION" in request.headers
    assert "x-trailer" not in request.headers and request.headers.get("missing", "d") == "d"


@pytest.mark.parametrize("how", ["whole", "bytes"])
@pytest.mark.parametrize(
    ("raw", "status", "says"),
    [
        (b"GET /", 400, None),  # never finished: no answer until the connection ends
        (b"GARBAGE\r\n\r\n", 400, "malformed request line"),
        (b"G3T /echo HTTP/1.1\r\nHost: x\r\n\r\n", 400, "malformed request line"),
        # A method llhttp does not know.
        (b"FOO /echo HTTP/1.1\r\nHost: x\r\n\r\n", 400, "malformed request line"),
        (b"GET echo HTTP/1.1\r\nHost: x\r\n\r\n", 400, "malformed request line"),
        (b"GET http://h/echo HTTP/1.1\r\nHost: x\r\n\r\n", 400, "is not a path"),
        (b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", 400, "is not a path"),
        (b"GET /echo HTTP/2.0\r\n\r\n", 400, "unsupported version"),
        (b"GET /echo HTTP/1.2\r\n\r\n", 400, "unsupported version"),
        # Bare LF line endings, anywhere: refused, never left waiting for a CRLF.
        (b"GET /echo HTTP/1.1\nHost: x\n\n", 400, "malformed request head"),
        (b"GET /echo HTTP/1.1\r\nHost: x\n\r\n", 400, "malformed request head"),
        (GET + b"\n", 400, "malformed request head"),
        (GET + b"NoColon\r\n\r\n", 400, "malformed request head"),
        (GET + b" Folded: x\r\n\r\n", 400, "malformed request head"),
        (GET + b"X: a\r\n folded\r\n\r\n", 400, "malformed request head"),
        (GET + b"Bad Name: x\r\n\r\n", 400, "malformed request head"),
        (GET + b"X: a\x01b\r\n\r\n", 400, "malformed request head"),  # a control byte
        # What llhttp refuses on its own, each proven here: control bytes in a name or a value, a bare CR.
        (GET + b"X\x01Y: a\r\n\r\n", 400, "malformed request head"),
        (GET + b"X\x00: a\r\n\r\n", 400, "malformed request head"),
        (GET + b"X: a\x00b\r\n\r\n", 400, "malformed request head"),
        (GET + b"X: a\x7fb\r\n\r\n", 400, "malformed request head"),
        (GET + b"X: a\rb\r\n\r\n", 400, "malformed request head"),  # a bare CR in a value
        (GET + b"X: a\r\r\n\r\n", 400, "malformed request head"),
        (b"GET /echo HTTP/1.1\rHost: x\r\n\r\n", 400, "malformed request"),  # in the request line
        (b"GET /ec\x01ho HTTP/1.1\r\nHost: x\r\n\r\n", 400, "malformed request line"),
        # Beyond llhttp: Host as RFC 9112 3.2 asks, Transfer-Encoding only from HTTP/1.1 (6.1).
        (b"GET /echo HTTP/1.1\r\n\r\n", 400, "without a Host header"),
        (GET + b"Host: y\r\n\r\n", 400, "two Host headers"),
        (GET + b"host: x\r\n\r\n", 400, "two Host headers"),
        (b"POST /echo HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400, "HTTP/1.0"),
        # Requests that could be read two ways (RFC 9112 6.3): refused, the connection closed.
        (POST + b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400, "Content-Length"),
        (POST + b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", 400, "Content-Length"),
        (POST + b"Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", 400, "Content-Length"),
        # The same length twice: refused too (llhttp), where the old parser read one length.
        (POST + b"Content-Length: 3\r\nContent-Length: 3\r\n\r\nabc", 400, "Content-Length"),
        (POST + b"Content-Length: -1\r\n\r\n", 400, "Content-Length"),
        (POST + b"Content-Length: 1x\r\n\r\n", 400, "Content-Length"),
        (POST + b"Transfer-Encoding: gzip\r\n\r\n", 400, "unsupported Transfer-Encoding"),
        (POST + b"Transfer-Encoding: gzip, chunked\r\n\r\n", 400, "unsupported Transfer-Encoding"),
        (POST + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n", 400, "chunk size"),
        (POST + b"Transfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n", 400, "chunk size"),
        (POST + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabcXY", 400, "chunk"),
        # Chunk sizes llhttp refuses: a prefix, spaces around, a size past 64 bits.
        (POST + b"Transfer-Encoding: chunked\r\n\r\n0x36\r\n", 400, "chunk size"),
        (POST + b"Transfer-Encoding: chunked\r\n\r\n 36 \r\n", 400, "chunk size"),
        (POST + b"Transfer-Encoding: chunked\r\n\r\n 36\r\n", 400, "chunk size"),
        (POST + b"Transfer-Encoding: chunked\r\n\r\n" + b"f" * 17 + b"\r\n", 400, "Chunk size overflow"),
        (POST + b"Transfer-Encoding: chunked\r\n\r\n3\nabc\r\n", 400, "chunk size"),  # bare LF
        (POST + b"Content-Length: 1001\r\n\r\n", 413, "larger than 1000 bytes"),
        (
            POST + b"Transfer-Encoding: chunked\r\n\r\n" + (b"1f4\r\n" + b"y" * 500 + b"\r\n") * 3,
            413, "larger than 1000 bytes",
        ),
        (POST + b"Upgrade: h2c\r\nConnection: Upgrade\r\nContent-Length: 2\r\n\r\nhi", 400, "Upgrade"),
        (GET + b"X: " + b"a" * 8200 + b"\r\n\r\n", 431, "line longer than 8192"),
        (b"GET /" + b"a" * 8200 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 431, "line longer than 8192"),
        (GET + b"X: 1234567890\r\n" * 5000 + b"\r\n", 431, "head larger"),
    ],
)  # fmt: skip
def test_refuses_a_request_with_a_json_error_and_closes(
    raw: bytes, status: int, says: str | None, how: str
) -> None:
    # An 80 KB head fed one byte per read takes 80,000 event-loop turns: beyond 20 KB, a prime-sized cut
    # (97 bytes) still splits every line and the limit across reads.
    pieces = (
        [raw[i : i + 97] for i in range(0, len(raw), 97)] if how == "bytes" and len(raw) > 20_000 else None
    )
    got, seen, wire = serve(pieces or cut(raw, how))
    assert not seen
    if says is None:
        assert got == [] and not wire.closing
        return
    [(answered, headers, body)] = got
    assert answered == status and headers["content-type"] == "application/json"
    assert headers["connection"] == "close" and wire.eof  # closed after a linger, not at once
    error = json.loads(body)["error"]
    assert says in error["message"] and error["code"] == status


@pytest.mark.parametrize("how", ["whole", "sevens", "4096s"])
@pytest.mark.parametrize("size", [MAX_HEAD_BYTES - 2_000, MAX_HEAD_BYTES + 2_000])
def test_the_head_limit_holds_however_it_is_cut(size: int, how: str) -> None:
    line = b"X-Pad: " + b"p" * 90 + b"\r\n"
    start = GET
    raw = start + line * ((size - len(start) - 2) // len(line)) + b"\r\n"
    step = 4096 if how == "4096s" else 7 if how == "sevens" else len(raw)
    got, _, _ = serve([raw[i : i + step] for i in range(0, len(raw), step)])
    assert [status for status, _, _ in got] == [200 if size < MAX_HEAD_BYTES else 431]


@pytest.mark.parametrize("step", [1, 97, 4096])
@pytest.mark.parametrize("start", [GET, GET + b"X-A: 1\r\n", b"\r\n" + GET])
def test_a_head_line_is_refused_once_past_the_limit_not_once_whole(start: bytes, step: int) -> None:
    # A line that never ends, well under the head limit: refused as it passes 8 KiB, before httptools has
    # grown it piece by piece any further.
    raw = start + b"X-Long: " + b"v" * 12_000
    got, seen, _ = serve([raw[i : i + step] for i in range(0, len(raw), step)])
    assert not seen and [status for status, _, _ in got] == [431]
    assert "line longer than 8192" in json.loads(got[0][2])["error"]["message"]


def test_a_pipelined_head_line_is_counted_from_its_own_start() -> None:
    # A head that begins in a read after another request's body: its lines count from its next read.
    first = post("/echo", b"b\n" * 400)
    raw = first + GET + b"X-Ok: " + b"v" * 8000 + b"\r\n\r\n"
    for step in (len(first) + 30, 512):
        got, seen, _ = serve([raw[i : i + step] for i in range(0, len(raw), step)])
        assert [status for status, _, _ in got] == [200, 200] and len(seen) == 2


def test_endless_trailers_are_refused() -> None:
    raw = POST + b"Transfer-Encoding: chunked\r\n\r\n1\r\nz\r\n0\r\nX-Endless: "
    got, seen, _ = serve([raw] + [b"t" * 10_000] * 8)
    assert not seen and [status for status, _, _ in got] == [400]
    assert "trailers longer than" in json.loads(got[0][2])["error"]["message"]


def test_pipelined_requests_are_answered_in_order_and_a_refusal_in_its_turn() -> None:
    raw = post("/echo", b"one") + GET + b"\r\n" + post("/echo", b"two") + b"BAD\r\n\r\n"
    raw += post("/echo", b"never")
    for pieces in (cut(raw, "whole"), cut(raw, "bytes")):
        got, seen, wire = serve(pieces)
        assert [status for status, _, _ in got] == [200, 200, 200, 400]
        assert [json.loads(body).get("body") for _, _, body in got[:3]] == ["one", "", "two"]
        assert [r.body for r in seen] == [b"one", b"", b"two"] and wire.eof


def test_what_follows_a_last_request_is_dropped() -> None:
    raw = GET + b"Connection: close\r\n\r\n" + post("/echo", b"late") + b"junk"
    got, seen, wire = serve([raw])
    assert [status for status, _, _ in got] == [200] and len(seen) == 1 and wire.closing


def test_reading_pauses_while_a_whole_request_waits_for_its_turn() -> None:
    async def main() -> list[bool]:
        release = asyncio.Event()

        async def slow(request: Request) -> Response:
            await release.wait()
            return json_response({})

        conn = server_mod._Connection(Server({("GET", "/slow"): slow}, LIMITS))
        wire = Wire()
        conn.connection_made(wire)  # type: ignore[arg-type]
        paused = []
        conn.data_received(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.sleep(0)
        conn.data_received(b"GET /slow HTTP/1.1\r\nHost: x\r\n")  # half a request: reading goes on
        paused.append(wire.paused)
        conn.data_received(b"\r\n")  # a whole one: it waits, and so does reading
        paused.append(wire.paused)
        release.set()
        for _ in range(10):
            await asyncio.sleep(0)
        paused.append(wire.paused)
        conn.connection_lost(None)
        return paused

    assert asyncio.run(main()) == [False, True, False]


@pytest.mark.parametrize(
    ("pieces", "statuses"),
    [
        # Asked for, with the body not yet sent: 100 Continue, then the answer.
        ([POST + b"Content-Length: 4\r\nExpect: 100-continue\r\n\r\n", b"body"], [100, 200]),
        # The body came with the head: no 100.
        ([POST + b"Content-Length: 4\r\nExpect: 100-continue\r\n\r\nbody"], [200]),
        # Refused from its Content-Length: the refusal, no 100.
        ([POST + b"Content-Length: 4000\r\nExpect: 100-continue\r\n\r\n"], [413]),
        # Behind a request still being answered: the 100 waits for that answer, then goes out.
        (
            [post("/echo", b"first") + POST + b"Content-Length: 2\r\nExpect: 100-continue\r\n\r\n", b"hi"],
            [200, 100, 200],
        ),
        # HTTP/1.0 has no 100 Continue.
        ([b"POST /echo HTTP/1.0\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n", b"hi"], [200]),
    ],
)  # fmt: skip
def test_expect_continue(pieces: list[bytes], statuses: list[int]) -> None:
    got, _, _ = serve(pieces)
    assert [status for status, _, _ in got] == statuses


# ---- deadlines, caps, half-close: what a hostile client can make the server wait for and hold ----------

SHORT = replace(
    LIMITS, head_timeout_s=0.1, body_timeout_s=0.1, body_min_rate_bytes_s=1000.0, keepalive_timeout_s=5.0
)


def timed(
    script: list[tuple[float, bytes]], limits: ClientLimits = SHORT, wait_s: float = 0.3
) -> list[Answer]:
    """Feed each piece after its delay to one connection (fake transport, real loop time), then wait
    ``wait_s``; the answers written."""

    async def echo(request: Request) -> Response:
        return json_response({"body": request.body.decode()})

    async def main() -> Wire:
        srv = Server({("POST", "/echo"): echo, ("GET", "/echo"): echo}, limits)
        conn = server_mod._Connection(srv)
        wire = Wire()
        conn.connection_made(wire)  # type: ignore[arg-type]
        for delay_s, piece in script:
            await asyncio.sleep(delay_s)
            if not wire.closing:
                conn.data_received(piece)
        await asyncio.sleep(wait_s)
        conn.connection_lost(None)
        assert srv.buffered_body_bytes == 0  # whatever it held is let go
        return wire

    return answers(bytes(asyncio.run(main()).out))


def trickle(raw: bytes, every_s: float) -> list[tuple[float, bytes]]:
    return [(every_s, raw[i : i + 1]) for i in range(len(raw))]


CHUNKED = POST + b"Transfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(
    ("script", "statuses", "says"),
    [
        # A head that never ends: 408 at its deadline, however steadily its bytes come.
        ([(0, b"GET /echo HTTP/1.1\r\nHo")], [408], "head did not arrive"),
        (trickle(GET + b"X-Slow: abcdefghijklmnopqrstuvwxyz\r\n\r\n", 0.01), [408], "head did not arrive"),
        # A head in pieces within its deadline: served.
        ([(0, GET), (0.05, b"\r\n")], [200], None),
        # A body by Content-Length: max(body_timeout_s, length / rate) = 0.1 s for 20 bytes...
        ([(0, post("/echo", b"x" * 20)[:-10])], [408], "body (10 bytes so far) did not arrive"),
        ([(0, post("/echo", b"x" * 20)[:-10]), (0.05, b"x" * 10)], [200], None),
        # ... and 0.3 s for 300 bytes at 1000 bytes/s: past body_timeout_s, a long body gets its time.
        ([(0, post("/echo", b"y" * 300)[:-100]), (0.2, b"y" * 100)], [200], None),
        # A chunked body keeps its time while it keeps up the rate, not once it falls behind.
        ([(0, CHUNKED + b"c8\r\n" + b"z" * 200 + b"\r\n"), (0.15, b"1\r\nz\r\n0\r\n\r\n")], [200], None),
        ([(0, CHUNKED + b"5\r\nzzzzz\r\n")] + [(0.03, b"1\r\nz\r\n")] * 8, [408], "did not arrive"),
        # An idle connection gets no 408: nothing was asked.
        ([(0, b"")], [], None),
        # A body owed its 100 Continue is not timed until the 100 goes out; then it is.
        (
            [(0, POST + b"Content-Length: 4\r\nExpect: 100-continue\r\n\r\n"), (0.05, b"bo")],
            [100, 408],
            "did not arrive",
        ),
    ],
)  # fmt: skip
def test_a_head_or_body_that_does_not_arrive_in_time_gets_408(
    script: list[tuple[float, bytes]], statuses: list[int], says: str | None
) -> None:
    got = timed(script)
    assert [status for status, _, _ in got] == statuses
    if says is not None:
        status, headers, body = got[-1]
        assert headers["connection"] == "close" and headers["content-type"] == "application/json"
        error = json.loads(body)["error"]
        assert says in error["message"] and error["code"] == 408 and error["type"] == "RequestTimeout"


def test_a_deadline_bounds_each_request_of_a_kept_alive_connection() -> None:
    # The second request's head starts its own deadline: the first one's time is not carried over.
    script = [(0, GET + b"\r\n" + GET), (0.07, b"X: 1\r\n"), (0.07, b"\r\n")]
    assert [s for s, _, _ in timed(script)] == [200, 408]
    script = [(0, GET + b"\r\n"), (0.07, GET), (0.07, b"\r\n")]
    assert [s for s, _, _ in timed(script)] == [200, 200]


@pytest.mark.parametrize("how", ["whole", "sevens", "4096s"])
def test_a_chunk_size_line_past_the_line_limit_is_refused_as_it_arrives(how: str) -> None:
    # llhttp reads any number of leading zeros, keeping none of them: harmless in one read, but a line
    # that spans reads is cut at 8 KiB, as a head line is.
    raw = CHUNKED + b"0" * 9000 + b"1\r\nz\r\n0\r\n\r\n"
    step = 4096 if how == "4096s" else 7 if how == "sevens" else len(raw)
    got, seen, _ = serve([raw[i : i + step] for i in range(0, len(raw), step)])
    if how == "whole":
        assert [r.body for r in seen] == [b"z"]
        return
    assert not seen and [status for status, _, _ in got] == [400]
    assert "chunk-size line longer than 8192" in json.loads(got[0][2])["error"]["message"]


@pytest.mark.parametrize(("zeros", "status"), [(7000, 200), (8500, 400)])
def test_a_chunk_size_line_after_a_chunk_counts_from_its_own_start(zeros: int, status: int) -> None:
    data = b"d" * 900
    raw = CHUNKED + b"%x\r\n%s\r\n" % (len(data), data) + b"0" * zeros + b"1\r\nz\r\n0\r\n\r\n"
    got, seen, _ = serve([raw[i : i + 512] for i in range(0, len(raw), 512)])
    assert [s for s, _, _ in got] == [status] and [r.body for r in seen] == (
        [data + b"z"] if status == 200 else []
    )


def test_past_the_connection_cap_a_new_connection_gets_503_and_is_closed() -> None:
    async def main() -> list[Wire]:
        srv = Server({}, replace(LIMITS, max_client_connections=2))
        wires = [Wire() for _ in range(4)]
        conns = [server_mod._Connection(srv) for _ in wires]
        for conn, wire in zip(conns[:3], wires, strict=False):
            conn.connection_made(wire)  # type: ignore[arg-type]
        assert len(srv.connections) == 2
        conns[0].connection_lost(None)  # one goes: room for another
        conns[3].connection_made(wires[3])  # type: ignore[arg-type]
        assert len(srv.connections) == 2
        for conn in conns:
            conn.connection_lost(None)
        return wires

    wires = asyncio.run(main())
    assert [w.closing for w in wires] == [False, False, True, False]
    [(status, headers, body)] = answers(bytes(wires[2].out))
    assert status == 503 and headers["connection"] == "close" and b"limit" in body
    assert [bytes(w.out) for w in (wires[0], wires[1], wires[3])] == [b"", b"", b""]


def test_bodies_being_read_share_a_cap_and_let_it_go_when_done() -> None:
    async def main() -> list[list[Answer]]:
        async def echo(request: Request) -> Response:
            return json_response({"n": len(request.body)})

        srv = Server({("POST", "/echo"): echo}, replace(LIMITS, max_buffered_body_bytes=1500))
        conns = [server_mod._Connection(srv) for _ in range(4)]
        wires = [Wire() for _ in conns]
        for conn, wire in zip(conns, wires, strict=True):
            conn.connection_made(wire)  # type: ignore[arg-type]
        head = POST + b"Content-Length: 1000\r\n\r\n"
        conns[0].data_received(head + b"a" * 900)
        assert srv.buffered_body_bytes == 900
        conns[1].data_received(head + b"b" * 700)  # 1,600 would be past the cap: 503
        assert srv.buffered_body_bytes == 900
        conns[0].data_received(b"a" * 100)  # whole: the handler has it, it no longer counts
        await asyncio.sleep(0.01)
        assert srv.buffered_body_bytes == 0
        conns[2].data_received(head + b"c" * 999)
        conns[3].data_received(head + b"d" * 400)
        assert srv.buffered_body_bytes == 1399
        conns[2].connection_lost(None)  # a client that leaves lets its bytes go
        assert srv.buffered_body_bytes == 400
        conns[3].data_received(b"d" * 600)
        await asyncio.sleep(0.01)
        assert srv.buffered_body_bytes == 0
        for conn in conns:
            conn.connection_lost(None)
        return [answers(bytes(w.out)) for w in wires]

    got = asyncio.run(main())
    assert [[status for status, _, _ in a] for a in got] == [[200], [503], [], [200]]
    error = json.loads(got[1][0][2])["error"]
    assert error["type"] == "ServiceUnavailable" and "request bodies" in error["message"]


@pytest.mark.parametrize(
    ("raw", "statuses"),
    [
        # A client that sends its request and shuts its side still gets its answer, then the close.
        (post("/echo", b"hello"), [200]),
        (GET + b"\r\n" + post("/echo", b"two"), [200, 200]),  # each request it sent whole
        (b"GET /echo HTTP/1.0\r\n\r\n", [200]),
        # A request cut short by the shutdown: refused, not left hanging.
        (GET, [400]),
        (post("/echo", b"hello")[:-2], [400]),
        (b"", []),
    ],
)
def test_a_half_closed_client_gets_its_answers(raw: bytes, statuses: list[int]) -> None:
    for pieces in ([raw], cut(raw, "sevens")):
        got, _, wire = serve(pieces, eof=True)
        # A 100 Continue may come first: drawn to find out whether the client closed for good (server.py).
        assert [status for status, _, _ in got if status != 100] == statuses and wire.closing
        if statuses == [400]:
            assert "before its request was whole" in json.loads(got[0][2])["error"]["message"]


@pytest.mark.parametrize(
    ("request_line", "continued"),
    [
        (b"GET /hang HTTP/1.1\r\nHost: x\r\n\r\n", True),
        # RFC 9110 15.2: a server MUST NOT send a 1xx to an HTTP/1.0 client: it gets the answer, nothing more
        # (and a client of its that leaves is found out only when the answer's write fails).
        (b"GET /hang HTTP/1.0\r\n\r\n", False),
    ],
)
def test_a_half_close_draws_one_unsolicited_100_from_http11_only(
    request_line: bytes, continued: bool, run: Runner
) -> None:
    async def test(app: App, srv: Server, port: int) -> None:
        async with connected(port, request_line) as (reader, writer):
            writer.write_eof()  # the answer is under way (the handler waits) when the FIN comes
            await asyncio.sleep(0.2)
            app.release.set()
            data = await asyncio.wait_for(reader.read(), 2.0)
        version = request_line.split(b"\r\n")[0][-8:]
        first = data.split(b"\r\n", 1)[0]
        assert data.count(b" 100 Continue\r\n") == int(continued) and not app.cancelled.is_set()
        assert first == (b"HTTP/1.1 100 Continue" if continued else b"HTTP/1.1 200 OK"), (version, data)
        assert data.count(b"HTTP/1.1 200 OK") == 1 and data.endswith(b'{"released": true}')

    run(test)


# Fragments of requests, and of what a hostile client puts in them.
_FRAGMENTS = st.sampled_from(
    [GET, POST, b"\r\n", b"\n", b"\r", b"Host: y\r\n", b"Content-Length: 3\r\n", b"Content-Length: -1\r\n",
     b"Transfer-Encoding: chunked\r\n", b"3\r\nabc\r\n", b"0\r\n\r\n", b"0x36\r\n", b"X: a\x00b\r\n",
     b" folded\r\n", b"GET /echo HTTP/1.0\r\n", b"Expect: 100-continue\r\n", b"abc", b"\x16\x03\x01"]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(st.one_of(_FRAGMENTS, st.binary(max_size=12)), min_size=1, max_size=14),
    step=st.integers(1, 40),
    eof=st.booleans(),
)
def test_whatever_a_client_sends_it_gets_answers_in_order_and_never_a_5xx(
    parts: list[bytes], step: int, eof: bool
) -> None:
    """Fuzzed request bytes, cut anywhere, with or without a half-close: the server never fails (no 500),
    answers each request it read in order, at most one refusal and that one last (the connection then ends),
    and hands on no request it refused."""
    raw = b"".join(parts)
    got, seen, wire = serve([raw[i : i + step] for i in range(0, len(raw), step)], eof=eof)
    statuses = [status for status, _, _ in got if status != 100]
    assert all(status in (200, 400, 404, 405, 408, 413, 431) for status in statuses), statuses
    refusals = [i for i, status in enumerate(statuses) if status not in (200, 404, 405)]
    assert refusals in ([], [len(statuses) - 1]), statuses
    assert len(seen) == statuses.count(200)
    if refusals:
        assert wire.closing or wire.eof
