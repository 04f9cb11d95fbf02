"""Reading a client's requests, for the proxy's HTTP/1.1 server (server.py): httptools (llhttp) parses the
bytes as they arrive; each request read whole, or the refusal that ends the reading, joins a queue that the
connection answers in order. Every limit on a request as it is read is here. What it guarantees:

- Every wait on a client for a request is bounded (``ClientLimits`` in proxy/config.py; docs/proxy.md,
  "Client limits"): a request's head must end within ``head_timeout_s`` of its first byte, and its body
  arrive within max(``body_timeout_s``, its length / ``body_min_rate_bytes_s``) of the head's end (a
  chunked body's length: what has come so far), else 408. A timer is armed only once a head or body spans
  reads. A body owed a 100 Continue is timed from the 100.
- The bodies being read, across connections, hold at most ``max_buffered_body_bytes`` (the body that would
  cross it gets 503). Reading costs time linear in the bytes received however they are cut (the request
  line grows in place; body pieces are joined once; a head line and a chunk-size line are measured per
  read, and refused past MAX_LINE_BYTES before they are whole: httptools grows a header by concatenation,
  so a line is what bounds its copying).
- Bodies by Content-Length or chunked, at most ``max_body_bytes``: 413 from the Content-Length before the
  body is read, or once a chunked body grows past it. A request that could be read two ways
  (Content-Length and Transfer-Encoding, two Content-Lengths) is refused with 400, as RFC 9112 asks.
- A head larger than MAX_HEAD_BYTES, or with a line longer than MAX_LINE_BYTES, gets 431, counted as the
  bytes arrive (head.HeadMeter); a malformed head (bare-LF line endings, control bytes, a bad chunk size)
  400; an HTTP/1.1 request without a Host header, with two, or an HTTP/1.0 one with Transfer-Encoding 400
  (RFC 9112 3.2, 6.1: llhttp lets them through); a chunk-size line over MAX_LINE_BYTES 400 (llhttp takes
  any number of leading zeros); a version other than 1.0 and 1.1, or a Transfer-Encoding other than
  chunked, 400 too: RFC 9112 suggests 505 and 501, but bad input gets a 4xx here (docs/faults.md); uvicorn,
  vLLM's server, answers any request its parser cannot read with 400. A refusal ends the reading:
  nothing after it is parsed.
- An Upgrade request is read as a plain request (the server never switches protocols), unless it has a
  body (400).

``RequestReader`` is a base class of the server's connection, not an object beside it: the httptools
callbacks run per request and the counting per read, and one object keeps them as cheap as before (no
forwarding call per callback). The seam: the connection feeds each read to ``_take`` and reads the queue,
the phase and the deadlines; the reader calls two hooks, ``_busy`` (a request began: not idle) and
``_queued`` (a deadline expired: a refusal was queued outside a read).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol

import httptools

from calroute.errors import CalrouteError
from calroute.proxy.config import ClientLimits
from calroute.proxy.http.head import MAX_LINE_BYTES, Headers, HeadMeter, HeadTooLarge
from calroute.proxy.http.messages import ClientConnection, Request

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
        return _Refusal(400, f"unsupported version: {reason}")
    if isinstance(e, httptools.HttpParserInvalidMethodError | httptools.HttpParserInvalidURLError):
        return _Refusal(400, f"malformed request line: {reason}")
    return _Refusal(400, f"malformed request head: {reason}")


class BodyBudget(Protocol):
    """What every connection's reader shares (the server): the limits, the bytes being read."""

    limits: ClientLimits
    buffered_body_bytes: int


class RequestReader:
    """The reading half of one client connection: the parser, the request being read, and the queue of
    requests read whole (or the refusal that ended the reading) not yet answered."""

    def __init__(self, budget: BodyBudget, conn: ClientConnection) -> None:
        self._budget = budget
        self._conn = conn  # what each request answers through
        # One look-up per connection: on Python 3.11 every get_running_loop() is a getpid() system call.
        self._loop = asyncio.get_running_loop()
        self._limits = budget.limits
        self._max_body = budget.limits.max_body_bytes
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
        # Where the request being read is (0 between requests, 1 in its head, 2 in its body), its number,
        # and the deadline that bounds it (for which request and part), armed once a part spans reads.
        self._phase = 0
        self._serial = 0
        self._deadline: asyncio.TimerHandle | None = None
        self._deadline_for = (0, 0)
        self._started_s = 0.0  # when the part under the deadline began

    # ---- what the connection provides -------------------------------------------------------------------

    def _busy(self) -> None:
        """A request is being read: the connection is not idle."""
        raise NotImplementedError

    def _queued(self) -> None:
        """A refusal was queued outside a read (a deadline expired): answer it if nothing is under way."""
        raise NotImplementedError

    # ---- what the connection calls -------------------------------------------------------------------

    def _take(self, data: bytes) -> None:
        """Read ``data``: the requests it completes join the queue; a request it shows cannot be served
        ends the reading, its refusal queued in its turn."""
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
        self._budget.buffered_body_bytes -= self._body_bytes
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
        self._busy()  # not idle: reading a request
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
        self._queued()

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
            raise _Refusal(400, f"unsupported version HTTP/{version}")
        if not self._url.startswith(b"/"):
            raise _Refusal(400, f"malformed request line: target {bytes(self._url[:80])!r} is not a path")
        if version == "1.1" and "host" not in headers:
            raise _Refusal(400, "an HTTP/1.1 request without a Host header")
        coding = headers.get("transfer-encoding")
        if coding is not None and version == "1.0":
            raise _Refusal(400, "Transfer-Encoding on an HTTP/1.0 request")
        if coding is not None and coding.lower() != "chunked":
            raise _Refusal(400, f"unsupported Transfer-Encoding {coding[:40]!r}")
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
        self._busy()

    def on_body(self, body: bytes) -> None:
        self._continue_owed = False
        self._overhead = 0
        n = len(body)
        if self._body_bytes + n > self._max_body:
            raise _Refusal(413, f"request body larger than {self._max_body} bytes")
        budget = self._budget
        if budget.buffered_body_bytes + n > self._limits.max_buffered_body_bytes:
            raise _Refusal(
                503,
                f"the proxy is reading {budget.buffered_body_bytes} bytes of request bodies, its limit: "
                "try again later",
            )
        budget.buffered_body_bytes += n
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
        self._budget.buffered_body_bytes -= self._body_bytes
        self._body_bytes = 0
        body, self._body = self._body, []
        request = Request(
            self._conn,
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
