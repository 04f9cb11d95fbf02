"""What generation needs from an engine connection, as a Protocol: send a request to an engine, and get an
answer to read whole, piece by piece, or relay from a callback.

The proxy's own HTTP/1.1 client (http/client.py Endpoint, http/answer.py EngineResponse) is the
implementation that serves; tests put in-memory fake engines behind the same protocol (tests/proxy/fakes.py),
so that the decisions, the handoff, retries and failover can be tested without engine processes or sockets.

Failures, as the real client reports them: UpstreamError when the engine cannot be reached or breaks the
exchange off, and its ProtocolError when the answer is not HTTP the client reads or is over its cap;
TimeoutError when it stays silent for longer than ``read_timeout_s`` (before its head, or between two
pieces of its body).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from types import TracebackType
from typing import Protocol, Self

from calroute.proxy.http.answer import ProtocolError, UpstreamError
from calroute.proxy.http.client import UnsafeRequest

__all__ = ["EngineAnswer", "EngineClient", "ProtocolError", "UnsafeRequest", "UpstreamError"]


class EngineAnswer(Protocol):
    """An engine's answer (its head has come), read within ``async with``: leaving the block releases the
    connection. The body comes either to a coroutine (next_part, parts, read) or, from some point on, to a
    callback (relay), which the consumer can pause, resume or stop."""

    @property
    def status(self) -> int: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...

    async def next_part(self) -> bytes | None:
        """The body's next piece as it arrives; None after its end."""
        ...

    def parts(self) -> AsyncIterator[bytes]: ...

    async def read(self, max_bytes: int | None = None) -> bytes:
        """The body whole; ProtocolError ("too_large") once it is over ``max_bytes``."""
        ...

    def relay(self, on_part: Callable[[bytes], bool]) -> Awaitable[bool]:
        """Hand the rest of the body to ``on_part`` as it arrives (from the event loop's data callback for
        the real client); ``on_part`` returns False to stop early. Resolves True once the body has ended,
        False when stopped, or raises what broke it off."""
        ...

    def stop(self) -> None:
        """End a relay early: its awaitable resolves False."""
        ...

    def pause_reading(self) -> None:
        """The consumer cannot take more for now (a slow client): hold the body back."""
        ...

    def resume_reading(self) -> None: ...


class EngineClient(Protocol):
    """One engine, as generation talks to it."""

    async def request(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes | None = None,
        read_timeout_s: float | None = None,
    ) -> EngineAnswer:
        """Send the request and wait for the answer's head. UnsafeRequest, before anything is sent, when the
        method, path or a header would carry CR, LF or NUL (http/client.py's check_head)."""
        ...

    def close(self) -> None:
        """Release what the client keeps between requests (the proxy calls it when it stops)."""
        ...
