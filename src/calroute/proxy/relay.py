"""Relaying a decode engine's SSE stream to the client, from the engine connection's data callback.

The relay forwards whole network reads (one write per read, not per line) and looks only at what the router
needs (sse.scan): the first content event, the usage event (kept only if the client asked for it), an error.
Every piece, the first included, is written to the client's transport from the event loop's callback, framed
as the response is (chunked for HTTP/1.1, as is for 1.0): no task wakes per event. A client that reads slower
than the engine writes pauses the engine connection.

The engine is not trusted with the relay's memory or CPU: an event cut across reads waits as the list of its
pieces (joined once, when its end comes), only each new piece is searched for an event's end, and an event
longer than ``max_event_bytes`` ends the relay with a ProtocolError ("event_too_large"): what waits is never
more than the cap and one read, and the cost is linear in the bytes however the engine splits them. Nor with
the client: bytes that are not SSE events of JSON (sse.well_formed) end the relay with a ProtocolError
("unreadable") before they are sent on, and so does a stream that ends inside an event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from calroute.proxy.config import MAX_EVENT_BYTES
from calroute.proxy.engine_client import EngineAnswer
from calroute.proxy.http.answer import ProtocolError
from calroute.proxy.http.framing import chunk
from calroute.proxy.http.sse import scan, well_formed

CLIENT_BUFFER_BYTES = 256 * 1024  # unsent bytes to a slow client before the engine is paused
CLIENT_CHECK_S = 0.01  # how often a paused relay looks whether the client caught up


class StreamRelay:
    """One stream's relay state: the event cut across reads, the token times, the usage, the error."""

    def __init__(
        self,
        keep_usage: bool,
        now: Callable[[], float],
        on_first_token: Callable[[float], None],
        max_event_bytes: int = MAX_EVENT_BYTES,
    ):
        self.keep_usage = keep_usage
        self.max_event_bytes = max_event_bytes
        self._now = now
        self._on_first_token = on_first_token
        self.first_token_s: float | None = None
        self.last_token_s: float | None = None
        self.output_tokens: int | None = None
        self.usage: dict[str, Any] | None = None  # the usage event's usage object, when one came
        self.error: str | None = None
        self.client_gone = False
        # Events went to the client: from then on a failure is no longer retried elsewhere.
        self.started = False
        # Events came from the engine (sent on or not): it had the request, and had pulled its KV.
        self.heard = False
        # An event cut across reads, as its pieces, and their size.
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._transport: asyncio.Transport | None = None
        self._chunked = True
        self._source: EngineAnswer | None = None

    @property
    def pending(self) -> bytes:
        """What waits for its event's end (left at the end of the stream: an event the engine never ended)."""
        return b"".join(self._pending)

    def drop_pending(self) -> None:
        """The stream broke off: an event it never finished is not sent on."""
        self._pending.clear()
        self._pending_bytes = 0

    def _hold(self, data: bytes) -> None:
        self._pending.append(data)
        self._pending_bytes += len(data)
        if self._pending_bytes > self.max_event_bytes:
            self.drop_pending()
            raise self._too_large()

    def _too_large(self) -> ProtocolError:
        return ProtocolError("event_too_large", f"an SSE event longer than {self.max_event_bytes} bytes")

    def _check_each(self, events: bytes) -> None:
        """Complete events longer in all than the cap (rare: a read is smaller): each one within it."""
        start, limit = 0, self.max_event_bytes
        while start < len(events):
            end = events.find(b"\n\n", start)
            end = len(events) if end < 0 else end
            if end - start > limit:
                raise self._too_large()
            start = end + 2

    def events(self, piece: bytes) -> bytes:
        """The complete events so far, as the client gets them; the rest waits for the next piece.
        ProtocolError: "event_too_large" for an event over the cap, "unreadable" for bytes that are not
        the events of a decode stream (sse.well_formed)."""
        if not piece:
            return b""
        cut = piece.rfind(b"\n\n") + 2  # only the new bytes are searched
        if cut < 2:  # no event ends in this piece, unless its first byte ends one the last piece began
            cut = 1 if piece[0] == 10 and self._pending and self._pending[-1][-1] == 10 else 0
            if not cut:
                self._hold(piece)
                return b""
        if self._pending:
            self._pending.append(piece[:cut])
            events = b"".join(self._pending)
            self.drop_pending()
        else:
            events = piece if cut == len(piece) else piece[:cut]
        if cut < len(piece):
            self._hold(piece[cut:])
        if len(events) > self.max_event_bytes:
            self._check_each(events)
        if not well_formed(events):
            raise ProtocolError("unreadable", f"not an SSE stream of JSON events: {events[:60]!r}")
        seen = scan(events, self.keep_usage)
        if seen.content:
            now = self._now()
            if self.first_token_s is None:
                self.first_token_s = now
                self._on_first_token(now)
            self.last_token_s = now
        if seen.output_tokens is not None:
            self.output_tokens = seen.output_tokens
            self.usage = seen.usage
        self.error = seen.error or self.error
        return seen.events

    def attach(self, transport: asyncio.Transport, chunked: bool, source: EngineAnswer) -> None:
        """From now on, write to ``transport`` directly (the response head is already out)."""
        self._transport, self._chunked, self._source = transport, chunked, source

    def detach(self) -> None:
        self._source = None

    def piece(self, piece: bytes) -> bool:
        """The data callback: False once the client has gone (the relay stops). Raises ProtocolError for an
        event over the cap (the relay ends with it)."""
        events = self.events(piece)
        if not events:
            return True
        self.heard = True
        transport = self._transport
        assert transport is not None and self._source is not None
        if transport.is_closing():
            self.client_gone = True
            return False
        transport.write(chunk(events) if self._chunked else events)
        self.started = True
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
