"""The SSE relay's client side: what reaches the client, when the router hears of the first token, and how
a slow or departed client is handled. A fake transport stands in for the client's socket."""

from __future__ import annotations

import asyncio
import time
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calroute.proxy import relay as relay_module
from calroute.proxy.http.answer import EngineResponse, ProtocolError
from calroute.proxy.http.sse import well_formed
from calroute.proxy.relay import StreamRelay

ROLE = b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n'
TOKEN = b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'
USAGE = b'data: {"choices":[],"usage":{"completion_tokens":2}}\n\n'
DONE = b"data: [DONE]\n\n"


class Client:
    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.closing = False
        self.buffered = 0

    def write(self, data: bytes) -> None:
        self.sent.append(data)

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return self.buffered


class Source:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def pause_reading(self) -> None:
        self.calls.append("pause")

    def resume_reading(self) -> None:
        self.calls.append("resume")

    def stop(self) -> None:
        self.calls.append("stop")


def make(keep_usage: bool, chunked: bool = True) -> tuple[StreamRelay, Client, Source, list[float]]:
    firsts: list[float] = []
    clock = iter(range(1, 100))
    relay = StreamRelay(keep_usage, lambda: float(next(clock)), firsts.append)
    client, source = Client(), Source()
    relay.attach(cast(asyncio.Transport, client), chunked, cast(EngineResponse, source))
    return relay, client, source, firsts


def test_events_cut_across_pieces_go_out_whole_and_framed() -> None:
    relay, client, _, firsts = make(keep_usage=False)
    stream = ROLE + TOKEN + TOKEN + USAGE + DONE
    for cut in (5, 50, 51, 120, len(stream) - 3):
        assert relay.piece(stream[:cut])
        stream = stream[cut:]
    assert relay.piece(stream)
    sent = b"".join(client.sent)
    body = b""
    while sent:  # undo the chunked framing
        size, _, sent = sent.partition(b"\r\n")
        body, sent = body + sent[: int(size, 16)], sent[int(size, 16) + 2 :]
    assert body == ROLE + TOKEN + TOKEN + DONE  # usage dropped: the client did not ask for it
    assert relay.output_tokens == 2 and relay.error is None
    assert firsts == [relay.first_token_s] and relay.last_token_s is not None
    assert relay.last_token_s > relay.first_token_s  # type: ignore[operator]


def test_unchunked_responses_get_the_bytes_as_they_are_and_usage_is_kept_when_asked() -> None:
    relay, client, _, _ = make(keep_usage=True, chunked=False)
    assert relay.piece(TOKEN + USAGE)
    assert client.sent == [TOKEN + USAGE]


def test_a_departed_client_stops_the_relay() -> None:
    relay, client, _, _ = make(keep_usage=False)
    client.closing = True
    assert not relay.piece(TOKEN)
    assert relay.client_gone and client.sent == []


def test_a_slow_client_pauses_the_engine_until_it_catches_up() -> None:
    async def go() -> list[str]:
        relay, client, source, _ = make(keep_usage=False)
        client.buffered = relay_module.CLIENT_BUFFER_BYTES + 1
        assert relay.piece(TOKEN)
        assert source.calls == ["pause"]
        await asyncio.sleep(3 * relay_module.CLIENT_CHECK_S)
        assert source.calls == ["pause"]  # still full
        client.buffered = 0
        await asyncio.sleep(3 * relay_module.CLIENT_CHECK_S)
        return source.calls

    assert asyncio.run(go()) == ["pause", "resume"]


def test_a_paused_relay_whose_client_leaves_is_stopped() -> None:
    async def go() -> tuple[list[str], bool]:
        relay, client, source, _ = make(keep_usage=False)
        client.buffered = relay_module.CLIENT_BUFFER_BYTES + 1
        relay.piece(TOKEN)
        client.closing = True
        await asyncio.sleep(3 * relay_module.CLIENT_CHECK_S)
        return source.calls, relay.client_gone

    assert asyncio.run(go()) == (["pause", "stop"], True)


STREAM = ROLE + TOKEN + TOKEN + USAGE + DONE


def unchunk(sent: list[bytes]) -> bytes:
    data, body = b"".join(sent), b""
    while data:
        size, _, data = data.partition(b"\r\n")
        body, data = body + data[: int(size, 16)], data[int(size, 16) + 2 :]
    return body


