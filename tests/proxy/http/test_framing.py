"""The chunked framing the proxy writes (a Stream's, the relay's), read back by httptools."""

from __future__ import annotations

import httptools
import pytest

from calroute.proxy.http.framing import LAST_CHUNK, chunk


class Body:
    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.done = False

    def on_body(self, body: bytes) -> None:
        self.parts.append(body)

    def on_message_complete(self) -> None:
        self.done = True


@pytest.mark.parametrize(
    "pieces",
    [[b"x"], [b"data: 1\n\n", b"data: 2\n\n"], [b"\r\n0\r\n\r\n"], [b"y" * 70_000]],
    ids=["one byte", "two events", "framing-like bytes", "large"],
)
def test_chunks_read_back_as_written(pieces: list[bytes]) -> None:
    body = Body()
    parser = httptools.HttpResponseParser(body)
    parser.feed_data(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    parser.feed_data(b"".join(chunk(p) for p in pieces) + LAST_CHUNK)
    assert b"".join(body.parts) == b"".join(pieces) and body.done


def test_a_chunk_is_its_size_in_hex_then_the_bytes() -> None:
    assert chunk(b"a" * 26) == b"1a\r\n" + b"a" * 26 + b"\r\n"
