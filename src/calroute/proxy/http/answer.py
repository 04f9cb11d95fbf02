"""An engine's answer as the proxy's HTTP client reads it (client.py sends the request and makes the
EngineResponse): its body piece by piece to a coroutine, whole up to a cap, or relayed from the event loop's
data callback (EngineResponse.relay: a decode stream then wakes no task per SSE event); and the errors an
engine's failure is reported as.

Engines are not trusted: an answer read whole is read up to a cap (``read(max_bytes)``: a Content-Length over
it is refused before a byte of the body is read, a body that grows past it as it arrives), and an answer the
parser cannot read is a ProtocolError, an UpstreamError with its ``kind``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType

from calroute.errors import CalrouteError
from calroute.proxy.http.connection import Connection, Silence

__all__ = ["EngineResponse", "ProtocolError", "UpstreamError", "read_at_most", "too_large"]


class UpstreamError(CalrouteError):
    """The engine could not be reached, broke the exchange off, or answered with HTTP we do not read."""


class ProtocolError(UpstreamError):
    """The engine answered, but not in a way the proxy reads: ``kind`` "framing" (bytes that are not an
    HTTP/1.1 answer), "too_large" (a body over its cap) or "event_too_large" (an SSE event over its cap,
    relay.py). An engine failure like any UpstreamError, counted apart in the proxy's metrics."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def too_large(max_bytes: int) -> ProtocolError:
    return ProtocolError("too_large", f"the engine's answer is larger than {max_bytes} bytes")


async def read_at_most(next_part: Callable[[], Awaitable[bytes | None]], max_bytes: int | None) -> bytes:
    """A body whole from its pieces, refused (ProtocolError "too_large") once it passes ``max_bytes``:
    what is held is never more than the cap and one piece, and the pieces are joined once."""
    pieces: list[bytes] = []
    size = 0
    while (part := await next_part()) is not None:
        size += len(part)
        if max_bytes is not None and size > max_bytes:
            raise too_large(max_bytes)
        pieces.append(part)
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def _broken(conn: Connection, fired: bool, timeout_s: float | None) -> Exception:
    """Why a body stopped short: the silence watch cut it (TimeoutError), or the engine did."""
    if fired:
        return TimeoutError(f"the engine was silent for {timeout_s:g} s")
    why = f": {type(conn.error).__name__}: {conn.error}" if conn.error is not None else ""
    return UpstreamError(f"the engine closed the connection in the middle of the body{why}")


