"""A request head, parsed (what the proxy's server accepts and refuses), and a response's status line."""

from __future__ import annotations

from typing import Any

from calroute.proxy.http.framing import BODY_CHUNKED, BODY_LENGTH

MAX_LINE_BYTES = 8 * 1024  # one line of a head, as aiohttp and nginx bound it

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


class RequestHead:
    """A request head, parsed; ValueError (with the answer's status in ``args[1]``) if it is not one."""

    __slots__ = ("body", "expect_continue", "headers", "http11", "keep_alive", "length", "method", "target")

    def __init__(self, raw: bytes, max_body_bytes: int) -> None:
        lines = raw.decode("latin-1").split("\r\n")
        if max(map(len, lines)) > MAX_LINE_BYTES:
            raise ValueError(f"a request head line longer than {MAX_LINE_BYTES} bytes", 431)
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[0].isalpha() or not parts[1].startswith("/"):
            raise ValueError(f"malformed request line {lines[0][:80]!r}", 400)
        self.method, self.target, version = parts
        if version not in ("HTTP/1.1", "HTTP/1.0"):
            raise ValueError(f"unsupported version {version[:20]!r}", 505)
        self.http11 = version == "HTTP/1.1"
        headers = Headers()
        lengths: set[str] = set()
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon or not name or name != name.strip() or " " in name:
                raise ValueError(f"malformed header line {line[:80]!r}", 400)
            key, value = name.lower(), value.strip(" \t")
            if key == "content-length":
                lengths.add(value)
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        self.headers = headers
        connection = headers.get("connection", "").lower()
        self.keep_alive = "close" not in connection if self.http11 else "keep-alive" in connection
        self.expect_continue = headers.get("expect", "").lower() == "100-continue"
        coding = headers.get("transfer-encoding")
        self.length = 0
        if coding is not None:
            if lengths:
                raise ValueError("both Content-Length and Transfer-Encoding", 400)
            if coding.lower() != "chunked":
                raise ValueError(f"unsupported Transfer-Encoding {coding[:40]!r}", 501)
            self.body = BODY_CHUNKED
        else:
            if len(lengths) > 1 or any(not v.isdigit() for v in lengths):
                raise ValueError(f"bad Content-Length {', '.join(lengths)[:40]!r}", 400)
            self.body, self.length = BODY_LENGTH, int(lengths.pop()) if lengths else 0
            if self.length > max_body_bytes:
                raise ValueError(f"request body larger than {max_body_bytes} bytes", 413)
