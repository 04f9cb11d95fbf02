"""The proxy's HTTP/1.1 server: one asyncio Protocol per client connection, a handler task per request.

The proxy's few routes need little of a web framework, and every request passes through this server, so it
is small: requests are parsed by httptools (llhttp) from the connection's data callback, one handler task
runs per request, answers are written straight to the transport (benchmarks/RESULTS.md, "The proxy's own
HTTP server"). What it guarantees:

- HTTP/1.1 and 1.0, keep-alive (1.1's default, 1.0's on request), pipelined requests answered in order
  (read ahead while an answer is under way; reading pauses once a whole request waits); an idle
  connection is closed after KEEPALIVE_S.
- Bodies by Content-Length or chunked, at most ``max_body_bytes``: 413 from the Content-Length before the
  body is read, or once a chunked body grows past it. ``Expect: 100-continue`` answered once the request is
  next in line. A request that could be read two ways (Content-Length and Transfer-Encoding, two
  Content-Lengths) is refused with 400 and the connection closed, as RFC 9112 asks.
- A head larger than MAX_HEAD_BYTES, or with a line longer than MAX_LINE_BYTES, gets 431, counted as the
  bytes arrive (head.HeadMeter); a malformed head (bare-LF line endings, control bytes, a bad chunk size)
  400; a version other than 1.0 and 1.1 505; a Transfer-Encoding other than chunked 501; an unknown route
  404, a wrong method 405. All with JSON bodies in OpenAI's error shape (``json_error``). A refusal ends
  the connection: it is answered in its turn, then what the client still sends is read and dropped for
  LINGER_S, so that a close does not reset the answer away.
- An Upgrade request is served as a plain request (the server never switches protocols), unless it has a
  body (400).
- A client that goes away cancels its request's handler (the proxy records it as cancelled).
- A handler that raises gets a 500 (or, once its response has started, its connection closed).
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import time
from collections import deque
from collections.abc import Mapping
from typing import cast

import httptools

from calroute.errors import CalrouteError
from calroute.proxy.http.head import MAX_LINE_BYTES, Headers, HeadMeter, HeadTooLarge, status_line
from calroute.proxy.http.messages import Handler, Request, Response, Stream, json_error

logger = logging.getLogger(__name__)

KEEPALIVE_S = 75.0  # as aiohttp's and nginx's defaults: well past any client pool's own idle limit
# After refusing a request whose body is still coming, read and drop it this long before closing: a close
# with unread data sends a reset, and the client may lose the answer before it reads it.
LINGER_S = 2.0
# Bytes of a chunked body that carry no body (chunk-size lines, extensions, trailers) in a row.
MAX_CHUNK_OVERHEAD_BYTES = 64 * 1024


class _Refusal(CalrouteError):
    """A request the server answers with an error, after which it reads nothing more on the connection."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def _unreadable(e: httptools.HttpParserError) -> _Refusal:
    """llhttp's reason for not reading a request, as the answer to it."""
    reason = str(e)
    if reason == "Invalid HTTP version":
        return _Refusal(505, f"unsupported version: {reason}")
    if isinstance(e, httptools.HttpParserInvalidMethodError | httptools.HttpParserInvalidURLError):
        return _Refusal(400, f"malformed request line: {reason}")
    return _Refusal(400, f"malformed request head: {reason}")


