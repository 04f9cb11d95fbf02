"""HTTP/1.1 framing as pure byte functions: a response's head, and the three ways a body ends.

The proxy's engine client (upstream.py) feeds a BodyDecoder whatever bytes one socket read returned, from a
coroutine or straight from the event loop's data callback (the SSE relay), so the decoder keeps its own
state and never waits. The proxy's server (server.py) reads client request bodies with it too, so chunked
framing is read in one place.
"""

from __future__ import annotations

from typing import Protocol

MAX_LINE_BYTES = 8 * 1024  # a chunk-size or trailer line; far above anything an engine sends
BODY_CLOSE, BODY_LENGTH, BODY_CHUNKED = 0, 1, 2
_SIZE, _DATA, _DATA_END, _TRAILER, _DONE = range(5)


class FramingError(ValueError):
    """The bytes are not HTTP/1.1 framing that the proxy reads."""


class ResponseHead:
    """A response's status line and headers (names lower-cased), and how its body is delimited."""

    __slots__ = ("body", "headers", "keep_alive", "length", "status")

    def __init__(self, raw: bytes) -> None:
        """``raw``: the status line and headers, ending with the blank line. FramingError if unreadable."""
        try:
            status_line, *lines = raw[:-4].split(b"\r\n")
            version, status = status_line.split(b" ", 2)[:2]
            self.status = int(status)
            self.headers: dict[bytes, bytes] = {}
            for line in lines:
                name, _, value = line.partition(b":")
                self.headers[name.strip().lower()] = value.strip()
            self.keep_alive = (
                version == b"HTTP/1.1" and self.headers.get(b"connection", b"").lower() != b"close"
            )
            self.length = 0
            if self.headers.get(b"transfer-encoding", b"").lower() == b"chunked":
                self.body = BODY_CHUNKED
            elif b"content-length" in self.headers:
                self.body, self.length = BODY_LENGTH, int(self.headers[b"content-length"])
                if self.length < 0:
                    raise ValueError(f"negative Content-Length {self.length}")
            elif self.status in (204, 304) or 100 <= self.status < 200:
                self.body = BODY_LENGTH
            else:
                self.body, self.keep_alive = BODY_CLOSE, False
        except (ValueError, IndexError) as e:
            raise FramingError(f"unreadable response head: {e}") from e


class Framing(Protocol):
    """How a body is delimited: a response's ResponseHead, or a request's (server.py)."""

    @property
    def body(self) -> int: ...  # BODY_CLOSE, BODY_LENGTH or BODY_CHUNKED

    @property
    def length(self) -> int: ...  # for BODY_LENGTH


class BodyDecoder:
    """Feed it the bytes that follow a head, in any cuts; it returns the body's pieces as they become
    known. ``done`` once the body has ended; bytes beyond that end are kept in ``rest``."""

    __slots__ = ("_buf", "_chunked", "_left", "_state", "_until_close")

    def __init__(self, head: Framing) -> None:
        self._buf = b""
        self._chunked = head.body == BODY_CHUNKED
        self._until_close = head.body == BODY_CLOSE
        self._left = head.length
        if self._chunked:
            self._state = _SIZE
        else:
            self._state = _DATA if self._left or self._until_close else _DONE

    @property
    def done(self) -> bool:
        return self._state == _DONE

    @property
    def rest(self) -> bytes:
        """What came after the body's end (nothing, unless the engine misframed or pipelined)."""
        return self._buf if self._state == _DONE else b""

    def feed(self, data: bytes) -> list[bytes]:
        if self._state == _DONE:
            self._buf += data
            return []
        if self._until_close:
            return [data] if data else []
        if not self._chunked:
            if len(data) < self._left:
                self._left -= len(data)
                return [data] if data else []
            piece, self._buf = data[: self._left], data[self._left :]
            self._left, self._state = 0, _DONE
            return [piece]
        return self._feed_chunked(self._buf + data if self._buf else data)

    def end(self) -> bool:
        """The connection closed: whether that completes the body (it ends a close-delimited one)."""
        if self._until_close:
            self._state = _DONE
        return self._state == _DONE

    def _feed_chunked(self, buf: bytes) -> list[bytes]:
        out: list[bytes] = []
        i, n = 0, len(buf)
        state, left = self._state, self._left
        while i < n and state != _DONE:
            if state == _DATA:
                take = left if left < n - i else n - i
                out.append(buf[i : i + take])
                i += take
                left -= take
                if not left:
                    state = _DATA_END
            elif state == _DATA_END:
                if n - i < 2:
                    break
                if buf[i : i + 2] != b"\r\n":
                    raise FramingError("chunk data not followed by CRLF")
                i += 2
                state = _SIZE
            else:  # a chunk-size line, or a trailer line
                j = buf.find(b"\r\n", i)
                if j < 0:
                    if n - i > MAX_LINE_BYTES:
                        raise FramingError(f"a chunk line longer than {MAX_LINE_BYTES} bytes")
                    break
                line = buf[i:j]
                i = j + 2
                if state == _TRAILER:
                    if not line:
                        state = _DONE
                    continue
                try:
                    size = int(line.split(b";", 1)[0], 16)
                except ValueError:
                    raise FramingError(f"bad chunk size line {line[:40]!r}") from None
                if size < 0:
                    raise FramingError(f"bad chunk size line {line[:40]!r}")
                if size:
                    state, left = _DATA, size
                else:
                    state = _TRAILER
        self._state, self._left = state, left
        self._buf = buf[i:]
        return out
