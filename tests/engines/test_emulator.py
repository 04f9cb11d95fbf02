"""The engine emulator on its own: timing against its profile, KV leases, faults, disconnects."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import aiohttp
import pytest

from calroute.costmodel.profiles import HardwareProfile, get_profile
from calroute.engines.group import EngineGroup, EngineSpec, GroupConfig, RunningEngine
from calroute.engines.tokens import text_of_tokens
from calroute.types import Role

PROFILE = get_profile("a40-qwen2.5-3b")


def run_group(
    test: Callable[[list[RunningEngine], aiohttp.ClientSession], Awaitable[None]],
    roles: tuple[Role, ...] = (Role.PREFILL, Role.DECODE),
    **config: Any,
) -> None:
    async def main() -> None:
        group = EngineGroup(GroupConfig(profile=config.pop("profile", PROFILE), **config))
        engines = await group.start([EngineSpec(r, 0) for r in roles])
        try:
            async with aiohttp.ClientSession() as session:
                await asyncio.wait_for(test(engines, session), timeout=60)
        finally:
            await group.stop()

    asyncio.run(main())


def body(prompt_tokens: int, max_tokens: int, **kw: Any) -> dict[str, Any]:
    return {"prompt": text_of_tokens(prompt_tokens), "max_tokens": max_tokens, "ignore_eos": True, **kw}


async def timed_stream(
    session: aiohttp.ClientSession, url: str, req: dict[str, Any]
) -> tuple[float, list[float]]:
    """(time to first token, arrival time of every token chunk) measured at the client."""
    t0 = time.monotonic()
    times = []
    async with session.post(f"{url}/v1/completions", json={**req, "stream": True}) as r:
        assert r.status == 200, await r.text()
        async for line in r.content:
            if line.startswith(b"data: {") and b'"text":"' in line:
                times.append(time.monotonic() - t0)
    return times[0], times


async def prefill_params(
    session: aiohttp.ClientSession, p: RunningEngine, req: dict[str, Any]
) -> dict[str, Any]:
    async with session.post(
        f"{p.url}/v1/completions",
        json={**req, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}},
    ) as r:
        out = await r.json()
        params: dict[str, Any] = out["kv_transfer_params"]
        return params


# ---- timing: measured TTFT and TPOT against the profile ------------------------------------------------
# Tolerance: 10 % of the modelled time plus 5 ms (HTTP and event-loop overhead on a shared 2-core machine).
# Single-shot latencies run at time scale 2, so a few ms of scheduling jitter stay within the tolerance.


PULL_ROUND_TRIP_S = 0.02


def close(measured: float, modelled: float) -> bool:
    return abs(measured - modelled) <= 0.10 * modelled + 0.005


def test_unloaded_prefill_and_decode_follow_the_profile() -> None:
    cal = PROFILE.calibration
    scale = 2.0

    async def test(engines: list[RunningEngine], s: aiohttp.ClientSession) -> None:
        p, d = engines
        req = body(1024, 40)
        t0 = time.monotonic()
        params = await prefill_params(s, p, req)
        prefill_s = time.monotonic() - t0
        ttft, times = await timed_stream(s, d.url, {**req, "kv_transfer_params": params})
        tpot = (times[-1] - times[0]) / (len(times) - 1)
        # prompt is 1,025 tokens with the BOS
        assert close(prefill_s, scale * cal.prefill.single_s(1025)), prefill_s
        # the decode TTFT also holds the KV pull's round trip on the side channel, which no profile models
        # (2-3 ms on an idle machine, 10-13 ms on a busy CI one): a wider absolute allowance for it alone
        modelled_ttft = scale * (cal.transfer_s(1025) + cal.decode.step_s(1, 1025))
        assert modelled_ttft * 0.9 <= ttft <= modelled_ttft * 1.1 + PULL_ROUND_TRIP_S, ttft
        mean_step = statistics.fmean(cal.decode.step_s(1, 1025 + k) for k in range(1, 40))
        assert close(tpot, scale * mean_step), (tpot, mean_step)

    # One request is one sample of a shared machine's scheduling: a hiccup only ever adds time, so a model
    # that is right passes one of three fresh tries, and a wrong one fails them all.
    misses: list[str] = []
    for _ in range(3):
        try:
            run_group(test, time_scale=scale)
            return
        except AssertionError as e:
            misses.append(str(e))
    pytest.fail("; ".join(misses))


def test_batched_decode_follows_the_profile() -> None:
    cal = PROFILE.calibration

    async def test(engines: list[RunningEngine], s: aiohttp.ClientSession) -> None:
        (d,) = engines
        n, out = 16, 60
        runs = await asyncio.gather(*(timed_stream(s, d.url, body(2000, out)) for _ in range(n)))
        # all 16 join within the first steps; TPOT over the steps they share
        tpots = [(t[-1] - t[10]) / (len(t) - 11) for _, t in runs]
        modelled = cal.decode.step_s(n, n * (2001 + out // 2))
        assert close(statistics.median(tpots), modelled), (statistics.median(tpots), modelled)

    run_group(test, roles=(Role.DECODE,))


def test_time_scale_stretches_every_duration() -> None:
    cal = PROFILE.calibration

    async def test(engines: list[RunningEngine], s: aiohttp.ClientSession) -> None:
        (d,) = engines
        _, times = await timed_stream(s, d.url, body(100, 20))
        tpot = (times[-1] - times[0]) / (len(times) - 1)
        assert close(tpot, 3 * cal.decode.step_s(1, 110)), tpot

    run_group(test, roles=(Role.DECODE,), time_scale=3.0)


# ---- the P/D handoff --------------------------------------------------------------------------------


def test_held_kv_expires_after_the_lease() -> None:
    async def test(engines: list[RunningEngine], s: aiohttp.ClientSession) -> None:
        p, _ = engines
        await prefill_params(s, p, body(500, 1))
        assert p.core.kv.used_blocks > 0
        await asyncio.sleep(0.6)
        assert p.core.kv.used_blocks == 0
        assert p.core.stats.kv_expired == 1

    run_group(test, kv_lease_s=0.3)


@pytest.mark.parametrize(("policy", "status"), [("fail", 500), ("recompute", 200)])
def test_refused_pull_fails_or_recomputes(policy: str, status: int) -> None:
    async def test(engines: list[RunningEngine], s: aiohttp.ClientSession) -> None:
        p, d = engines
        params = await prefill_params(s, p, body(200, 1))
        await s.post(f"{p.url}/_calroute/faults", json={"refuse_kv_pulls": True})
        async with s.post(
            f"{d.url}/v1/completions", json={**body(200, 8), "kv_transfer_params": params}
        ) as r:
            assert r.status == status
            out = await r.json()
        if status == 200:
            assert out["usage"]["completion_tokens"] == 8
        else:
            assert "KV transfer failed" in out["error"]["message"]
        assert d.core.kv.used_blocks == 0

    run_group(test, kv_failure_policy=policy)


def test_dead_prefill_engine_fails_the_decode_after_the_handshake_timeout() -> None:
    async def test(engines: list[RunningEngine], s: aiohttp.ClientSession) -> None:
        p, d = engines
        params = await prefill_params(s, p, body(200, 1))
        params = {**params, "remote_port": 1}  # nothing listens there
        t0 = time.monotonic()
        async with s.post(
            f"{d.url}/v1/completions", json={**body(200, 8), "kv_transfer_params": params}
        ) as r:
            assert r.status == 500
        assert 0.5 <= time.monotonic() - t0 < 2.0

    run_group(test, handshake_timeout_s=0.5)


# ---- faults -----------------------------------------------------------------------------------------


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


def test_a_client_that_disconnects_frees_the_engine() -> None:
    async def test(engines: list[RunningEngine], s: aiohttp.ClientSession) -> None:
        (d,) = engines
        task = asyncio.ensure_future(timed_stream(s, d.url, body(300, 2000)))
        await asyncio.sleep(0.3)
        assert d.core.num_running == 1 and d.core.kv.used_blocks > 0
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0.2)
        assert d.core.num_running == 0 and d.core.kv.used_blocks == 0
        assert d.core.stats.finished.get("abort") == 1

    run_group(test, roles=(Role.DECODE,))


def test_kv_pressure_preempts_and_every_request_still_completes() -> None:
    small: HardwareProfile = replace(PROFILE, limits=replace(PROFILE.limits, kv_capacity_tokens=2048))

    async def test(engines: list[RunningEngine], s: aiohttp.ClientSession) -> None:
        (d,) = engines

        async def one() -> int:
            async with s.post(f"{d.url}/v1/completions", json=body(300, 300)) as r:
                return int((await r.json())["usage"]["completion_tokens"])

        assert await asyncio.gather(*(one() for _ in range(6))) == [300] * 6
        assert d.core.stats.preemptions > 0
        assert d.core.kv.used_blocks == 0

    run_group(test, roles=(Role.DECODE,), profile=small, time_scale=0.05)


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