class _Connection(asyncio.Protocol):
    """One client connection. Its bytes go to the parser as they arrive; each request read whole waits in
    a queue for its turn; one handler task at a time answers."""

    def __init__(self, server: Server) -> None:
        self._server = server
        # One look-up per connection: on Python 3.11 every get_running_loop() is a getpid() system call.
        self._loop = asyncio.get_running_loop()
        self._max_body = server.max_body_bytes
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._meter = HeadMeter()
        self._queue: deque[Request | _Refusal] = deque()  # read, not yet answered
        # The request being read.
        self._method = ""
        self._url = b""
        self._headers = Headers()
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._chunked = False
        self._overhead = 0  # bytes of the chunked body since its last data: chunk lines, trailers
        self._http11 = True
        self._keep_alive = True
        self._continue_owed = False  # it asked for 100 Continue and has not sent its body yet
        self._reading = True  # False once the last request was read, or one was refused: the rest is dropped
        self._task: asyncio.Task[None] | None = None
        self._idle: asyncio.TimerHandle | None = None  # the idle timeout, or the linger after a refusal
        self._drained: asyncio.Future[None] | None = None
        # The request being answered.
        self.http11 = True
        self.keep_alive = True
        self.started = False  # the current answer's head went out

    # ---- asyncio callbacks ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._server.connections.add(self)
        self._arm_idle()

    def data_received(self, data: bytes) -> None:
        if not self._reading:
            return
        body_bytes = self._body_bytes
        try:
            self._meter.read(data)
            self._feed(data)
            self._meter.after(data)
            if self._chunked and self._body_bytes == body_bytes:
                self._overhead += len(data)
                if self._overhead > MAX_CHUNK_OVERHEAD_BYTES:
                    raise _Refusal(
                        400, f"chunk lines or trailers longer than {MAX_CHUNK_OVERHEAD_BYTES} bytes"
                    )
        except HeadTooLarge as e:
            self._refuse_later(_Refusal(431, f"request {e}"))
        except _Refusal as e:
            self._refuse_later(e)
        if self._task is None:
            self._next()
        elif self._queue and self.transport is not None:
            self.transport.pause_reading()  # a client pipelining ahead waits for its answers

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
            self._drained = self._loop.create_future()

    def resume_writing(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    async def drain(self) -> None:
        if self._drained is not None and not self._drained.done():
            await self._drained

    # ---- reading requests ----------------------------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        """Parse ``data``: the requests it completes join the queue; a request that cannot be served ends
        the reading, its refusal queued in its turn."""
        while True:
            try:
                self._parser.feed_data(data)
                return
            except httptools.HttpParserUpgrade as e:  # a request the server answers over HTTP/1.1 anyway
                data = data[e.args[0] :]
                if not data or not self._reading:
                    return
            except httptools.HttpParserCallbackError as e:  # one of the callbacks below refused
                cause = e.__context__
                if isinstance(cause, HeadTooLarge):
                    self._refuse_later(_Refusal(431, f"request {cause}"))
                elif isinstance(cause, _Refusal):
                    self._refuse_later(cause)
                else:
                    raise
                return
            except httptools.HttpParserError as e:
                if self._reading:  # else: what follows a last request ("Connection: close") is dropped
                    self._refuse_later(_unreadable(e))
                return

    def _refuse_later(self, refusal: _Refusal) -> None:
        """Read no further; the refusal is answered once the requests before it are."""
        self._reading = False
        self._continue_owed = False
        self._body = []
        self._queue.append(refusal)

    # httptools' callbacks, for the request being read

    def on_message_begin(self) -> None:
        self._meter.begin()
        self._url = b""
        self._headers = Headers()
        self._body_bytes = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._meter.line(len(url))
        if len(self._url) > MAX_LINE_BYTES:
            raise _Refusal(431, f"a request line longer than {MAX_LINE_BYTES} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        size = len(name) + len(value) + 2
        self._meter.line(size + 2)
        if size > MAX_LINE_BYTES:
            raise _Refusal(431, f"a request head line longer than {MAX_LINE_BYTES} bytes")
        if not self._meter.inside:  # a trailer, after a chunked body: read, not kept
            return
        key, text = name.decode("latin-1").lower(), value.decode("latin-1").rstrip(" \t")
        headers = self._headers
        earlier = dict.get(headers, key)
        headers[key] = text if earlier is None else f"{earlier}, {text}"

    def on_headers_complete(self) -> None:
        self._meter.end()
        parser, headers = self._parser, self._headers
        version = parser.get_http_version()
        if version != "1.1" and version != "1.0":
            raise _Refusal(505, f"unsupported version HTTP/{version}")
        if not self._url.startswith(b"/"):
            raise _Refusal(400, f"malformed request line: target {self._url[:80]!r} is not a path")
        coding = headers.get("transfer-encoding")
        if coding is not None and coding.lower() != "chunked":
            raise _Refusal(501, f"unsupported Transfer-Encoding {coding[:40]!r}")
        length = headers.get("content-length")
        if length is not None and int(length) > self._max_body:
            raise _Refusal(413, f"request body larger than {self._max_body} bytes")
        if parser.should_upgrade() and (coding is not None or (length is not None and int(length))):
            raise _Refusal(400, "an Upgrade request with a body")
        self._chunked, self._overhead = coding is not None, 0
        self._method = parser.get_method().decode("latin-1")
        self._http11 = version == "1.1"
        self._keep_alive = parser.should_keep_alive()
        if self._http11 and headers.get("expect", "").lower() == "100-continue":
            self._continue_owed = True
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def on_body(self, body: bytes) -> None:
        self._continue_owed = False
        self._overhead = 0
        self._body_bytes += len(body)
        if self._body_bytes > self._max_body:
            raise _Refusal(413, f"request body larger than {self._max_body} bytes")
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._meter.done()
        self._continue_owed = self._chunked = False
        body, self._body = self._body, []
        request = Request(
            self,
            self._method,
            self._url.decode("latin-1"),
            self._headers,
            body[0] if len(body) == 1 else b"".join(body),
            self._http11,
            self._keep_alive,
        )
        self._queue.append(request)
        if not self._keep_alive:
            self._reading = False

    # ---- answering -----------------------------------------------------------------------------------

    def _next(self) -> None:
        """With no answer under way: start answering the next request read, or, if the one being read
        waits for it, say 100 Continue."""
        if self._queue:
            item = self._queue.popleft()
            if isinstance(item, _Refusal):
                return self._refuse(item.status, item.message)
            if self._idle is not None:
                self._idle.cancel()
                self._idle = None
            self.http11, self.keep_alive, self.started = item.http11, item.keep_alive, False
            self._task = self._loop.create_task(self._answer(item))
        elif self._continue_owed:
            self._continue_owed = False
            self._write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _refuse(self, status: int, message: str) -> None:
        """A request that cannot be read: answer it and close, as what follows it cannot be framed."""
        self.keep_alive = self._reading = False
        self._queue.clear()
        kind = "RequestTooLarge" if status == 413 else "BadRequestError"
        self._write(self._whole(json_error(status, message, kind)))
        transport = self.transport
        if transport is None or transport.is_closing() or not transport.can_write_eof():
            return self._close()
        transport.resume_reading()  # read and drop what the client still sends
        transport.write_eof()
        if self._idle is not None:
            self._idle.cancel()
        self._idle = self._loop.call_later(LINGER_S, self._close)

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
                self._write(
                    self._whole(
                        json_error(500, "internal error in the proxy (see its log)", "InternalServerError")
                    )
                )
        self._task = None
        if not self.keep_alive:
            self._close()
        elif self.transport is not None and not self.transport.is_closing():
            self._arm_idle()
            self._next()
            if not self._queue:
                self.transport.resume_reading()

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
        self._idle = self._loop.call_later(KEEPALIVE_S, self._close)

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
            return json_error(405, message, "MethodNotAllowed")
        return json_error(404, f"no route {request.path}", "NotFound")

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
