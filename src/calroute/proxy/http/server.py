"""The proxy's HTTP/1.1 server: one asyncio Protocol per client connection, a handler task per request.

In a profile at 220 req/s, aiohttp's server code (routing, request objects, response heads, body streams)
was about a fifth of the proxy's busy samples; this server does what the proxy's few routes need and no
more (benchmarks/RESULTS.md, "The proxy's own HTTP server"). What it guarantees:

- HTTP/1.1 and 1.0, keep-alive (1.1's default, 1.0's on request), requests on one connection answered in
  order; an idle connection is closed after KEEPALIVE_S.
- Bodies by Content-Length or chunked, at most ``max_body_bytes`` (413 otherwise, before the body is
  read); ``Expect: 100-continue`` answered. A request that could be read two ways (Content-Length and
  Transfer-Encoding, or two lengths) is refused with 400 and the connection closed, as RFC 9112 asks.
- A malformed head gets 400, an oversized one 431, an unknown route 404, a wrong method 405: JSON
  bodies in OpenAI's error shape.
- A client that goes away cancels its request's handler (the proxy records it as cancelled).
- A handler that raises gets a 500 (or, once its response has started, its connection closed).
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

from calroute.proxy.http.framing import BodyDecoder, FramingError
from calroute.proxy.http.head import Headers, RequestHead, status_line

logger = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024
KEEPALIVE_S = 75.0  # as aiohttp's and nginx's defaults: well past any client pool's own idle limit
STREAM_HIGH_WATER_BYTES = 256 * 1024  # a Stream.write waits while more than this is unsent
# After refusing a request whose body is still coming, read and drop it this long before closing: a close
# with unread data sends a reset, and the client may lose the answer before it reads it.
LINGER_S = 2.0


def error_body(status: int, message: str, kind: str, param: str | None = None) -> bytes:
    """OpenAI's error shape, as vLLM answers."""
    return json.dumps({"error": {"message": message, "type": kind, "param": param, "code": status}}).encode()


class Request:
    """One request, whole: its body has been read before the handler runs."""

    __slots__ = ("_conn", "body", "headers", "method", "path", "query")

    def __init__(self, conn: _Connection, method: str, target: str, headers: Headers, body: bytes) -> None:
        self._conn = conn
        self.method = method
        self.path, _, self.query = target.partition("?")
        self.headers = headers
        self.body = body

    def stream(self, status: int = 200, headers: Mapping[str, str] | None = None) -> Stream:
        """Start a streamed answer: its head goes out at once. Raises ConnectionResetError if the client
        has gone."""
        return Stream(self._conn, status, headers or {})


class Response:
    """A whole answer."""

    __slots__ = ("body", "content_type", "status")

    def __init__(self, body: bytes, status: int = 200, content_type: str = "application/json") -> None:
        self.body, self.status, self.content_type = body, status, content_type


def json_response(value: Any, status: int = 200) -> Response:
    return Response(json.dumps(value).encode(), status)


class Stream:
    """A streamed answer: chunked for HTTP/1.1, delimited by the connection's close for 1.0. The relay may
    write to ``transport`` directly (framed as ``chunked`` says) from a data callback."""

    __slots__ = ("_conn", "chunked", "ended", "transport")

    def __init__(self, conn: _Connection, status: int, headers: Mapping[str, str]) -> None:
        if conn.transport is None or conn.transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        self._conn = conn
        self.transport: asyncio.Transport = conn.transport
        self.chunked = conn.http11
        self.ended = False
        if not self.chunked:
            conn.keep_alive = False
        framing = "Transfer-Encoding: chunked" if self.chunked else "Connection: close"
        if self.chunked and not conn.keep_alive:
            framing += "\r\nConnection: close"
        lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        conn.started = True
        self.transport.write(f"{status_line(status)}{conn.common_headers()}{lines}{framing}\r\n\r\n".encode())

    async def write(self, data: bytes) -> None:
        """Raises ConnectionResetError if the client has gone."""
        if not data:
            return
        if self.transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        self.transport.write(b"%x\r\n%b\r\n" % (len(data), data) if self.chunked else data)
        if self.transport.get_write_buffer_size() > STREAM_HIGH_WATER_BYTES:
            await self._conn.drain()

    async def write_eof(self) -> None:
        if self.ended:
            return
        self.ended = True
        if self.transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        if self.chunked:
            self.transport.write(b"0\r\n\r\n")


