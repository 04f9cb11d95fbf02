"""Relaying a decode engine's SSE stream to the client, from the engine connection's data callback.

The relay forwards whole network reads (one write per read, not per line) and looks only at what the router
needs (sse.scan): the first content event, the usage event (kept only if the client asked for it), an error.
Every piece, the first included, is written to the client's transport from the event loop's callback, framed
as the response is (chunked for HTTP/1.1, as is for 1.0): no task wakes per event. A client that reads slower
than the engine writes pauses the engine connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from calroute.proxy.engine_client import EngineAnswer
from calroute.proxy.http.framing import chunk
from calroute.proxy.http.sse import scan

CLIENT_BUFFER_BYTES = 256 * 1024  # unsent bytes to a slow client before the engine is paused
CLIENT_CHECK_S = 0.01  # how often a paused relay looks whether the client caught up


class StreamRelay:
    """One stream's relay state: the event cut across reads, the token times, the usage, the error."""

    def __init__(self, keep_usage: bool, now: Callable[[], float], on_first_token: Callable[[float], None]):
        self.keep_usage = keep_usage
        self._now = now
        self._on_first_token = on_first_token
        self.first_token_s: float | None = None
        self.last_token_s: float | None = None
        self.output_tokens: int | None = None
        self.error: str | None = None
        self.client_gone = False
        self.started = False  # a piece has come: from then on a failure is no longer retried elsewhere
        self.pending = b""  # an event cut across reads; what is left at the end goes out as is
        self._transport: asyncio.Transport | None = None
        self._chunked = True
        self._source: EngineAnswer | None = None

    def events(self, piece: bytes) -> bytes:
        """The complete events so far, as the client gets them; the rest waits for the next piece."""
        data = self.pending + piece if self.pending else piece
        cut = data.rfind(b"\n\n") + 2
        if cut < 2:
            self.pending = data
            return b""
        events, self.pending = data[:cut], data[cut:]
        seen = scan(events, self.keep_usage)
        if seen.content:
            now = self._now()
            if self.first_token_s is None:
                self.first_token_s = now
                self._on_first_token(now)
            self.last_token_s = now
        if seen.output_tokens is not None:
            self.output_tokens = seen.output_tokens
        self.error = seen.error or self.error
        return seen.events

    def attach(self, transport: asyncio.Transport, chunked: bool, source: EngineAnswer) -> None:
        """From now on, write to ``transport`` directly (the response head is already out)."""
        self._transport, self._chunked, self._source = transport, chunked, source

    def detach(self) -> None:
        self._source = None

    def piece(self, piece: bytes) -> bool:
        """The data callback: False once the client has gone (the relay stops)."""
        self.started = True
        events = self.events(piece)
        if not events:
            return True
        transport = self._transport
        assert transport is not None and self._source is not None
        if transport.is_closing():
            self.client_gone = True
            return False
        transport.write(chunk(events) if self._chunked else events)
        if transport.get_write_buffer_size() > CLIENT_BUFFER_BYTES:
            self._source.pause_reading()
            asyncio.get_running_loop().call_later(CLIENT_CHECK_S, self._check_client)
        return True

    def _check_client(self) -> None:
        transport, source = self._transport, self._source
        if source is None or transport is None:  # the relay is over
            return
        if transport.is_closing():
            self.client_gone = True
            source.stop()
        elif transport.get_write_buffer_size() <= CLIENT_BUFFER_BYTES // 2:
            source.resume_reading()
        else:
            asyncio.get_running_loop().call_later(CLIENT_CHECK_S, self._check_client)
