"""HTTP/1.1 response framing: heads, and bodies decoded from bytes cut anywhere."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from calroute.proxy.http.framing import (
    BODY_CHUNKED,
    BODY_CLOSE,
    BODY_LENGTH,
    BodyDecoder,
    FramingError,
    ResponseHead,
)

CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(
    ("raw", "status", "body", "length", "keep_alive"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", 200, BODY_LENGTH, 5, True),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: Chunked\r\n\r\n", 200, BODY_CHUNKED, 0, True),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n", 200, BODY_LENGTH, 2, False),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n", 200, BODY_LENGTH, 2, False),
        (b"HTTP/1.1 200 OK\r\n\r\n", 200, BODY_CLOSE, 0, False),
        (b"HTTP/1.1 204 No Content\r\n\r\n", 204, BODY_LENGTH, 0, True),
        (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n", 503, BODY_LENGTH, 0, True),
    ],
)
def test_heads(raw: bytes, status: int, body: int, length: int, keep_alive: bool) -> None:
    head = ResponseHead(raw)
    assert (head.status, head.body, head.length, head.keep_alive) == (status, body, length, keep_alive)


@pytest.mark.parametrize(
    "raw",
    [
        b"garbage\r\n\r\n",
        b"HTTP/1.1 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -3\r\n\r\n",
    ],
)
def test_unreadable_heads_are_framing_errors(raw: bytes) -> None:
    with pytest.raises(FramingError):
        ResponseHead(raw)


def chunked(parts: list[bytes], trailer: bytes = b"") -> bytes:
    return b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in parts if p) + b"0\r\n" + trailer + b"\r\n"


def decode(head: bytes, wire: bytes, cuts: list[int]) -> tuple[bytes, BodyDecoder]:
    decoder = BodyDecoder(ResponseHead(head))
    out: list[bytes] = []
    edges = [0, *sorted(c % (len(wire) + 1) for c in cuts), len(wire)]
    for a, b in zip(edges, edges[1:], strict=False):
        out += decoder.feed(wire[a:b])
    return b"".join(out), decoder


@given(st.lists(st.binary(max_size=40), max_size=6), st.lists(st.integers(0, 10_000), max_size=12))
def test_a_chunked_body_comes_out_whole_however_it_is_cut(parts: list[bytes], cuts: list[int]) -> None:
    body, decoder = decode(CHUNKED, chunked(parts, b"X-Trailer: 1\r\n") + b"NEXT", cuts)
    assert body == b"".join(parts)
    assert decoder.done and decoder.rest == b"NEXT"


@given(st.binary(max_size=60), st.lists(st.integers(0, 10_000), max_size=8))
def test_a_sized_body_ends_at_its_length(payload: bytes, cuts: list[int]) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(payload)
    body, decoder = decode(head, payload + b"!", cuts)
    assert body == payload and decoder.done and decoder.rest == b"!"


def test_a_close_delimited_body_ends_with_the_connection_and_a_cut_chunked_one_does_not() -> None:
    until_close = BodyDecoder(ResponseHead(b"HTTP/1.1 200 OK\r\n\r\n"))
    assert until_close.feed(b"abc") == [b"abc"] and not until_close.done
    assert until_close.end() and until_close.done
    cut = BodyDecoder(ResponseHead(CHUNKED))
    assert cut.feed(b"5\r\nab") == [b"ab"]
    assert not cut.end()


@pytest.mark.parametrize(
    "wire",
    [b"zz\r\n", b"-5\r\nhello\r\n", b"3\r\nabcXY", b"1" * 9000],
    ids=["not hex", "negative", "no CRLF after data", "endless size line"],
)
def test_bad_chunk_framing_is_an_error(wire: bytes) -> None:
    with pytest.raises(FramingError):
        BodyDecoder(ResponseHead(CHUNKED)).feed(wire)