Handler = Callable[[Request], Awaitable[Response | Stream]]


class _Connection(asyncio.Protocol):
    """One client connection: reads a request, runs its handler as a task, writes the answer, repeats."""

    def __init__(self, server: Server) -> None:
        self._server = server
        self.transport: asyncio.Transport | None = None
        self._buf = b""
        self._head: RequestHead | None = None
        self._decoder: BodyDecoder | None = None
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._task: asyncio.Task[None] | None = None
        self._idle: asyncio.TimerHandle | None = None
        self._drained: asyncio.Future[None] | None = None
        self.http11 = True
        self.keep_alive = True
        self.started = False  # the current answer's head went out
        self._lingering = False  # refused: what comes now is dropped until the close

    # ---- asyncio callbacks ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._server.connections.add(self)
        self._arm_idle()

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return
        self._buf += data
        if self._task is None:
            self._advance()
        elif len(self._buf) > MAX_HEAD_BYTES + self._server.max_body_bytes and self.transport is not None:
            self.transport.pause_reading()  # a client pipelining far ahead waits for its answers

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        if self._idle is not None:
            self._idle.cancel()
        if self._task is not None:
            self._task.cancel()  # the proxy's handler records the request as cancelled
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def pause_writing(self) -> None:
        if self._drained is None or self._drained.done():
            self._drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    async def drain(self) -> None:
        if self._drained is not None and not self._drained.done():
            await self._drained

    # ---- reading requests ----------------------------------------------------------------------------

    def _advance(self) -> None:
        """Read as much of the next request as has come; start its handler once it is whole."""
        try:
            if self._head is None:
                end = self._buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(self._buf) > MAX_HEAD_BYTES:
                        raise ValueError(f"request head larger than {MAX_HEAD_BYTES} bytes", 431)
                    return
                if end > MAX_HEAD_BYTES:
                    raise ValueError(f"request head larger than {MAX_HEAD_BYTES} bytes", 431)
                head = RequestHead(self._buf[:end], self._server.max_body_bytes)
                self._buf = self._buf[end + 4 :]
                self._head, self.http11 = head, head.http11
                self._decoder = BodyDecoder(head)
                if self._idle is not None:
                    self._idle.cancel()
                if head.expect_continue and head.http11 and not self._buf and not self._decoder.done:
                    self._write(b"HTTP/1.1 100 Continue\r\n\r\n")
            assert self._decoder is not None
            for piece in self._decoder.feed(self._buf):
                self._body.append(piece)
                self._body_bytes += len(piece)
            if self._body_bytes > self._server.max_body_bytes:
                raise ValueError(f"request body larger than {self._server.max_body_bytes} bytes", 413)
            if not self._decoder.done:
                self._buf = b""
                return
        except FramingError as e:
            return self._refuse(400, str(e))
        except ValueError as e:
            return self._refuse(e.args[1] if len(e.args) > 1 else 400, str(e.args[0]))
        self._buf = self._decoder.rest
        head, body = self._head, b"".join(self._body)
        self._head, self._decoder, self._body, self._body_bytes = None, None, [], 0
        self.keep_alive, self.started = head.keep_alive, False
        request = Request(self, head.method, head.target, head.headers, body)
        self._task = asyncio.get_running_loop().create_task(self._answer(request))

    def _refuse(self, status: int, message: str) -> None:
        """A request that cannot be read: answer it and close, as what follows it cannot be framed."""
        self.keep_alive = False
        kind = "RequestTooLarge" if status == 413 else "BadRequestError"
        self._write(self._whole(Response(error_body(status, message, kind), status)))
        self._buf, self._head, self._decoder, self._body = b"", None, None, []
        transport = self.transport
        if transport is None or transport.is_closing() or not transport.can_write_eof():
            return self._close()
        self._lingering = True
        transport.write_eof()
        if self._idle is not None:
            self._idle.cancel()
        self._idle = asyncio.get_running_loop().call_later(LINGER_S, self._close)

    # ---- answering -----------------------------------------------------------------------------------

    async def _answer(self, request: Request) -> None:
        try:
            answer = await self._server.route(request)
            if isinstance(answer, Response):
                if self.started:
                    raise RuntimeError("a whole answer after a streamed one began")
                self._write(self._whole(answer))
            elif not answer.ended:
                await answer.write_eof()
        except asyncio.CancelledError:
            self._task = None
            self._close()
            raise
        except ConnectionError:
            self.keep_alive = False
        except Exception:
            logger.exception("handler for %s %s failed", request.method, request.path)
            self.keep_alive = False
            if not self.started:
                body = error_body(500, "internal error in the proxy (see its log)", "InternalServerError")
                self._write(self._whole(Response(body, 500)))
        self._task = None
        if not self.keep_alive:
            self._close()
        elif self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()
            self._arm_idle()
            if self._buf:
                self._advance()

    def _whole(self, r: Response) -> bytes:
        framing = "" if self.keep_alive else "Connection: close\r\n"
        head = (
            f"{status_line(r.status)}{self.common_headers()}Content-Type: {r.content_type}\r\n"
            f"Content-Length: {len(r.body)}\r\n{framing}\r\n"
        )
        return head.encode() + r.body

    def common_headers(self) -> str:
        return f"Date: {self._server.date()}\r\nServer: calroute\r\n"

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _arm_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        self._idle = asyncio.get_running_loop().call_later(KEEPALIVE_S, self._close)

    def _close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()  # after what is buffered has gone out


