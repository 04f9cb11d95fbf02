"""The faults an emulated engine shows on demand (emulator/faults.py, POST /_calroute/faults): errors, stalls,
/metrics down, slowdown, a crash, and the bad_answer fault's bytes on the wire."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from calroute.emulator.group import RunningEngine
from calroute.types import Role
from tests.emulator.emulated import body, run_group, timed_stream

# ---- errors, stalls, /metrics down, slowdown, a crash ----------------------------------------------------


def test_error_rate_stall_metrics_down_and_slowdown() -> None:
    async def test(engines: list[RunningEngine], s: aiohttp.ClientSession) -> None:
        (d,) = engines
        url = f"{d.url}/v1/completions"
        await s.post(f"{d.url}/_calroute/faults", json={"error_rate": 1.0})
        async with s.post(url, json=body(10, 2)) as r:
            assert r.status == 500 and "injected" in (await r.json())["error"]["message"]
        await s.post(f"{d.url}/_calroute/faults", json={"error_rate": 0.0, "stall": True})
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(s.post(url, json=body(10, 2)), timeout=0.5)
        async with s.post(url, json=body(10, 2, stream=True)) as r:  # a stream: the head, then nothing
            assert r.status == 200
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(r.content.read(1), timeout=0.5)
        await s.post(f"{d.url}/_calroute/faults", json={"stall": False, "metrics_down": True})
        async with s.get(f"{d.url}/metrics") as r:
            assert r.status == 503
        async with s.post(url, json=body(10, 2)) as r:
            assert r.status == 200
        _, normal = await timed_stream(s, d.url, body(100, 12))
        await s.post(f"{d.url}/_calroute/faults", json={"slowdown": 3.0})
        _, slow = await timed_stream(s, d.url, body(100, 12))
        ratio = (slow[-1] - slow[0]) / (normal[-1] - normal[0])
        assert 2.5 < ratio < 3.5
        async with s.post(f"{d.url}/_calroute/faults", json={"slowdown": 0.5}) as r:
            assert r.status == 400

    run_group(test, roles=(Role.DECODE,))


def test_crash_closes_the_port_and_cuts_open_requests() -> None:
    async def test(engines: list[RunningEngine], s: aiohttp.ClientSession) -> None:
        (d,) = engines
        pending = asyncio.ensure_future(s.post(f"{d.url}/v1/completions", json=body(10, 500)))
        await asyncio.sleep(0.1)
        await s.post(f"{d.url}/_calroute/faults", json={"crash": True})
        with pytest.raises(aiohttp.ClientError):
            r = await pending
            await r.read()
        await asyncio.sleep(0.1)
        with pytest.raises(aiohttp.ClientConnectionError):
            await s.get(f"{d.url}/health")

    run_group(test, roles=(Role.DECODE,))


# ---- the bad_answer fault: what goes out on the socket ------------------------------------------------


async def raw_post(url: str, path: str, payload: dict[str, Any]) -> tuple[bytes, bytes]:
    """(response head, body bytes as they came on the wire, to the close): no HTTP client in between."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    data = json.dumps(payload).encode()
    writer.write(
        b"POST %s HTTP/1.1\r\nHost: e\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
        b"Connection: close\r\n\r\n%s" % (path.encode(), len(data), data)
    )
    raw = await reader.read()  # to the close
    writer.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    return head, rest


def dechunk(raw: bytes) -> tuple[bytes, bool]:
    """(the chunked body's data, whether it ended with its last chunk); ValueError for a bad size line."""
    out, at = bytearray(), 0
    while at < len(raw):
        end = raw.index(b"\r\n", at)
        size = int(raw[at:end], 16)
        if size == 0:
            return bytes(out), True
        out += raw[end + 2 : end + 2 + size]
        at = end + 4 + size
    return bytes(out), False


def _oversized_json(head: bytes, rest: bytes) -> None:
    assert b"content-length: 33554432" in head.lower()
    assert len(rest) == 32 * 1024 * 1024 and rest.startswith(b'{"') and rest.endswith(b'"}')