class EngineResponse:
    """An engine's final answer (an interim 1xx is skipped), read within ``async with``: leaving the block
    returns the connection to its endpoint when the body was read to the end and the engine keeps it
    alive, and closes it otherwise. ``headers``: names lower-cased, as bytes.

    The body comes either piece by piece to a coroutine (next_part, parts, read) or, from some point on,
    to a callback (relay). Both raise UpstreamError when the engine breaks off or misframes and
    TimeoutError when it stays silent for longer than the read timeout; read(max_bytes) raises
    ProtocolError ("too_large") for a body over ``max_bytes``."""

    def __init__(
        self,
        give_back: Callable[[Connection], None],
        conn: Connection,
        read_timeout_s: float | None,
        watch: Silence | None = None,
    ) -> None:
        self.status = conn.status
        self.headers = conn.headers
        self.keep_alive = conn.keep_alive
        self._give_back = give_back  # the endpoint's: a connection read to its end, kept alive, goes back
        self._conn: Connection | None = conn
        self._read_timeout_s = read_timeout_s
        self._complete = False
        self._watch = watch
        self._on_part: Callable[[bytes], bool] | None = None
        self._relay_done: asyncio.Future[bool] | None = None

    async def __aenter__(self) -> EngineResponse:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._watch is not None:
            self._watch.cancel()
        conn = self._conn
        if conn is not None:
            conn.relaying = None
            if self._complete and self.keep_alive and not conn.extra and exc_type is None:
                self._give_back(conn)
            else:
                conn.close()
            self._conn = None

    def _silence(self) -> Silence | None:
        if self._watch is None and self._read_timeout_s is not None:
            assert self._conn is not None
            self._watch = Silence(self._conn, self._read_timeout_s)
        return self._watch

    def _ended_well(self) -> None:
        self._complete = True
        if self._watch is not None:
            self._watch.cancel()

    def _outcome(self, conn: Connection) -> bool | Exception | None:
        """How the body stands with nothing left to take: True (ended), an error, or None (more to come)."""
        if conn.over_limit and conn.body_limit is not None:
            return too_large(conn.body_limit)
        if conn.body_done:
            return True
        if conn.failure is not None:
            return ProtocolError("framing", str(conn.failure))
        if conn.closed:
            fired = self._watch is not None and self._watch.fired  # the watch cut even a close-delimited body
            return True if conn.until_close and not fired else _broken(conn, fired, self._read_timeout_s)
        return None

    async def next_part(self) -> bytes | None:
        """The body's next piece as it arrives; None after its end."""
        conn = self._conn
        assert conn is not None, "the response was closed"
        parts = conn.parts
        while not parts:
            outcome = self._outcome(conn)
            if outcome is True:
                self._ended_well()
                return None
            if isinstance(outcome, Exception):
                raise outcome
            watch = self._silence()
            if watch is not None:
                watch.reading = watch.now()
            await conn.wait()
            if watch is not None:
                watch.reading = None
        return parts.popleft()

    async def parts(self) -> AsyncIterator[bytes]:
        while (part := await self.next_part()) is not None:
            yield part

    async def read(self, max_bytes: int | None = None) -> bytes:
        """The body whole; ProtocolError ("too_large") once it is over ``max_bytes``, as soon as its
        Content-Length says so."""
        if max_bytes is not None:
            length = self.headers.get(b"content-length")
            if length is not None and length.isdigit() and int(length) > max_bytes:
                raise too_large(max_bytes)
            conn = self._conn
            assert conn is not None, "the response was closed"
            conn.body_limit = max_bytes  # checked as the bytes arrive, however many reads a loop turn brings
            if conn.body_bytes > max_bytes:
                conn.over()
                raise too_large(max_bytes)
        return await read_at_most(self.next_part, max_bytes)

    # ---- the relay ------------------------------------------------------------------------------------

    def relay(self, on_part: Callable[[bytes], bool]) -> asyncio.Future[bool]:
        """Hand the rest of the body to ``on_part`` from the event loop's data callback, what each read
        brings in one piece; ``on_part`` returns False to stop early. The future: True once the body has
        ended, False when stopped (the connection is then dropped), or the error that broke it off."""
        conn = self._conn
        assert conn is not None, "the response was closed"
        self._on_part = on_part
        self._relay_done = conn.loop.create_future()
        conn.relaying = self
        watch = self._silence()
        if watch is not None:
            watch.reading = watch.now()
        self.body_arrived()
        if conn.closed and conn.relaying is self:
            self.connection_ended()
        return self._relay_done

    def stop(self) -> None:
        """End a relay early (the consumer gave up): its future resolves False."""
        self._stop(False)

    def pause_reading(self) -> None:
        """The consumer cannot take more for now: stop reading the engine (its own flow control holds it),
        and the silence watch with it."""
        if self._conn is not None and self._conn.transport is not None:
            self._conn.transport.pause_reading()
        if self._watch is not None:
            self._watch.reading = None

    def resume_reading(self) -> None:
        if self._conn is not None and self._conn.transport is not None and not self._conn.closed:
            self._conn.transport.resume_reading()
        if self._watch is not None:
            self._watch.reading = self._watch.now()

    def body_arrived(self) -> None:
        """The data callback, while relaying: what the read brought goes on in one piece."""
        conn = self._conn
        assert conn is not None and self._on_part is not None
        watch = self._watch
        if watch is not None and watch.reading is not None:
            watch.reading = watch.now()
        parts = conn.parts
        if parts:
            piece = parts.popleft() if len(parts) == 1 else b"".join(parts)
            parts.clear()
            try:
                keep_on = self._on_part(piece)
            except Exception as e:  # the consumer's own failure: hand it to the awaiting coroutine
                self._stop(e)
                return
            if not keep_on:
                self._stop(False)
                return
        if conn.body_done:
            self._stop(True)
        elif conn.failure is not None:
            self._stop(ProtocolError("framing", str(conn.failure)))

    def connection_ended(self) -> None:
        assert self._conn is not None
        outcome = self._outcome(self._conn)
        self._stop(False if outcome is None else outcome)

    def _stop(self, outcome: bool | Exception) -> None:
        conn = self._conn
        if conn is not None:
            conn.relaying = None
            if outcome is not True and conn.transport is not None and not conn.is_closing():
                # Nothing takes the rest: read no more of it (from a hostile engine, not into ``parts``
                # while the consumer writes its last words to its client) until the connection closes.
                conn.transport.pause_reading()
        done = self._relay_done
        if done is None or done.done():
            return
        if outcome is True:
            self._ended_well()
            done.set_result(True)
        elif outcome is False:
            done.set_result(False)
        else:
            done.set_exception(outcome)
