"""The proxy's HTTP/1.1 server on raw sockets: framing, limits, keep-alive, cancellation, shutdown."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from calroute import aio
from calroute.proxy.http import server as server_mod
from calroute.proxy.http.server import Request, Response, Server, Stream, json_response

MAX_BODY = 1000
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
            MAX_BODY,
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
        # One of each kind of the head parser's refusals reaches the client (test_head.py lists them all).
        (b"GARBAGE\r\n\r\n", 400, "malformed request line"),
        (b"GET /echo HTTP/2.0\r\n\r\n", 505, "unsupported version"),
        (b"GET /echo HTTP/1.1\r\nHost : x\r\n\r\n", 400, "malformed header line"),
        (b"POST /echo HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501, "Transfer-Encoding"),
        (b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400, "chunk size"),
        (b"GET /echo HTTP/1.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", 431, "head larger"),
        (b"GET /echo HTTP/1.1\r\nX-Big: " + b"a" * 9_000 + b"\r\n\r\n", 431, "line longer than 8192"),
        (post("/echo", b"x" * (MAX_BODY + 1)), 413, "larger than 1000 bytes"),
        (
            b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
            % (MAX_BODY + 1, b"y" * (MAX_BODY + 1)),
            413,
            "larger than 1000 bytes",
        ),
        (b"GET /nowhere HTTP/1.1\r\n\r\n", 404, "no route /nowhere"),
        (b"DELETE /echo HTTP/1.1\r\n\r\n", 405, "use GET, POST"),
        (b"GET /boom HTTP/1.1\r\n\r\n", 500, "internal error"),
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
        chunked = (
            b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\n\r\n"
        )
        raw = post("/echo?q=1", b"hello", "X-Thing: yes\r\n") + chunked + b"GET /echo HTTP/1.1\r\n\r\n"
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
        async with connected(port, f"GET /echo HTTP/{version}\r\n{extra}\r\n".encode()) as (reader, writer):
            status, headers, _ = await read_response(reader)
            assert status == 200 and (headers.get("connection") == "close") is not stays_open
            if stays_open:
                writer.write(b"GET /echo HTTP/1.1\r\n\r\n")
                assert (await read_response(reader))[0] == 200
            else:
                assert await reader.read() == b""  # closed by the server

    run(test)


def test_expect_continue_is_answered_before_the_body_comes(run: Runner) -> None:
    async def test(app: App, srv: Server, port: int) -> None:
        head = b"POST /echo HTTP/1.1\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n"
        async with connected(port, head) as (reader, writer):
            assert (await read_response(reader))[0] == 100
            writer.write(b"body")
            status, _, body = await read_response(reader)
        assert status == 200 and json.loads(body)["body"] == "body"

    run(test)


def test_an_oversized_body_is_refused_before_it_is_read_and_the_refusal_arrives(run: Runner) -> None:
    async def test(app: App, srv: Server, port: int) -> None:
        head = b"POST /echo HTTP/1.1\r\nContent-Length: 5000000\r\n\r\n"
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
        async with connected(port, f"GET /stream HTTP/{version}\r\n{extra}\r\n".encode()) as (reader, _):
            status, headers, body = await read_response(reader)
            closed = connection != "close" or await reader.read() == b""
        assert status == 200 and headers["content-type"] == "text/event-stream"
        assert headers.get("transfer-encoding") == encoding and headers.get("connection") == connection
        assert body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n" and closed

    run(test)


def test_a_client_that_leaves_cancels_its_handler(run: Runner) -> None:
    async def test(app: App, srv: Server, port: int) -> None:
        async with connected(port, b"GET /hang HTTP/1.1\r\n\r\n"):
            await asyncio.sleep(0.1)
        await asyncio.wait_for(app.cancelled.wait(), 2.0)

    run(test)


def test_an_idle_connection_is_closed(monkeypatch: pytest.MonkeyPatch, run: Runner) -> None:
    monkeypatch.setattr(server_mod, "KEEPALIVE_S", 0.2)

    async def test(app: App, srv: Server, port: int) -> None:
        async with connected(port, b"GET /echo HTTP/1.1\r\n\r\n") as (reader, _):
            assert (await read_response(reader))[0] == 200
            assert await asyncio.wait_for(reader.read(), 2.0) == b""

    run(test)


def test_stop_lets_a_request_under_way_finish_then_closes(run: Runner) -> None:
    async def test(app: App, srv: Server, port: int) -> None:
        async with connected(port, b"GET /hang HTTP/1.1\r\n\r\n") as (reader, _):
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
