"""The proxy's own polling of an engine: GET one URL again and again over a kept-alive connection.

The router reads every engine's /metrics 20 times a second, so a poll must cost little: it goes through
the proxy's own HTTP/1.1 client (client.py), on a connection of its own, apart from client traffic (a
pool shared with a 20 Hz poll never lets the connections of a past burst expire). An answer is read up
to ``max_bytes`` (4 MiB by default, AnswerLimits.max_probe_bytes): an engine that answers without end costs
a failed poll, not the proxy's memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from calroute.errors import CalrouteError
from calroute.proxy.config import ENGINE_KEEPALIVE_S, MAX_PROBE_BYTES
from calroute.proxy.http.answer import UpstreamError
from calroute.proxy.http.client import Endpoint, UnsafeRequest


class ScrapeError(CalrouteError):
    """The engine could not be reached, or its answer was not HTTP we understand (a timeout included)."""


class Scraper:
    """GET one URL, again and again, over a connection kept open between calls."""

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 1.0,
        max_bytes: int = MAX_PROBE_BYTES,
    ) -> None:
        parts = urlsplit(url)
        self._endpoint = Endpoint(f"{parts.scheme}://{parts.netloc}", ENGINE_KEEPALIVE_S)
        self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._headers = {"Accept": "text/plain", **(headers or {})}
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes

    async def get(self) -> tuple[int, bytes]:
        """(status, body). Raises ScrapeError (a timeout, an answer over ``max_bytes`` included); the
        connection is then dropped."""
        try:
            # A bound on the engine's silence, not asyncio.timeout: that costs a timer and three getpid()
            # calls per poll, at 20 polls a second per engine.
            response = await self._endpoint.request(
                "GET", self._target, self._headers, read_timeout_s=self.timeout_s
            )
            async with response:
                return response.status, await response.read(self.max_bytes)
        except (UpstreamError, TimeoutError, UnsafeRequest) as e:
            raise ScrapeError(f"{type(e).__name__}: {e}") from e

    def close(self) -> None:
        self._endpoint.close()
