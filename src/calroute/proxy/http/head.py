"""What the proxy's server and its engine client share about message heads: the size limits, a meter that
enforces the head limit as bytes arrive, request headers, and a response's status line.

httptools (llhttp) parses the heads but sets no size limit, and httptools keeps a header's name and value
until the line is whole: the meter bounds that. It counts a head's bytes in time linear in the bytes that
arrive. For a head that begins at the start of a read, the whole read while the head is not done; for one
that begins after another message in the same read (pipelining, a 1xx answer), the lines the parser hands
over; for a read that starts inside a head, the bytes up to the blank line that ends it (found by a scan of
that read alone).
"""

from __future__ import annotations

from typing import Any

from calroute.errors import CalrouteError

MAX_HEAD_BYTES = 64 * 1024  # a whole head (request line or status line, headers)
MAX_LINE_BYTES = 8 * 1024  # one line of a request head, as aiohttp and nginx bound it

_REASONS = {
    100: "Continue", 200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
    404: "Not Found", 405: "Method Not Allowed", 413: "Content Too Large", 429: "Too Many Requests",
    431: "Request Header Fields Too Large", 500: "Internal Server Error", 501: "Not Implemented",
    502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout", 505: "HTTP Version Not Supported",
}  # fmt: skip


def status_line(status: int) -> str:
    return f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\n"


class Headers(dict[str, str]):
    """Request headers, names lower-cased; ``get`` and ``in`` take a name in any case."""

    def get(self, name: str, default: Any = None) -> Any:
        return super().get(name.lower(), default)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and super().__contains__(name.lower())


class HeadTooLarge(CalrouteError, ValueError):
    """A head grew past MAX_HEAD_BYTES."""

    def __init__(self) -> None:
        super().__init__(f"head larger than {MAX_HEAD_BYTES} bytes")


class HeadMeter:
    """The size of the head being read, for one connection's parser. The owner calls ``read`` before it
    feeds a read to the parser and ``after`` once the parser has taken it, and from the parser's callbacks
    ``begin`` (a message begins), ``line`` (a line of its head, with its length), ``end`` (the head is
    complete) and ``done`` (the message is complete). Each raises HeadTooLarge once the head is over the
    limit."""

    __slots__ = ("_between", "_counting", "_fresh", "_tail", "_whole", "inside", "size")

    def __init__(self) -> None:
        self.size = 0
        self.inside = False  # between a message's beginning and the end of its head
        self._between = True  # no message under way (before the first, after one is complete)
        self._fresh = False  # the current read started between messages, and no message began in it yet
        self._whole = False  # the head began at the start of the current read
        self._counting = False  # the head began in the current read: its lines count
        self._tail = b""  # the last bytes of the previous read, when it ended inside a head

    def read(self, data: bytes) -> None:
        self._fresh = self._between and not self.inside
        if not self.inside:
            return
        self._counting = self._whole = False
        tail = self._tail
        end = (tail + data[:3]).find(b"\r\n\r\n") if tail else -1
        if end >= 0:
            self.size += end + 4 - len(tail)
        else:
            end = data.find(b"\r\n\r\n")
            self.size += len(data) if end < 0 else end + 4
        self._check()

    def after(self, data: bytes) -> None:
        if not self.inside:
            return
        if self._whole:
            self.size = len(data)
        self._tail = data[-3:]
        self._counting = self._whole = False
        self._check()

    def begin(self) -> None:
        self.size, self.inside, self._between = 0, True, False
        self._whole, self._fresh, self._counting = self._fresh, False, True

    def line(self, n: int) -> None:
        if self._counting:
            self.size += n
            self._check()

    def end(self) -> None:
        self.inside = False
        self._tail = b""

    def done(self) -> None:
        self._between = True

    def _check(self) -> None:
        if self.size > MAX_HEAD_BYTES:
            raise HeadTooLarge()
