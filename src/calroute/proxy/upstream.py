"""The proxy's HTTP/1.1 client to its engines: requests over kept-alive connections, on asyncio streams.

Every client request costs the proxy two engine requests (the prefill, the decode stream). Through aiohttp's
client those two were the largest part of the proxy's CPU per request (benchmarks/RESULTS.md); this writes
a request in one call and reads the answer with a few awaits that do not suspend when the bytes are
already there. Deliberately small: HTTP/1.1, Content-Length, chunked or close-delimited bodies, no
redirects, no compression (none is asked for), no proxies. The /metrics polls use it too (scrape.py).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 64 * 1024
_BODY_CLOSE, _BODY_LENGTH, _BODY_CHUNKED = 0, 1, 2

Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class UpstreamError(Exception):
    """The engine could not be reached, broke the exchange off, or answered with HTTP we do not read."""


class Head:
    """A response's status line and headers (names lower-cased), and how its body is delimited."""

    __slots__ = ("body", "headers", "keep_alive", "length", "status")

    def __init__(self, raw: bytes) -> None:
        status_line, *lines = raw[:-4].split(b"\r\n")
        version, status = status_line.split(b" ", 2)[:2]
        self.status = int(status)
        self.headers: dict[bytes, bytes] = {}
        for line in lines:
            name, _, value = line.partition(b":")
            self.headers[name.strip().lower()] = value.strip()
        self.keep_alive = version == b"HTTP/1.1" and self.headers.get(b"connection", b"").lower() != b"close"
        self.length = 0
        if self.headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            self.body = _BODY_CHUNKED
        elif b"content-length" in self.headers:
            self.body, self.length = _BODY_LENGTH, int(self.headers[b"content-length"])
        elif self.status in (204, 304) or 100 <= self.status < 200:
            self.body = _BODY_LENGTH
        else:
            self.body, self.keep_alive = _BODY_CLOSE, False


async def read_head(reader: asyncio.StreamReader) -> Head:
    return Head(await reader.readuntil(b"\r\n\r\n"))


async def body_parts(reader: asyncio.StreamReader, head: Head) -> AsyncIterator[bytes]:
    """The body, a piece at a time as it arrives (a chunk, or what one read returned)."""
    if head.body == _BODY_LENGTH:
        if head.length:
            yield await reader.readexactly(head.length)
    elif head.body == _BODY_CHUNKED:
        while True:
            size = int((await reader.readuntil(b"\r\n"))[:-2].split(b";", 1)[0], 16)
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass  # trailers
                return
            part = await reader.readexactly(size + 2)
            yield part[:-2]
    else:
        while part := await reader.read(65536):
            yield part


async def read_body(reader: asyncio.StreamReader, head: Head) -> bytes:
    return b"".join([part async for part in body_parts(reader, head)])


# What a broken exchange raises from asyncio streams. TimeoutError is an OSError too: every handler lets it
# through first, since a silent engine and a broken one are told apart by the callers.
TRANSPORT_ERRORS = (OSError, EOFError, ValueError, IndexError, asyncio.LimitOverrunError)


class Response:
    """An engine's answer, read within ``async with``: leaving the block returns the connection to its
    endpoint when the body was read to the end and the engine keeps it alive, and closes it otherwise."""

    def __init__(
        self, endpoint: Endpoint, conn: Connection, head: Head, read_timeout_s: float | None
    ) -> None:
        self.status = head.status
        self.head = head
        self._endpoint = endpoint
        self._conn: Connection | None = conn
        self._read_timeout_s = read_timeout_s
        self._complete = False

    async def __aenter__(self) -> Response:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._conn is not None:
            if self._complete and self.head.keep_alive and exc_type is None:
                self._endpoint.give_back(self._conn)
            else:
                self._conn[1].close()
            self._conn = None

    async def read(self) -> bytes:
        return b"".join([part async for part in self.parts()])

    async def parts(self) -> AsyncIterator[bytes]:
        """The body's pieces as they come; UpstreamError when the engine breaks off, TimeoutError when it
        stays silent for longer than the read timeout."""
        assert self._conn is not None, "the response was closed"
        pieces = body_parts(self._conn[0], self.head).__aiter__()
        watch = None if self._read_timeout_s is None else _Silence(self._conn[1], self._read_timeout_s)
        try:
            while True:
                if watch is not None:
                    watch.reading = asyncio.get_running_loop().time()
                try:
                    part = await pieces.__anext__()
                except StopAsyncIteration:
                    if watch is not None and watch.fired:  # a close-delimited body cut off by the watch
                        raise TimeoutError(f"the engine was silent for {self._read_timeout_s:g} s") from None
                    self._complete = True
                    return
                except TRANSPORT_ERRORS as e:
                    if watch is not None and watch.fired:
                        raise TimeoutError(f"the engine was silent for {self._read_timeout_s:g} s") from e
                    raise UpstreamError(f"{type(e).__name__}: {e}") from e
                if watch is not None:
                    watch.reading = None
                yield part
        finally:
            if watch is not None:
                watch.cancel()


