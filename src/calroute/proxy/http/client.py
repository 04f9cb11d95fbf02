"""The proxy's HTTP/1.1 client to its engines: requests over kept-alive connections, on asyncio protocols.

Every client request costs the proxy two engine requests (the prefill, the decode stream). Through aiohttp's
client those two were the largest part of the proxy's CPU per request (benchmarks/RESULTS.md); this writes
a request in one call and reads the answer from the connection's own buffer. A decode stream can also be
relayed from the event loop's data callback (EngineResponse.relay): through asyncio streams every SSE
event woke a task and two async generators, the largest per-event cost left. Deliberately small: HTTP/1.1,
Content-Length, chunked or close-delimited bodies (http1.py), no redirects, no compression (none is asked
for), no proxies. The /metrics polls use it too (scrape.py).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from types import TracebackType
from urllib.parse import urlsplit

from calroute.proxy.http.connection import ClosedEarly, Connection, Silence
from calroute.proxy.http.framing import BodyDecoder, FramingError, ResponseHead


class UpstreamError(Exception):
    """The engine could not be reached, broke the exchange off, or answered with HTTP we do not read."""


def _broken(conn: Connection, fired: bool, timeout_s: float | None) -> Exception:
    """Why a body stopped short: the silence watch cut it (TimeoutError), or the engine did."""
    if fired:
        return TimeoutError(f"the engine was silent for {timeout_s:g} s")
    why = f": {type(conn.error).__name__}: {conn.error}" if conn.error is not None else ""
    return UpstreamError(f"the engine closed the connection in the middle of the body{why}")


class EngineResponse:
    """An engine's answer, read within ``async with``: leaving the block returns the connection to its
    endpoint when the body was read to the end and the engine keeps it alive, and closes it otherwise.

    The body comes either piece by piece to a coroutine (next_part, parts, read) or, from some point on,
    to a callback (relay). Both raise UpstreamError when the engine breaks off and TimeoutError when it
    stays silent for longer than the read timeout."""

    def __init__(
        self,
        endpoint: Endpoint,
        conn: Connection,
        head: ResponseHead,
        read_timeout_s: float | None,
        watch: Silence | None = None,
    ) -> None:
        self.status = head.status
        self.head = head
        self._endpoint = endpoint
        self._conn: Connection | None = conn
        self._read_timeout_s = read_timeout_s
        self._decoder = BodyDecoder(head)
        self._pending: deque[bytes] = deque()
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
        if self._conn is not None:
            self._conn.relaying = None
            if self._complete and self.head.keep_alive and exc_type is None:
                self._endpoint.give_back(self._conn)
            else:
                self._conn.close()
            self._conn = None

    def _silence(self) -> Silence | None:
        if self._watch is None and self._read_timeout_s is not None:
            assert self._conn is not None
            self._watch = Silence(self._conn, self._read_timeout_s)
        return self._watch

    def _ended_well(self) -> None:
        self._complete = not self._decoder.rest
        if self._watch is not None:
            self._watch.cancel()

    async def next_part(self) -> bytes | None:
        """The body's next piece as it arrives; None after its end."""
        conn = self._conn
        assert conn is not None, "the response was closed"
        while not self._pending:
            if self._decoder.done:
                self._ended_well()
                return None
            watch = self._silence()
            if watch is not None:
                watch.reading = watch.now()
            data = await conn.read_some()
            if watch is not None:
                watch.reading = None
            if not data:
                fired = watch is not None and watch.fired  # the watch cut it: even a close-delimited body
                if not fired and self._decoder.end():
                    self._ended_well()
                    return None
                raise _broken(conn, fired, self._read_timeout_s)
            try:
                self._pending.extend(self._decoder.feed(data))
            except FramingError as e:
                raise UpstreamError(str(e)) from e
        return self._pending.popleft()

    async def parts(self) -> AsyncIterator[bytes]:
        while (part := await self.next_part()) is not None:
            yield part

    async def read(self) -> bytes:
        return b"".join([part async for part in self.parts()])

    # ---- the relay ------------------------------------------------------------------------------------

    def relay(self, on_part: Callable[[bytes], bool]) -> asyncio.Future[bool]:
        """Hand the rest of the body to ``on_part`` from the event loop's data callback, each piece as it
        arrives; ``on_part`` returns False to stop early. The future: True once the body has ended, False
        when stopped (the connection is then dropped), or the error that broke it off."""
        conn = self._conn
        assert conn is not None, "the response was closed"
        self._on_part = on_part
        self._relay_done = conn.loop.create_future()
        pending = list(self._pending)
        self._pending.clear()
        for part in pending:
            if not self._deliver(part):
                return self._relay_done
        conn.relaying = self
        watch = self._silence()
        if watch is not None:
            watch.reading = watch.now()
        buffered = conn.take_buffered()
        if buffered:
            self.data_arrived(buffered)
        elif self._decoder.done:
            self._stop(True)
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

    def _deliver(self, part: bytes) -> bool:
        assert self._on_part is not None
        try:
            keep_on = self._on_part(part)
        except Exception as e:  # the consumer's own failure: hand it to the awaiting coroutine
            self._stop(e)
            return False
        if not keep_on:
            self._stop(False)
        return keep_on

    def data_arrived(self, data: bytes) -> None:
        if self._watch is not None and self._watch.reading is not None:
            self._watch.reading = self._watch.now()
        try:
            parts = self._decoder.feed(data)
        except FramingError as e:
            self._stop(UpstreamError(str(e)))
            return
        for part in parts:
            if not self._deliver(part):
                return
        if self._decoder.done:
            self._stop(True)

    def connection_ended(self) -> None:
        assert self._conn is not None
        fired = self._watch is not None and self._watch.fired
        if not fired and self._decoder.end():
            self._stop(True)
        else:
            self._stop(_broken(self._conn, fired, self._read_timeout_s))

    def _stop(self, outcome: bool | Exception) -> None:
        if self._conn is not None:
            self._conn.relaying = None
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
        lines = [f"{method} {self.base_path}{path} HTTP/1.1", f"Host: {self.netloc}"]
        if body is not None:
            lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")

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
                if e.partial:
                    raise UpstreamError(f"{type(e).__name__}: {e}") from e
            except ConnectionError:
                pass
            except (OSError, FramingError) as e:
                raise UpstreamError(f"{type(e).__name__}: {e}") from e
        try:
            async with asyncio.timeout(read_timeout_s):
                conn = await self._connect()
            return await self._exchange(conn, data, read_timeout_s)
        except TimeoutError:
            raise
        except (OSError, EOFError, FramingError) as e:
            raise UpstreamError(f"{type(e).__name__}: {e}") from e

    async def _exchange(self, conn: Connection, data: bytes, read_timeout_s: float | None) -> EngineResponse:
        # The response's own silence watch covers the wait for the head too: no asyncio.timeout (three
        # getpid() calls and a timer each) on the path of every request.
        watch = None if read_timeout_s is None else Silence(conn, read_timeout_s)
        try:
            if watch is not None:
                watch.reading = watch.now()
            try:
                await conn.send(data)
                head = await conn.read_head()
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
        return EngineResponse(self, conn, head, read_timeout_s, watch)
