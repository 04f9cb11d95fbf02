"""What a handler of the proxy's server gets and gives: the request (read whole), a whole answer, or a
stream whose head goes out at once; and OpenAI's error object, written in one place."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from calroute.proxy.http.framing import LAST_CHUNK, chunk
from calroute.proxy.http.head import Headers, status_line

STREAM_HIGH_WATER_BYTES = 256 * 1024  # a Stream.write waits while more than this is unsent


class ClientConnection(Protocol):
    """The server's side of one client connection, as a streamed answer writes to it (server.py)."""

    transport: asyncio.Transport | None
    http11: bool
    keep_alive: bool
    started: bool

    def common_headers(self) -> str: ...

    async def drain(self) -> None: ...


def json_error(
    status: int, message: str, kind: str = "BadRequestError", param: str | None = None
) -> Response:
    """An error answer in OpenAI's shape, as vLLM answers."""
    return Response(error_body(status, message, kind, param), status)


def error_body(status: int, message: str, kind: str = "BadRequestError", param: str | None = None) -> bytes:
    """OpenAI's error object, the one place the proxy writes it (answers and stream error events)."""
    return json.dumps({"error": {"message": message, "type": kind, "param": param, "code": status}}).encode()


class Request:
    """One request, whole: its body has been read before the handler runs."""

    __slots__ = ("_conn", "body", "headers", "http11", "keep_alive", "method", "path", "query")

    def __init__(
        self,
        conn: ClientConnection,
        method: str,
        target: str,
        headers: Headers,
        body: bytes,
        http11: bool = True,
        keep_alive: bool = True,
    ) -> None:
        self._conn = conn
        self.method = method
        self.path, _, self.query = target.partition("?")
        self.headers = headers
        self.body = body
        self.http11 = http11
        self.keep_alive = keep_alive  # what the client asked for

    def stream(self, status: int = 200, headers: Mapping[str, str] | None = None) -> Stream:
        """Start a streamed answer: its head goes out at once. Raises ConnectionResetError if the client
        has gone."""
        return Stream(self._conn, status, headers or {})


class Response:
    """A whole answer."""

    __slots__ = ("body", "content_type", "headers", "status")

    def __init__(
        self,
        body: bytes,
        status: int = 200,
        content_type: str = "application/json",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.body, self.status, self.content_type = body, status, content_type
        self.headers: Mapping[str, str] = headers or {}


def json_response(value: Any, status: int = 200) -> Response:
    return Response(json.dumps(value).encode(), status)


class Stream:
    """A streamed answer: chunked for HTTP/1.1, delimited by the connection's close for 1.0. The relay may
    write to ``transport`` directly (framed as ``chunked`` says) from a data callback."""

    __slots__ = ("_conn", "chunked", "ended", "transport")

    def __init__(self, conn: ClientConnection, status: int, headers: Mapping[str, str]) -> None:
        if conn.transport is None or conn.transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        self._conn = conn
        self.transport: asyncio.Transport = conn.transport
        self.chunked = conn.http11
        self.ended = False
        if not self.chunked:
            conn.keep_alive = False
        framing = "Transfer-Encoding: chunked" if self.chunked else "Connection: close"
        if self.chunked and not conn.keep_alive:
            framing += "\r\nConnection: close"
        lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        conn.started = True
        self.transport.write(f"{status_line(status)}{conn.common_headers()}{lines}{framing}\r\n\r\n".encode())

    async def write(self, data: bytes) -> None:
        """Raises ConnectionResetError if the client has gone."""
        if not data:
            return
        if self.transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        self.transport.write(chunk(data) if self.chunked else data)
        if self.transport.get_write_buffer_size() > STREAM_HIGH_WATER_BYTES:
            await self._conn.drain()

    async def write_eof(self) -> None:
        if self.ended:
            return
        self.ended = True
        if self.transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        if self.chunked:
            self.transport.write(LAST_CHUNK)


Handler = Callable[[Request], Awaitable[Response | Stream]]
