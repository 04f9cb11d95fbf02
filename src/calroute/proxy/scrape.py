"""A minimal HTTP/1.1 GET over one kept-alive connection, for the proxy's own polling of engines.

The router reads every engine's /metrics 20 times a second. Through aiohttp's client each poll cost the
proxy about 0.4 ms of CPU (6 engines: 0.05 of a core while idle, growing with the engine count); a
request line written once and a response read with three awaits costs a fraction of that. This is
deliberately small: GET only, HTTP/1.1, Content-Length or chunked bodies, no redirects, no compression
(none is asked for). Client traffic never goes through here; it uses aiohttp.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 64 * 1024


class ScrapeError(Exception):
    """The engine could not be reached, or its answer was not HTTP we understand."""


class Scraper:
    """GET one URL, again and again, over a connection kept open between calls."""

    def __init__(self, url: str, headers: Mapping[str, str] | None = None, timeout_s: float = 1.0) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        lines = [f"GET {target} HTTP/1.1", f"Host: {parts.netloc}", "Accept: text/plain"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        self._request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self.timeout_s = timeout_s
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def get(self) -> tuple[int, bytes]:
        """(status, body). Raises ScrapeError (a timeout included); the connection is then dropped."""
        try:
            async with asyncio.timeout(self.timeout_s):
                reused = self._conn is not None
                try:
                    return await self._exchange()
                except (ConnectionError, asyncio.IncompleteReadError):
                    if not reused:
                        raise
                # the engine closed the idle connection we kept: once more, on a fresh one
                self.close()
                return await self._exchange()
        except BaseException as e:
            self.close()
            if isinstance(e, OSError | EOFError | ValueError | IndexError | asyncio.LimitOverrunError):
                raise ScrapeError(f"{type(e).__name__}: {e}") from e
            raise

    def close(self) -> None:
        if self._conn is not None:
            self._conn[1].close()
            self._conn = None

    async def _exchange(self) -> tuple[int, bytes]:
        if self._conn is None:
            self._conn = await asyncio.open_connection(
                self._host, self._port, ssl=self._ssl, limit=MAX_HEAD_BYTES
            )
        reader, writer = self._conn
        writer.write(self._request)
        head = await reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head[:-4].split(b"\r\n")
        version, status = status_line.split(b" ", 2)[:2]
        headers: dict[bytes, bytes] = {}
        for line in header_lines:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        keep_alive = version == b"HTTP/1.1" and headers.get(b"connection", b"").lower() != b"close"
        if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            body = await _read_chunked(reader)
        elif b"content-length" in headers:
            body = await reader.readexactly(int(headers[b"content-length"]))
        else:
            body, keep_alive = await reader.read(), False  # delimited by the close
        if not keep_alive:
            self.close()
        return int(status), body


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size = int((await reader.readuntil(b"\r\n"))[:-2].split(b";", 1)[0], 16)
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":
                pass  # trailers
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)
