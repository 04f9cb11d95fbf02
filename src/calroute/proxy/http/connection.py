"""One connection from the proxy to an engine, as an asyncio Protocol, and the timer that bounds its silence.

What arrives waits in the connection's buffer for the client's coroutine reads (upstream.py), or, while a
response is being relayed, goes straight to that response from the event loop's data callback: for a decode
stream, no task wakes per SSE event.
"""

from __future__ import annotations

import asyncio
from typing import Protocol, cast

from calroute.proxy.http.framing import FramingError, ResponseHead

MAX_HEAD_BYTES = 64 * 1024


class RelayTarget(Protocol):
    """What takes a connection's bytes from the data callback (upstream.Response, while relaying)."""

    def data_arrived(self, data: bytes) -> None: ...

    def connection_ended(self) -> None: ...


class ClosedEarly(EOFError):
    """The engine closed the connection before a whole response head came; ``partial``: what did."""

    def __init__(self, partial: bytes) -> None:
        super().__init__(f"the engine closed the connection after {len(partial)} bytes of the head")
        self.partial = partial


class Connection(asyncio.Protocol):
    """One connection to an engine. What arrives waits in a buffer for the coroutine reads, or, while a
    response is being relayed, goes straight to it from the event loop's data callback."""

    def __init__(self) -> None:
        # One look-up per connection: on Python 3.11 every asyncio.get_running_loop() is a getpid() system
        # call, and per request they added up to 4 % of the proxy's CPU.
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self.closed = False  # the engine's end: EOF, a reset, or our own close
        self.error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._writable: asyncio.Future[None] | None = None  # set while the socket is full
        self.relaying: RelayTarget | None = None

    # ---- asyncio.Protocol -----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.relaying is not None:
            self.relaying.data_arrived(data)
            return
        self._buffer += data
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

    async def _wait(self) -> None:
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

    async def read_head(self) -> ResponseHead:
        while True:
            end = self._buffer.find(b"\r\n\r\n")
            if end >= 0:
                raw = bytes(self._buffer[: end + 4])
                del self._buffer[: end + 4]
                return ResponseHead(raw)
            if len(self._buffer) > MAX_HEAD_BYTES:
                raise FramingError(f"a response head larger than {MAX_HEAD_BYTES} bytes")
            if self.closed:
                raise ClosedEarly(bytes(self._buffer))
            await self._wait()

    async def read_some(self) -> bytes:
        """What has arrived (waiting for something if nothing has); b"" once the connection has ended."""
        while not self._buffer:
            if self.closed:
                return b""
            await self._wait()
        return self.take_buffered()

    def take_buffered(self) -> bytes:
        data = bytes(self._buffer)
        self._buffer.clear()
        return data

    def reusable(self) -> bool:
        return not self.closed and not self._buffer and self.transport is not None and not self.is_closing()

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
