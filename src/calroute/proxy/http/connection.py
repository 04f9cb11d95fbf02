"""One connection from the proxy to an engine, as an asyncio Protocol, and the timer that bounds its silence.

Every read goes straight to the connection's httptools (llhttp) response parser, from the event loop's data
callback: the answer's status and headers, its body pieces (Content-Length, chunked, or until the engine
closes) and its end are known as the bytes arrive. The pieces wait in ``parts`` for the client's coroutine
reads (client.py) or, while a response is being relayed, go on to it at once from the same callback: for a
decode stream, no task wakes per SSE event. An interim 1xx answer is skipped; bytes after the answer's end
mark the connection as not reusable.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol, cast

import httptools

from calroute.errors import CalrouteError
from calroute.proxy.http.framing import FramingError
from calroute.proxy.http.head import HeadMeter, HeadTooLarge


class RelayTarget(Protocol):
    """What takes a connection's body pieces from the data callback (answer.EngineResponse, relaying)."""

    def body_arrived(self) -> None: ...  # after every read: the pieces in ``parts``, the end, a failure

    def connection_ended(self) -> None: ...


class ClosedEarly(CalrouteError, EOFError):
    """The engine closed the connection before a whole response head came; ``received``: the bytes that
    did."""

    def __init__(self, received: int) -> None:
        super().__init__(f"the engine closed the connection after {received} bytes of the answer")
        self.received = received


class _Beyond(CalrouteError):
    """Bytes after the end of the answer (or with no request sent)."""