def _oversized_event(head: bytes, rest: bytes) -> None:
    assert b"transfer-encoding: chunked" in head.lower() and b"text/event-stream" in head
    data, ended = dechunk(rest)
    assert ended and data.startswith(b"data: ") and len(data) == 6 + 4 * 1024 * 1024 and b"\n" not in data


def _malformed_chunks(head: bytes, rest: bytes) -> None:
    assert b"transfer-encoding: chunked" in head.lower()
    assert rest.startswith(b"zz\r\n")  # the first chunk size is no hex number, then the close
    with pytest.raises(ValueError):
        dechunk(rest)


def _short_json(head: bytes, rest: bytes) -> None:
    assert b"content-length: 200" in head.lower()
    assert len(rest) == 100  # half what it announced, then the close


def _not_json(head: bytes, rest: bytes) -> None:
    with pytest.raises(ValueError):
        json.loads(rest)


@pytest.mark.parametrize(
    ("kind", "stream", "check"),
    [
        ("oversized", False, _oversized_json),
        ("oversized", True, _oversized_event),
        ("malformed", True, _malformed_chunks),
        ("malformed", False, _short_json),
        ("not_json", False, _not_json),
        ("not_json", True, _not_json),
    ],
)
def test_bad_answer_puts_on_the_wire_what_it_says(
    kind: str, stream: bool, check: Callable[[bytes, bytes], None]
) -> None:
    async def test(engines: list[RunningEngine], s: aiohttp.ClientSession) -> None:
        (d,) = engines
        async with s.post(
            f"{d.url}/_calroute/faults", json={"bad_answer_rate": 1.0, "bad_answer": kind}
        ) as r:
            assert r.status == 200
        head, rest = await raw_post(d.url, "/v1/completions", body(10, 4, stream=stream))
        assert head.startswith(b"HTTP/1.1 200 "), head
        check(head, rest)
        async with s.get(f"{d.url}/_calroute/faults") as r:
            state = await r.json()
        assert state["injected"]["bad_answer"][kind] == 1
        assert d.core.num_running == 0 and d.core.kv.used_blocks == 0  # no work was started
        async with s.post(f"{d.url}/_calroute/faults", json={**state, "bad_answer_rate": 0.0}) as r:
            assert r.status == 200  # what GET answered posts back
        async with s.post(f"{d.url}/v1/completions", json=body(10, 4)) as r:
            assert r.status == 200 and (await r.json())["usage"]["completion_tokens"] == 4

    run_group(test, roles=(Role.DECODE,))


def test_bad_answer_rate_is_a_share_and_bad_values_are_refused() -> None:
    async def test(engines: list[RunningEngine], s: aiohttp.ClientSession) -> None:
        (d,) = engines
        for fault, field in [
            ({"bad_answer_rate": 1.5}, "bad_answer_rate"),
            ({"bad_answer_rate": -0.1}, "bad_answer_rate"),
            ({"bad_answer_rate": "half"}, "bad_answer_rate"),
            ({"bad_answer": "huge"}, "bad_answer"),
            ({"bad_answer": 3}, "bad_answer"),
        ]:
            async with s.post(f"{d.url}/_calroute/faults", json=fault) as r:
                assert r.status == 400, fault
                assert (await r.json())["error"]["param"] == field
        await s.post(f"{d.url}/_calroute/faults", json={"bad_answer_rate": 0.5, "bad_answer": "not_json"})
        statuses = []
        for _ in range(40):
            async with s.post(f"{d.url}/v1/completions", json=body(10, 1)) as r:
                text = await r.text()
                statuses.append(text.startswith("{"))
        bad = statuses.count(False)
        assert 8 <= bad <= 32, bad
        async with s.get(f"{d.url}/_calroute/faults") as r:
            assert (await r.json())["injected"]["bad_answer"]["not_json"] == bad

    run_group(test, roles=(Role.DECODE,))
