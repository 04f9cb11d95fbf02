"""The proxy's HTTP/1.1 server: one asyncio Protocol per client connection, a handler task per request.

The proxy's few routes need little of a web framework, and every request passes through this server, so it
is small: requests are parsed by httptools (llhttp) from the connection's data callback, one handler task
runs per request, answers are written straight to the transport (benchmarks/RESULTS.md, "The proxy's own
HTTP server"). What it guarantees:

- HTTP/1.1 and 1.0, keep-alive (1.1's default, 1.0's on request), pipelined requests answered in order
  (read ahead while an answer is under way; reading pauses once a whole request waits); an idle
  connection is closed after ``Limits.keepalive_s`` (KEEPALIVE_S), with no answer.
- Every wait on a client is bounded (``Limits``; docs/proxy.md, "Client limits"): a request's head must
  end within ``head_timeout_s`` of its first byte, and its body arrive within max(``body_timeout_s``, its
  length / ``body_min_rate_bytes_s``) of the head's end (a chunked body's length: what has come so far),
  else 408. A timer is armed only once a head or body spans reads. A body owed a 100 Continue is timed
  from the 100.
- What clients can hold is bounded: past ``max_connections`` a new connection gets a 503 and is closed
  before anything is read; the bodies being read, across connections, at most ``max_buffered_body_bytes``
  (the body that would cross it gets 503). Reading costs time linear in the bytes received however they
  are cut (the request line grows in place; body pieces are joined once; a head line and a chunk-size line
  are measured per read, and refused past MAX_LINE_BYTES before they are whole: httptools grows a header
  by concatenation, so a line is what bounds its copying).
- A client that shuts its side (a half-close) gets the answers to the requests it sent whole, then the
  close; a request cut short by it gets 400. A half-close and a close look alike until the server writes:
  so that a client that left still cancels its handler, an HTTP/1.1 client whose answer has not begun gets
  a 100 Continue at once, which a closed socket answers with a reset, looked for every EOF_PROBE_S.
- Bodies by Content-Length or chunked, at most ``max_body_bytes``: 413 from the Content-Length before the
  body is read, or once a chunked body grows past it. ``Expect: 100-continue`` answered once the request is
  next in line. A request that could be read two ways (Content-Length and Transfer-Encoding, two
  Content-Lengths) is refused with 400 and the connection closed, as RFC 9112 asks.
- A head larger than MAX_HEAD_BYTES, or with a line longer than MAX_LINE_BYTES, gets 431, counted as the
  bytes arrive (head.HeadMeter); a malformed head (bare-LF line endings, control bytes, a bad chunk size)
  400; an HTTP/1.1 request without a Host header, with two, or an HTTP/1.0 one with Transfer-Encoding 400
  (RFC 9112 3.2, 6.1: llhttp lets them through); a chunk-size line over MAX_LINE_BYTES 400 (llhttp takes
  any number of leading zeros); a version other than 1.0 and 1.1 505; a Transfer-Encoding other than
  chunked 501; an unknown route 404, a wrong method 405. All with JSON bodies in OpenAI's error shape
  (``json_error``). A refusal ends the connection: it is answered in its turn, then what the client still
  sends is read and dropped for LINGER_S, so that a close does not reset the answer away.
- An Upgrade request is served as a plain request (the server never switches protocols), unless it has a
  body (400).
- A client that goes away cancels its request's handler (the proxy records it as cancelled).
- A handler that raises gets a 500 (or, once its response has started, its connection closed).
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import socket
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
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
# After a client shuts its side while its answer is under way: how often to look whether it closed for good.
# A half-close and a close look alike (a FIN) until the server writes: a 100 Continue (which an HTTP/1.1
# client must read past) draws a reset from a closed socket, and the reset shows in the socket's TCP state.
EOF_PROBE_S = 0.25
_TCP_CLOSE = 7  # tcp_states.h
_KINDS = {408: "RequestTimeout", 413: "RequestTooLarge", 503: "ServiceUnavailable"}


@dataclass(frozen=True)
class Limits:
    """What one client may make the server wait for and hold (docs/proxy.md compares them with uvicorn's
    and Envoy's)."""

    head_timeout_s: float = 10.0  # from a request's first byte to the end of its head
    # A body must arrive within max(body_timeout_s, its length / body_min_rate_bytes_s) of its head's end (a
    # chunked body's length: what has arrived so far, so one that keeps up the rate goes on).
    body_timeout_s: float = 10.0
    body_min_rate_bytes_s: float = 64 * 1024
    keepalive_s: float = KEEPALIVE_S  # an idle connection, between requests
    max_connections: int = 1024  # past it, a new connection gets a 503 and is closed
    max_buffered_body_bytes: int = 64 * 1024 * 1024  # bodies being read, all connections together


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
        self._limits = server.limits
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._meter = HeadMeter()
        self._queue: deque[Request | _Refusal] = deque()  # read, not yet answered
        # The request being read.
        self._method = ""
        self._url = bytearray()
        self._headers = Headers()
        self._body: list[bytes] = []
        self._body_bytes = 0  # of the request being read: counted in the server's buffered bytes
        self._length = 0  # its Content-Length
        self._chunked = False
        self._chunk_line = -1  # bytes of the chunk-size line being read; -1 outside one
        self._chunk_line_began = False  # a chunk-size line began in the current read
        self._carried = -1  # _chunk_line when the current read began
        self._head_line = 0  # bytes of the head line being read, as far as the reads so far show
        self._read = b""  # the current read
        self._overhead = 0  # bytes of the chunked body since its last data: chunk lines, trailers
        self._http11 = True
        self._keep_alive = True
        self._continue_owed = False  # it asked for 100 Continue and has not sent its body yet
        self._reading = True  # False once the last request was read, or one was refused: the rest is dropped
        self._task: asyncio.Task[None] | None = None
        self._idle: asyncio.TimerHandle | None = None  # the idle timeout, or the linger after a refusal
        # Where the request being read is (0 between requests, 1 in its head, 2 in its body), its number,
        # and the deadline that bounds it (for which request and part), armed once a part spans reads.
        self._phase = 0
        self._serial = 0
        self._deadline: asyncio.TimerHandle | None = None
        self._deadline_for = (0, 0)
        self._started_s = 0.0  # when the part under the deadline began
        self._eof = False  # the client shut its side: answer what was read, then close
        self._drained: asyncio.Future[None] | None = None
        # The request being answered.
        self.http11 = True
        self.keep_alive = True
        self.started = False  # the current answer's head went out

    # ---- asyncio callbacks ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        server = self._server
        if len(server.connections) >= self._limits.max_connections:
            # Answered, not just closed: the client learns why, and that it may try again.
            self.keep_alive = self._reading = False
            message = f"the proxy has {len(server.connections)} client connections open, its limit"
            self._write(self._whole(json_error(503, message, _KINDS[503])))
            return self._close()
        server.connections.add(self)
        self._arm_idle()

    def data_received(self, data: bytes) -> None:
        if not self._reading:
            return
        body_bytes = self._body_bytes
        self._carried, self._read = self._chunk_line, data
        self._chunk_line_began = False
        phase, serial = self._phase, self._serial
        try:
            self._meter.read(data)
            self._feed(data)
            self._meter.after(data)
            if self._phase == 1 and self._reading:
                self._count_head_line(data, phase, serial)
            if self._chunked and self._reading:
                if self._body_bytes == body_bytes:
                    self._overhead += len(data)
                    if self._overhead > MAX_CHUNK_OVERHEAD_BYTES:
                        raise _Refusal(
                            400, f"chunk lines or trailers longer than {MAX_CHUNK_OVERHEAD_BYTES} bytes"
                        )
                if self._chunk_line >= 0:
                    self._count_chunk_line(data)
        except HeadTooLarge as e:
            self._refuse_later(_Refusal(431, f"request {e}"))
        except _Refusal as e:
            self._refuse_later(e)
        self._read = b""  # not kept past the read: a stalled connection holds only what it buffered
        if self._task is None:
            self._next()
        elif self._queue and self.transport is not None:
            self.transport.pause_reading()  # a client pipelining ahead waits for its answers
        self._arm_deadline()

    def eof_received(self) -> bool:
        """The client shut its side of the connection (a half-close): what it sent whole is answered, then
        the connection closed; a request cut short is refused."""
        self._eof = True
        if self._reading and self._phase:
            self._refuse_later(_Refusal(400, "the client ended the connection before its request was whole"))
        self._reading = False
        self._cancel_deadline()
        if self._task is None:
            self._next()
        if self._task is None:
            return False  # nothing under way: the transport closes
        if self.http11 and not self.started:
            self._write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self._probe()
        return True  # an answer under way keeps the transport open

    def _probe(self) -> None:
        """While the answer to a client that shut its side is under way, end it if the client has gone
        (its socket answered the 100 Continue with a reset), as when a client closes mid-request."""
        if self._task is None or self.transport is None or self.transport.is_closing():
            return
        try:
            sock = self.transport.get_extra_info("socket")
            state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]
        except (AttributeError, OSError):  # no TCP socket (a test's fake transport), or not Linux
            return
        if state == _TCP_CLOSE:
            self.transport.abort()  # connection_lost cancels the handler
        else:
            self._loop.call_later(EOF_PROBE_S, self._probe)

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        self._release()
        self._cancel_deadline()
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
                if cause is not None:
                    # Its traceback holds this frame (a cycle) and the callback's, with the bytes read: freed
                    # now, not at the next garbage collection.
                    cause.__traceback__ = None
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
        refusal.__traceback__ = None  # it would keep the frames that raised it, and the bytes they read
        self._reading = False
        self._continue_owed = False
        self._release()
        self._cancel_deadline()
        self._phase = 0
        self._queue.append(refusal)

    def _release(self) -> None:
        """Drop the body being read, and its count in the server's buffered bytes."""
        self._server.buffered_body_bytes -= self._body_bytes
        self._body_bytes = 0
        self._body = []

    def _count_head_line(self, data: bytes, phase: int, serial: int) -> None:
        """Bound the head line being read as it arrives, not once it is whole: httptools grows a header's
        name and value by concatenation, each read copying what came before (quadratic in a line cut
        fine). Linear: only this read is scanned. A head that began in this read after another request
        ended in it is not counted until its next read (the line's start is not known)."""
        if phase == 1 and serial == self._serial:  # the whole read is this head's
            line = self._head_line
        elif phase == 0 and serial + 1 == self._serial:  # the read began between requests, with this one
            line = 0
        else:
            self._head_line = 0
            return
        end = data.rfind(b"\n")
        self._head_line = line + len(data) if end < 0 else len(data) - end - 1
        if self._head_line > MAX_LINE_BYTES + 2:
            raise _Refusal(431, f"a request head line longer than {MAX_LINE_BYTES} bytes")

    def _count_chunk_line(self, data: bytes) -> None:
        """Bound the chunk-size line being read (llhttp takes any number of leading zeros and any length of
        extensions), in time linear in the bytes read: only this read is scanned."""
        if self._chunk_line_began:  # it began after the last line end of this read
            self._chunk_line = len(data) - data.rfind(b"\n") - 1
        else:
            self._chunk_line += len(data)
        self._check_chunk_line(self._chunk_line)

    @staticmethod
    def _check_chunk_line(n: int) -> None:
        """A chunk-size line of ``n`` bytes (its CRLF included once it has ended)."""
        if n > MAX_LINE_BYTES + 2:
            raise _Refusal(400, f"a chunk-size line longer than {MAX_LINE_BYTES} bytes")

    # ---- deadlines -----------------------------------------------------------------------------------

    def _arm_deadline(self) -> None:
        """Once a request's head or body spans reads, bound it: a timer for the part being read (none for
        a head or a body read whole in one go, nor for a body owed a 100 Continue not yet sent)."""
        phase = self._phase if self._reading and not self._continue_owed else 0
        if not phase:
            return self._cancel_deadline()
        if self._deadline is not None and self._deadline_for == (self._serial, phase):
            return
        self._cancel_deadline()
        if self._idle is not None:  # not idle: reading a request
            self._idle.cancel()
            self._idle = None
        self._started_s = self._loop.time()
        self._deadline_for = (self._serial, phase)
        limit = self._limits.head_timeout_s if phase == 1 else self._body_allowance()
        self._deadline = self._loop.call_at(self._started_s + limit, self._expire)

    def _body_allowance(self) -> float:
        limits = self._limits
        known = self._body_bytes if self._chunked else self._length
        return max(limits.body_timeout_s, known / limits.body_min_rate_bytes_s)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        _, phase = self._deadline_for
        if phase == 2:
            until = self._started_s + self._body_allowance()  # a chunked body that kept up the rate
            if until > self._loop.time() + 0.001:
                self._deadline = self._loop.call_at(until, self._expire)
                return
        took = self._loop.time() - self._started_s
        part = "head" if phase == 1 else f"body ({self._body_bytes} bytes so far)"
        self._refuse_later(_Refusal(408, f"the request's {part} did not arrive within {took:.1f} s"))
        if self._task is None:
            self._next()

    # httptools' callbacks, for the request being read

    def on_message_begin(self) -> None:
        self._meter.begin()
        self._url = bytearray()  # grown in place: a request line cut fine is not copied per piece
        self._headers = Headers()
        self._body_bytes = 0
        self._phase = 1
        self._serial += 1

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
        if key == "host" and earlier is not None:
            raise _Refusal(400, "two Host headers")
        headers[key] = text if earlier is None else f"{earlier}, {text}"

    def on_headers_complete(self) -> None:
        self._meter.end()
        parser, headers = self._parser, self._headers
        version = parser.get_http_version()
        if version != "1.1" and version != "1.0":
            raise _Refusal(505, f"unsupported version HTTP/{version}")
        if not self._url.startswith(b"/"):
            raise _Refusal(400, f"malformed request line: target {bytes(self._url[:80])!r} is not a path")
        if version == "1.1" and "host" not in headers:
            raise _Refusal(400, "an HTTP/1.1 request without a Host header")
        coding = headers.get("transfer-encoding")
        if coding is not None and version == "1.0":
            raise _Refusal(400, "Transfer-Encoding on an HTTP/1.0 request")
        if coding is not None and coding.lower() != "chunked":
            raise _Refusal(501, f"unsupported Transfer-Encoding {coding[:40]!r}")
        length = headers.get("content-length")
        self._length = 0 if length is None else int(length)
        if self._length > self._max_body:
            raise _Refusal(413, f"request body larger than {self._max_body} bytes")
        if parser.should_upgrade() and (coding is not None or (length is not None and int(length))):
            raise _Refusal(400, "an Upgrade request with a body")
        self._chunked, self._overhead = coding is not None, 0
        if self._chunked:
            self._chunk_line, self._chunk_line_began = 0, True
        self._phase = 2
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
        n = len(body)
        if self._body_bytes + n > self._max_body:
            raise _Refusal(413, f"request body larger than {self._max_body} bytes")
        server = self._server
        if server.buffered_body_bytes + n > self._limits.max_buffered_body_bytes:
            raise _Refusal(
                503,
                f"the proxy is reading {server.buffered_body_bytes} bytes of request bodies, its limit: "
                "try again later",
            )
        server.buffered_body_bytes += n
        self._body_bytes += n
        self._body.append(body)

    def on_chunk_header(self) -> None:
        self._chunk_line = -1
        if self._carried >= 0:  # the line began in an earlier read and ends at this one's first LF
            carried, self._carried = self._carried, -1
            self._check_chunk_line(carried + self._read.find(b"\n") + 1)

    def on_chunk_complete(self) -> None:
        self._chunk_line, self._chunk_line_began = 0, True

    def on_message_complete(self) -> None:
        self._meter.done()
        self._continue_owed = self._chunked = False
        self._chunk_line = -1
        self._phase = 0
        # The body is the handler's now: it no longer counts as being read.
        self._server.buffered_body_bytes -= self._body_bytes
        self._body_bytes = 0
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
        self._cancel_deadline()
        self._write(self._whole(json_error(status, message, _KINDS.get(status, "BadRequestError"))))
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
        if not self.keep_alive or (self._eof and not self._queue):
            self._close()
        elif self.transport is not None and not self.transport.is_closing():
            if not self._phase:  # else the next request's head or body is under its deadline
                self._arm_idle()
            self._next()
            if not self._queue:
                self.transport.resume_reading()
            self._arm_deadline()

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
        self._idle = self._loop.call_later(self._limits.keepalive_s, self._close)

    def _close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()  # after what is buffered has gone out


class Server:
    """Routes: exact paths, each with the methods it takes."""

    def __init__(
        self, routes: Mapping[tuple[str, str], Handler], max_body_bytes: int, limits: Limits | None = None
    ) -> None:
        self._routes = dict(routes)
        self._paths = {path for _, path in routes}
        self.max_body_bytes = max_body_bytes
        self.limits = limits or Limits()
        self.connections: set[_Connection] = set()
        self.buffered_body_bytes = 0  # of requests being read, on every connection
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
