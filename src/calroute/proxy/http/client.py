"""The proxy's HTTP/1.1 client to its engines: requests over kept-alive connections, on asyncio protocols.

Every client request costs the proxy two engine requests (the prefill, the decode stream), so the client
is small and close to the socket: a request is written in one call, and the answer is parsed by the
connection's httptools parser as it arrives (connection.py). Its body is read piece by piece by a
coroutine, or relayed from the event loop's data callback (EngineResponse.relay): a decode stream then
wakes no task per SSE event. Deliberately small: HTTP/1.1, bodies by Content-Length, chunked or the
connection's close, no redirects, no compression (none is asked for), no proxies. The /metrics polls use it
too (scrape.py). benchmarks/RESULTS.md has what it saved over aiohttp's client.

Engines are not trusted: an answer read whole is read up to a cap (``read(max_bytes)``: a Content-Length over
it is refused before a byte of the body is read, a body that grows past it as it arrives), and an answer the
parser cannot read is a ProtocolError, an UpstreamError with its ``kind``. What the client writes is checked
too: a request whose method, path or a header carries CR, LF or NUL is refused (UnsafeRequest) before it is
sent, so nothing a client sent can add a line to a request to an engine.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from types import TracebackType
from urllib.parse import urlsplit

from calroute.errors import CalrouteError
from calroute.proxy.http.connection import ClosedEarly, Connection, Silence
from calroute.proxy.http.framing import FramingError


class UpstreamError(CalrouteError):
    """The engine could not be reached, broke the exchange off, or answered with HTTP we do not read."""


class ProtocolError(UpstreamError):
    """The engine answered, but not in a way the proxy reads: ``kind`` "framing" (bytes that are not an
    HTTP/1.1 answer), "too_large" (a body over its cap) or "event_too_large" (an SSE event over its cap,
    relay.py). An engine failure like any UpstreamError, counted apart in the proxy's metrics."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class UnsafeRequest(CalrouteError, ValueError):
    """A request to an engine that would carry CR, LF or NUL in its method, path or a header: never sent.
    No engine is at fault (every engine would get the same bytes): the proxy built a request it must not
    send."""


_UNSAFE = re.compile(r"[\r\n\0]")


def check_head(method: str, path: str, headers: Mapping[str, str]) -> None:
    """UnsafeRequest if a request line or header would carry CR, LF or NUL (a header name also not empty
    and without a colon): the bytes of a request go out only as the lines they were meant to be."""
    for what, text in (("method", method), ("path", path)):
        if _UNSAFE.search(text):
            raise UnsafeRequest(f"the request's {what} contains CR, LF or NUL")
    for name, value in headers.items():
        if not name or ":" in name or _UNSAFE.search(name):
            raise UnsafeRequest(f"a header name is not a token: {name[:40]!r}")
        if _UNSAFE.search(value):
            raise UnsafeRequest(f"the value of header {name[:40]!r} contains CR, LF or NUL")


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
        self, endpoint: Endpoint, conn: Connection, read_timeout_s: float | None, watch: Silence | None = None
    ) -> None:
        self.status = conn.status
        self.headers = conn.headers
        self.keep_alive = conn.keep_alive
        self._endpoint = endpoint
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
                self._endpoint.give_back(conn)
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


