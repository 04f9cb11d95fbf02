"""The request-head parser, without a socket: what it reads, and the status it refuses with."""

from __future__ import annotations

import pytest

from calroute.proxy.http.framing import BODY_CHUNKED, BODY_LENGTH
from calroute.proxy.http.head import Headers, RequestHead, status_line

MAX_BODY = 1000


@pytest.mark.parametrize(
    ("raw", "method", "path", "http11", "keep_alive", "body", "length", "expect_continue"),
    [
        (b"GET /v1/models HTTP/1.1", "GET", "/v1/models", True, True, BODY_LENGTH, 0, False),
        (b"GET / HTTP/1.1\r\nConnection: close", "GET", "/", True, False, BODY_LENGTH, 0, False),
        (b"GET / HTTP/1.0", "GET", "/", False, False, BODY_LENGTH, 0, False),
        (b"GET / HTTP/1.0\r\nConnection: Keep-Alive", "GET", "/", False, True, BODY_LENGTH, 0, False),
        (b"POST /x?a=1 HTTP/1.1\r\nContent-Length: 12", "POST", "/x?a=1", True, True, BODY_LENGTH, 12, False),
        (b"POST /x HTTP/1.1\r\nTransfer-Encoding: Chunked", "POST", "/x", True, True, BODY_CHUNKED, 0, False),
        (
            b"POST /x HTTP/1.1\r\ncontent-length: 5\r\nExpect: 100-Continue",
            "POST", "/x", True, True, BODY_LENGTH, 5, True,
        ),
        # The same length twice is one length, not an ambiguity.
        (
            b"POST /x HTTP/1.1\r\nContent-Length: 7\r\nContent-Length: 7",
            "POST", "/x", True, True, BODY_LENGTH, 7, False,
        ),
    ],
)  # fmt: skip
def test_reads_a_head(
    raw: bytes,
    method: str,
    path: str,
    http11: bool,
    keep_alive: bool,
    body: object,
    length: int,
    expect_continue: bool,
) -> None:
    h = RequestHead(raw, MAX_BODY)
    assert (h.method, h.target, h.http11, h.keep_alive) == (method, path, http11, keep_alive)
    assert (h.body, h.length, h.expect_continue) == (body, length, expect_continue)


@pytest.mark.parametrize(
    ("raw", "status", "says"),
    [
        (b"GET /", 400, "malformed request line"),
        (b"GET v1 HTTP/1.1", 400, "malformed request line"),
        (b"G3T / HTTP/1.1", 400, "malformed request line"),
        (b"GET / HTTP/2.0", 505, "unsupported version"),
        (b"GET / HTTP/1.1\r\nNoColon", 400, "malformed header line"),
        (b"GET / HTTP/1.1\r\n Folded: x", 400, "malformed header line"),
        (b"GET / HTTP/1.1\r\nBad Name: x", 400, "malformed header line"),
        (b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked", 400, "both"),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip", 501, "unsupported Transfer-Encoding"),
        (b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4", 400, "bad Content-Length"),
        (b"POST / HTTP/1.1\r\nContent-Length: -1", 400, "bad Content-Length"),
        (b"POST / HTTP/1.1\r\nContent-Length: 1001", 413, "larger than 1000 bytes"),
        (b"GET / HTTP/1.1\r\nX: " + b"a" * 8200, 431, "longer than 8192"),
    ],
)
def test_refuses_a_head(raw: bytes, status: int, says: str) -> None:
    with pytest.raises(ValueError) as info:
        RequestHead(raw, MAX_BODY)
    message, got = info.value.args
    assert got == status and says in message


def test_headers_any_case_and_repeats_joined() -> None:
    h = RequestHead(b"GET / HTTP/1.1\r\nX-Tag: a\r\nx-tag: b\r\nAuthorization: Bearer t", MAX_BODY)
    assert isinstance(h.headers, Headers)
    assert h.headers.get("X-TAG") == "a, b" and "authorization" in h.headers and "AUTHORIZATION" in h.headers
    assert h.headers.get("missing", "d") == "d" and 3 not in h.headers


@pytest.mark.parametrize(
    ("status", "line"),
    [
        (200, "HTTP/1.1 200 OK\r\n"),
        (413, "HTTP/1.1 413 Content Too Large\r\n"),
        (299, "HTTP/1.1 299 Unknown\r\n"),
    ],
)
def test_status_line(status: int, line: str) -> None:
    assert status_line(status) == line
