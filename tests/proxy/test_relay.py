"""The SSE relay's client side: what reaches the client, when the router hears of the first token, and how
a slow or departed client is handled. A fake transport stands in for the client's socket."""

from __future__ import annotations

import asyncio
from typing import cast

from calroute.proxy import relay as relay_module
from calroute.proxy.http.client import EngineResponse
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