class Connection(asyncio.Protocol):
    """One connection to an engine, one request at a time: ``start`` before each request is sent."""

    def __init__(self) -> None:
        # One look-up per connection: on Python 3.11 every asyncio.get_running_loop() is a getpid() system
        # call, and per request they added up to 4 % of the proxy's CPU.
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.closed = False  # the engine's end: EOF, a reset, or our own close
        self.error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._writable: asyncio.Future[None] | None = None  # set while the socket is full
        self.relaying: RelayTarget | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._meter = HeadMeter()
        self._expecting = False  # a request went out and its final answer has not ended
        self._interim = False  # the answer being read is a 1xx
        self.extra = False  # bytes came that belong to no answer: the connection is not reused
        self.failure: FramingError | None = None  # the bytes could not be read as an answer
        # The answer being read.
        self.received = 0
        self.status = 0
        self.headers: dict[bytes, bytes] = {}  # names lower-cased
        self.keep_alive = False
        self.until_close = False  # its body ends with the connection
        self.head_done = False
        self.body_done = False
        self.parts: deque[bytes] = deque()  # body pieces not taken yet
        # A cap on the body (set by a whole read): once past it, nothing more is kept and reading stops.
        # Checked here, as the bytes arrive: one loop turn can bring many reads (libuv makes up to 32).
        self.body_limit: int | None = None
        self.body_bytes = 0
        self.over_limit = False

    def start(self) -> None:
        """A request is about to go out: what arrives from now on is its answer."""
        self._expecting = True
        self.received, self.status, self.headers = 0, 0, {}
        self.keep_alive = self.until_close = self.head_done = self.body_done = False
        self.parts.clear()
        self.body_limit, self.body_bytes, self.over_limit = None, 0, False

    # ---- asyncio.Protocol -----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.failure is not None or self.extra:
            return  # the connection is not read again
        self.received += len(data)
        try:
            self._meter.read(data)
            self._parser.feed_data(data)
            self._meter.after(data)
        except HeadTooLarge as e:
            self.failure = FramingError(f"a response {e}")
        except httptools.HttpParserCallbackError as e:
            cause = e.__context__
            if isinstance(cause, _Beyond):
                self.extra = True
            elif isinstance(cause, HeadTooLarge):
                self.failure = FramingError(f"a response {cause}")
            else:
                raise
        except httptools.HttpParserUpgrade:
            self.failure = FramingError("the engine switched protocols")
        except httptools.HttpParserError as e:
            self.failure = FramingError(f"unreadable answer: {e}")
        if self.relaying is not None:
            self.relaying.body_arrived()
        else:
            self._wake()

    def eof_received(self) -> bool:
        self._ended(None)
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended(exc)

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = self.loop.create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    # ---- httptools' callbacks -------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if not self._expecting:
            raise _Beyond()
        self._meter.begin()
        self.headers = {}

    def on_header(self, name: bytes, value: bytes) -> None:
        self._meter.line(len(name) + len(value) + 4)
        self.headers[name.lower()] = value.strip()

    def on_headers_complete(self) -> None:
        self._meter.end()
        status = self._parser.get_status_code()
        if status < 200:  # an interim answer (100 Continue, 103 Early Hints): the final one follows
            self._interim = True
            return
        headers = self.headers
        self.status = status
        self.keep_alive = self._parser.should_keep_alive()
        self.until_close = (
            status != 204
            and status != 304
            and b"content-length" not in headers
            and not headers.get(b"transfer-encoding", b"").lower().endswith(b"chunked")
        )
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        self.body_bytes += len(body)
        if self.body_limit is not None and self.body_bytes > self.body_limit:
            self.over()
            return
        self.parts.append(body)

    def over(self) -> None:
        """The body passed its cap: drop what waits, read no more (the response closes the connection)."""
        if not self.over_limit:
            self.over_limit = True
            self.parts.clear()
            if self.transport is not None and not self.transport.is_closing():
                self.transport.pause_reading()

    def on_message_complete(self) -> None:
        self._meter.done()
        if self._interim:
            self._interim = False
            return
        self._expecting = False
        self.body_done = True

    # ---- for the client -------------------------------------------------------------------------------

    def _ended(self, exc: BaseException | None) -> None:
        if self.closed:
            return
        self.closed, self.error = True, exc
        self._wake()
        self.resume_writing()
        if self.relaying is not None:
            self.relaying.connection_ended()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait(self) -> None:
        """Until something arrives, or the connection ends."""
        self._waiter = self.loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def send(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)
        if self._writable is not None:  # a long prompt: let the socket take it
            await self._writable
        if self.closed and self.error is not None:
            raise ConnectionResetError(f"the engine closed the connection: {self.error}")

    async def read_head(self) -> None:
        """Until the final answer's head has come (``status``, ``headers``): FramingError if what came is
        not one, ClosedEarly if the engine closed first."""
        while not self.head_done:
            if self.failure is not None:
                raise self.failure
            if self.closed:
                raise ClosedEarly(self.received)
            await self.wait()

    def reusable(self) -> bool:
        return not self.closed and not self.extra and self.failure is None and not self.is_closing()

    def is_closing(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def close(self) -> None:
        self.relaying = None
        if self.transport is not None:
            self.transport.close()


class Silence:
    """Aborts a connection whose engine stays silent for ``timeout_s`` while a read waits. One timer per
    response, moved only when it fires: a timeout per read (asyncio.timeout) cost about 5 % of the proxy's
    CPU, one per SSE event."""

    def __init__(self, conn: Connection, timeout_s: float) -> None:
        self._conn = conn
        self._timeout_s = timeout_s
        self._loop = conn.loop
        self.now = self._loop.time
        self.reading: float | None = None  # since when we wait for the engine; None when we do not
        self.fired = False
        self._timer = self._loop.call_later(timeout_s, self._check)

    def _check(self) -> None:
        now = self._loop.time()
        if self.reading is None or now - self.reading < self._timeout_s:
            due = now + self._timeout_s if self.reading is None else self.reading + self._timeout_s
            self._timer = self._loop.call_at(due, self._check)
            return
        self.fired = True
        if self._conn.transport is not None:
            self._conn.transport.abort()

    def cancel(self) -> None:
        self._timer.cancel()