class _Silence:
    """Aborts a connection whose engine stays silent for ``timeout_s`` while a read waits. One timer per
    response, moved only when it fires: a timeout per read (asyncio.timeout) cost about 5 % of the proxy's
    CPU, one per SSE event."""

    def __init__(self, writer: asyncio.StreamWriter, timeout_s: float) -> None:
        self._writer = writer
        self._timeout_s = timeout_s
        self._loop = asyncio.get_running_loop()
        self.reading: float | None = None  # when the pending read began; None between reads
        self.fired = False
        self._timer = self._loop.call_later(timeout_s, self._check)

    def _check(self) -> None:
        now = self._loop.time()
        if self.reading is None or now - self.reading < self._timeout_s:
            due = now + self._timeout_s if self.reading is None else self.reading + self._timeout_s
            self._timer = self._loop.call_at(due, self._check)
            return
        self.fired = True
        self._writer.transport.abort()

    def cancel(self) -> None:
        self._timer.cancel()


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
            self._idle.pop()[1][1].close()

    def _expire(self) -> None:
        # Close expired connections even when no request comes to reuse one: the engine would close them
        # soon, and a socket it closed stays in CLOSE_WAIT on our side until we close it too.
        self._expiry = None
        now = time.monotonic()
        while self._idle and now - self._idle[0][0] >= self.keepalive_s:
            self._idle.popleft()[1][1].close()
        if self._idle:
            wait_s = self._idle[0][0] + self.keepalive_s - now
            self._expiry = asyncio.get_running_loop().call_later(wait_s, self._expire)

    def _take_idle(self) -> Connection | None:
        now = time.monotonic()
        while self._idle:
            since, conn = self._idle.pop()
            if now - since < self.keepalive_s and not conn[1].is_closing() and not conn[0].at_eof():
                return conn
            conn[1].close()
        return None

    async def _connect(self) -> Connection:
        return await asyncio.open_connection(self.host, self.port, ssl=self._ssl, limit=MAX_HEAD_BYTES)

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
    ) -> Response:
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
            except (ConnectionError, asyncio.IncompleteReadError) as e:
                if isinstance(e, asyncio.IncompleteReadError) and e.partial:
                    raise UpstreamError(f"{type(e).__name__}: {e}") from e
            except TRANSPORT_ERRORS as e:
                raise UpstreamError(f"{type(e).__name__}: {e}") from e
        try:
            async with asyncio.timeout(read_timeout_s):
                conn = await self._connect()
            return await self._exchange(conn, data, read_timeout_s)
        except TimeoutError:
            raise
        except TRANSPORT_ERRORS as e:
            raise UpstreamError(f"{type(e).__name__}: {e}") from e

    async def _exchange(self, conn: Connection, data: bytes, read_timeout_s: float | None) -> Response:
        reader, writer = conn
        try:
            writer.write(data)
            async with asyncio.timeout(read_timeout_s):
                if writer.transport.get_write_buffer_size() > MAX_HEAD_BYTES:
                    await writer.drain()  # a long prompt: let the socket take it
                head = await read_head(reader)
        except BaseException:
            writer.close()
            raise
        return Response(self, conn, head, read_timeout_s)