class Server:
    """Routes: exact paths, each with the methods it takes."""

    def __init__(self, routes: Mapping[tuple[str, str], Handler], max_body_bytes: int) -> None:
        self._routes = dict(routes)
        self._paths = {path for _, path in routes}
        self.max_body_bytes = max_body_bytes
        self.connections: set[_Connection] = set()
        self._server: asyncio.Server | None = None
        self._date_s = -1
        self._date = ""

    def date(self) -> str:
        now_s = int(time.time())
        if now_s != self._date_s:
            self._date_s, self._date = now_s, email.utils.formatdate(now_s, usegmt=True)
        return self._date

    async def route(self, request: Request) -> Response | Stream:
        handler = self._routes.get((request.method, request.path))
        if handler is not None:
            return await handler(request)
        if request.path in self._paths:
            allowed = ", ".join(sorted(m for m, p in self._routes if p == request.path))
            message = f"{request.method} is not allowed on {request.path}: use {allowed}"
            return Response(error_body(405, message, "MethodNotAllowed"), 405)
        return Response(error_body(404, f"no route {request.path}", "NotFound"), 404)

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the port (the one chosen when ``port`` is 0)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), host, port, backlog=1024)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop listening, give requests under way ``grace_s`` to finish, then close every connection."""
        if self._server is not None:
            self._server.close()
        deadline = time.monotonic() + grace_s
        while any(c._task is not None for c in self.connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for c in list(self.connections):
            if c._task is not None:
                c._task.cancel()
            if c.transport is not None:
                c.transport.close()
        if self._server is not None:
            await self._server.wait_closed()


def run_until_signalled(
    start: Callable[[], Awaitable[int]], stop: Callable[[], Awaitable[None]], on_ready: Callable[[int], None]
) -> None:
    """Run ``start`` on a uvloop loop, call ``on_ready`` with its port, and ``stop`` on SIGINT or SIGTERM."""
    import signal

    from calroute.aio import run

    async def main() -> None:
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopping.set)
        on_ready(await start())
        await stopping.wait()
        await stop()

    run(main())