class Endpoint:
    """One engine: its address and the connections it keeps alive between requests."""

    def __init__(self, url: str, keepalive_s: float) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.netloc = parts.netloc
        self.base_path = parts.path.rstrip("/")
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        # The engine's server drops idle connections after a while (uvicorn: 5 s); one kept for less than
        # that is never in the middle of being closed when we send on it.
        self.keepalive_s = keepalive_s
        # Oldest first; the newest is reused first, so the connections a burst opened go idle and expire.
        self._idle: deque[tuple[float, Connection]] = deque()
        self._expiry: asyncio.TimerHandle | None = None

    def give_back(self, conn: Connection) -> None:
        self._idle.append((time.monotonic(), conn))
        if self._expiry is None:
            self._expiry = asyncio.get_running_loop().call_later(self.keepalive_s, self._expire)

    def close(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        while self._idle:
            self._idle.pop()[1].close()

    def _expire(self) -> None:
        # Close expired connections even when no request comes to reuse one: the engine would close them
        # soon, and a socket it closed stays in CLOSE_WAIT on our side until we close it too.
        self._expiry = None
        now = time.monotonic()
        while self._idle and now - self._idle[0][0] >= self.keepalive_s:
            self._idle.popleft()[1].close()
        if self._idle:
            wait_s = self._idle[0][0] + self.keepalive_s - now
            self._expiry = asyncio.get_running_loop().call_later(wait_s, self._expire)

    def _take_idle(self) -> Connection | None:
        now = time.monotonic()
        while self._idle:
            since, conn = self._idle.pop()
            if now - since < self.keepalive_s and conn.reusable():
                return conn
            conn.close()
        return None

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(Connection, self.host, self.port, ssl=self._ssl)
        return conn

    def request_bytes(self, method: str, path: str, headers: Mapping[str, str], body: bytes | None) -> bytes:
        """The request as it goes out; UnsafeRequest if a line would carry CR, LF or NUL (or a header
        name a colon). The check costs two counts over the head: a line break anywhere but between the
        lines changes them (check_head then says where)."""
        lines = [f"{method} {self.base_path}{path} HTTP/1.1", f"Host: {self.netloc}"]
        if body is not None:
            lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        head = "\r\n".join(lines)
        breaks = len(lines) - 1
        if (
            head.count("\n") != breaks
            or head.count("\r") != breaks
            or "\0" in head
            or any(not k or ":" in k for k in headers)
        ):
            check_head(method, f"{self.base_path}{path}", headers)
            raise UnsafeRequest("the request's head contains CR, LF or NUL")
        return (head + "\r\n\r\n").encode("latin-1") + (body or b"")

    async def request(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes | None = None,
        read_timeout_s: float | None = None,
    ) -> EngineResponse:
        """Send the request and read the response head. A kept connection that the engine closed before
        answering is replaced by a fresh one, once (the engine never saw that request); any other failure
        raises UpstreamError, and silence longer than ``read_timeout_s`` TimeoutError."""
        data = self.request_bytes(method, path, headers, body)
        conn = self._take_idle()
        if conn is not None:
            try:
                return await self._exchange(conn, data, read_timeout_s)
            except TimeoutError:
                raise
            except ClosedEarly as e:
                if e.received:
                    raise UpstreamError(f"{type(e).__name__}: {e}") from e
            except ConnectionError:
                pass
            except FramingError as e:
                raise ProtocolError("framing", f"{type(e).__name__}: {e}") from e
            except OSError as e:
                raise UpstreamError(f"{type(e).__name__}: {e}") from e
        try:
            async with asyncio.timeout(read_timeout_s):
                conn = await self._connect()
            return await self._exchange(conn, data, read_timeout_s)
        except TimeoutError:
            raise
        except FramingError as e:
            raise ProtocolError("framing", f"{type(e).__name__}: {e}") from e
        except (OSError, EOFError) as e:
            raise UpstreamError(f"{type(e).__name__}: {e}") from e

    async def _exchange(self, conn: Connection, data: bytes, read_timeout_s: float | None) -> EngineResponse:
        # The response's own silence watch covers the wait for the head too: no asyncio.timeout (three
        # getpid() calls and a timer each) on the path of every request.
        watch = None if read_timeout_s is None else Silence(conn, read_timeout_s)
        try:
            if watch is not None:
                watch.reading = watch.now()
            conn.start()
            try:
                await conn.send(data)
                await conn.read_head()
            except (ClosedEarly, ConnectionError):
                if watch is not None and watch.fired:
                    raise TimeoutError(f"the engine was silent for {read_timeout_s:g} s") from None
                raise
            if watch is not None:
                watch.reading = None
        except BaseException:
            if watch is not None:
                watch.cancel()
            conn.close()
            raise
        return EngineResponse(self, conn, read_timeout_s, watch)
