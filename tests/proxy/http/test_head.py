"""The head meter (a head's size counted as reads arrive, however the head is cut), request headers, and
status lines."""

from __future__ import annotations

import pytest

from calroute.proxy.http.head import MAX_HEAD_BYTES, Headers, HeadMeter, HeadTooLarge, status_line


def measure(reads: list[bytes], heads: list[tuple[int, int]]) -> list[int]:
    """Drive a meter as a parser would: ``heads`` are (start, end) offsets in the joined reads of each
    head, lines of 10 bytes; bytes before the first head are an earlier message's body. The size the meter
    had at each head's end."""
    meter = HeadMeter()
    if heads[0][0]:
        meter.begin()
        meter.end()
    sizes: list[int] = []
    offset = 0
    for data in reads:
        meter.read(data)
        for at in range(offset, offset + len(data)):
            for start, end in heads:
                if at == start:
                    meter.done()
                    meter.begin()
                elif at > start and (at - start) % 10 == 0 and at <= end:
                    meter.line(10)
                if at == end:
                    sizes.append(meter.size)
                    meter.end()
                    meter.done()
        meter.after(data)
        offset += len(data)
    return sizes


def head(size: int) -> bytes:
    return b"x" * (size - 4) + b"\r\n\r\n"


@pytest.mark.parametrize(
    ("reads", "heads", "sizes"),
    [
        ([head(100)], [(0, 99)], [90]),  # lines counted in the read where it began
        ([head(100)[:50], head(100)[50:]], [(0, 99)], [100]),  # then the whole read, then up to the end
        ([head(100)[:50], head(100)[50:98], head(100)[98:] + b"BODY"], [(0, 99)], [100]),
        ([head(100)[:98], head(100)[98:]], [(0, 99)], [100]),  # the blank line cut across reads
        (
            [b"BODY" + head(100)[:40], head(100)[40:]],
            [(4, 103)],
            [90],
        ),  # pipelined: whole lines, then the rest
    ],
)
# The one inexact count: the line cut by the end of a read in which a head began after another message.
def test_the_meter_counts_a_head_however_it_is_cut(
    reads: list[bytes], heads: list[tuple[int, int]], sizes: list[int]
) -> None:
    assert measure(reads, heads) == sizes


@pytest.mark.parametrize("step", [1000, 4096, 65_536, 70_000])
def test_the_meter_stops_a_head_over_the_limit_as_it_arrives(step: int) -> None:
    raw = b"x" * (MAX_HEAD_BYTES + 5_000)  # no end in sight
    meter = HeadMeter()
    taken = 0
    with pytest.raises(HeadTooLarge):
        for i in range(0, len(raw), step):
            data = raw[i : i + step]
            meter.read(data)
            if i == 0:
                meter.begin()
            meter.after(data)
            taken += len(data)
    assert taken <= MAX_HEAD_BYTES + step  # no more than one read past the limit


def test_headers_any_case() -> None:
    h = Headers({"x-tag": "a, b", "authorization": "Bearer t"})
    assert h.get("X-TAG") == "a, b" and "AUTHORIZATION" in h and "authorization" in h
    assert h.get("missing", "d") == "d" and 3 not in h


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
