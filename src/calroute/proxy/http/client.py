"""The proxy's HTTP/1.1 client to its engines: requests over kept-alive connections, on asyncio protocols.

Every client request costs the proxy two engine requests (the prefill, the decode stream), so the client
is small and close to the socket: a request is written in one call, and the answer is parsed by the
connection's httptools parser as it arrives (connection.py); the answer's body is read or relayed by
answer.py's EngineResponse. Deliberately small: HTTP/1.1, bodies by Content-Length, chunked or the
connection's close, no redirects, no compression (none is asked for), no proxies. The /metrics polls use it
too (scrape.py). benchmarks/RESULTS.md has what it saved over aiohttp's client.

Engines are not trusted: their answers are read up to caps (answer.py). What the client writes is checked
too: a request whose method, path or a header carries CR, LF or NUL is refused (UnsafeRequest) before it is
sent, so nothing a client sent can add a line to a request to an engine.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
from collections import deque
from collections.abc import Mapping
from urllib.parse import urlsplit

from calroute.errors import CalrouteError
from calroute.proxy.http.answer import EngineResponse, ProtocolError, UpstreamError
from calroute.proxy.http.connection import ClosedEarly, Connection, Silence
from calroute.proxy.http.framing import FramingError


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
        return EngineResponse(self.give_back, conn, read_timeout_s, watch)