@pytest.mark.parametrize("cut", range(1, len(STREAM)))
def test_an_event_end_split_anywhere_across_two_pieces_is_found(cut: int) -> None:
    """Each piece alone is searched for an event's end: one whose blank line is split between two pieces
    (the "\\n" | "\\n" cut) is found all the same."""
    relay, client, _, _ = make(keep_usage=True)
    assert relay.piece(STREAM[:cut]) and relay.piece(STREAM[cut:])
    assert unchunk(client.sent) == STREAM and relay.pending == b""


def test_events_fed_a_byte_at_a_time_go_out_whole() -> None:
    relay, client, _, _ = make(keep_usage=True)
    for i in range(len(STREAM)):
        assert relay.piece(STREAM[i : i + 1])
    assert unchunk(client.sent) == STREAM
    assert all(part.endswith(b"\n\n\r\n") for part in client.sent)  # whole events only


CAP = 64 * 1024
OVER_CAP = [
    # (pieces, what went out before the failure)
    pytest.param([b"data: " + b"x" * CAP], b"", id="one-piece-no-end"),
    pytest.param([b"data: " + b"x" * (CAP // 2)] * 3, b"", id="pieces-no-end"),
    pytest.param([TOKEN, b"data: " + b"x" * CAP], TOKEN, id="after-a-token"),
    pytest.param([TOKEN + b"data: " + b"x" * CAP + b"\n\n"], b"", id="a-whole-event-over-the-cap"),
    pytest.param([b"data: " + b"x" * (CAP - 10), b"x" * 20 + b"\n\n"], b"", id="its-end-comes-too-late"),
]


@pytest.mark.parametrize(("pieces", "before"), OVER_CAP)
def test_an_event_over_its_cap_ends_the_relay_with_a_protocol_error(
    pieces: list[bytes], before: bytes
) -> None:
    relay, client, _, _ = make(keep_usage=True)
    relay.max_event_bytes = CAP
    with pytest.raises(ProtocolError, match=f"longer than {CAP} bytes") as raised:
        for piece in pieces:
            relay.piece(piece)
    assert raised.value.kind == "event_too_large"
    assert unchunk(client.sent) == before
    relay.drop_pending()
    assert relay.pending == b""


def test_a_40_mib_event_without_end_costs_linear_time() -> None:
    """Its pieces wait as a list, each searched once: 40 MiB in 64 KiB reads takes milliseconds (copying a
    growing buffer on every read took 18 s)."""
    relay, client, _, _ = make(keep_usage=True)
    relay.max_event_bytes = 64 * 1024 * 1024
    piece = b"x" * (64 * 1024)
    started = time.process_time()
    assert relay.piece(b'data: {"pad":"')
    for _ in range(640):
        assert relay.piece(piece)
    assert client.sent == []
    assert relay.piece(b'"}\n\n')
    took_s = time.process_time() - started
    assert len(unchunk(client.sent)) == 14 + 640 * len(piece) + 4
    assert took_s < 2.0, took_s


# Pieces an engine may send: good events, and bytes that are none (HTML, bare data, lone line breaks, NUL).
_PIECES = st.lists(
    st.one_of(
        st.sampled_from(
            [ROLE, TOKEN, USAGE, DONE, b": ping\n\n", b"<html>", b"\n", b"\n\n", b"data: ", b"{}"]
        ),
        st.binary(max_size=40),
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(pieces=_PIECES, cuts=st.lists(st.integers(1, 30), max_size=12))
def test_whatever_an_engine_sends_the_client_gets_only_sse_events_of_json(
    pieces: list[bytes], cuts: list[int]
) -> None:
    """Fuzzed engine bytes, cut anywhere: the relay either stops with a ProtocolError or hands on well-formed
    events, and what it held back at the end is never sent (the stream then broke off, generate.py)."""
    stream = b"".join(pieces)
    relay, client, _, _ = make(keep_usage=True, chunked=False)
    at = 0
    try:
        for n in [*cuts, len(stream)]:
            relay.piece(stream[at : at + n])
            at += n
    except ProtocolError as e:
        assert e.kind == "unreadable"
    sent = b"".join(client.sent)
    assert well_formed(sent) or sent == b"", sent
