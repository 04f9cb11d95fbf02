"""The fault matrix (docs/faults.md): what the client sees, what the router does, and the log, for each
engine fault the emulator can show. Every admitted request must end in exactly one terminal record."""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from calroute.engines.cluster import ClusterFile
from calroute.engines.procs import stop_process_group
from calroute.results.records import read_records
from calroute.types import RequestStatus
from tests.engines.http import metric, request, stream
from tests.proxy.harness import RunningProxy

pytestmark = pytest.mark.faults

FAST = {"prefill_timeout_s": 2.0, "stall_timeout_s": 2.0, "health_interval_s": 0.2}


def body(**kw: Any) -> dict[str, Any]:
    return {"model": "emulated", "prompt": "fault tolerance " * 30, "max_tokens": 8, "ignore_eos": True, **kw}


def records(p: RunningProxy) -> list[Any]:
    assert p.proxy.cfg.log_path is not None
    return list(read_records(p.proxy.cfg.log_path))


def one_record_each(p: RunningProxy, n: int) -> list[Any]:
    recs = records(p)
    assert len(recs) == n and len({r.request_id for r in recs}) == n
    return recs


def fault(engine_url: str, **kw: Any) -> None:
    status, out = request(f"{engine_url}/_calroute/faults", kw)
    assert status == 200, out


def wait_for(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


@pytest.mark.parametrize("error_status", [500, 503])
@pytest.mark.parametrize("error_rate_on", ["prefill", "decode"])
def test_an_engine_answering_5xx_is_retried_elsewhere(
    fresh_cluster: Callable[..., ClusterFile],
    proxy_for: Callable[..., RunningProxy],
    error_rate_on: str,
    error_status: int,
) -> None:
    c = fresh_cluster()
    p = proxy_for(c, policy="round_robin", **FAST)
    bad = (c.prefill if error_rate_on == "prefill" else c.decode)[0]
    fault(bad.url, error_rate=1.0, error_status=error_status)
    for _ in range(6):
        assert request(f"{p.url}/v1/completions", body())[0] == 200
    recs = one_record_each(p, 6)
    assert all(r.status is RequestStatus.OK for r in recs)
    assert bad.id not in {r.prefill_id for r in recs} | {r.decode_id for r in recs}
    assert metric(p.url, f'calroute_retries_total{{phase="{error_rate_on}"}}') >= 1


def test_a_stalled_engine_times_out_and_is_routed_around(
    fresh_cluster: Callable[..., ClusterFile], proxy_for: Callable[..., RunningProxy]
) -> None:
    c = fresh_cluster()
    p = proxy_for(c, policy="round_robin", **FAST)
    fault(c.decode[0].url, stall=True)
    for _ in range(3):
        # a stalled stream has had its head sent (as vLLM's does): the retry goes on into the same response
        status, events = stream(f"{p.url}/v1/completions", body(stream=True), timeout_s=30)
        assert status == 200 and events[-1] == "[DONE]"
        assert "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"]), events
        assert sum(len(e["choices"]) for e in events[:-1]) == 8 and not any("error" in e for e in events[:-1])
    recs = one_record_each(p, 3)
    assert all(r.status is RequestStatus.OK and r.decode_id == "decode-1" for r in recs)


def test_a_stream_gets_its_head_with_the_decode_engines_and_an_error_event_if_every_attempt_fails(
    fresh_cluster: Callable[..., ClusterFile], proxy_for: Callable[..., RunningProxy]
) -> None:
    c = fresh_cluster(1, 1)
    p = proxy_for(c, policy="round_robin", **FAST)
    fault(c.decode[0].url, stall=True)  # the only decode engine: its head, then silence, every time
    req = urllib.request.Request(
        f"{p.url}/v1/completions",
        data=json.dumps(body(stream=True)).encode(),
        headers={"Content-Type": "application/json"},
    )
    started = time.monotonic()
    with urllib.request.urlopen(req, timeout=60) as r:
        head_s = time.monotonic() - started
        assert r.status == 200 and r.headers["Content-Type"] == "text/event-stream"
        text = r.read().decode()
    # The head did not wait for a token (none ever came), nor for the engine's silence to run out.
    assert head_s < FAST["stall_timeout_s"] / 2, head_s
    assert time.monotonic() - started > FAST["stall_timeout_s"]
    assert text.startswith('data: {"error"') and "decode engine decode-0" in text, text
    assert text.rstrip().endswith("data: [DONE]") and text.count("data: ") == 2, text
    (rec,) = one_record_each(p, 1)
    assert rec.status is RequestStatus.FAILED and rec.first_token_s is None


class EmptyStreamEngine:
    """A decode engine that answers every request with a stream's head and an empty body (the end of the
    chunked body at once), then closes: nothing for the proxy to relay."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self.posts = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return  # closed
            with conn:
                data = b""
                while b"\r\n\r\n" not in data and (chunk := conn.recv(65536)):
                    data += chunk
                head, _, rest = data.partition(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                while len(rest) < length and (chunk := conn.recv(65536)):
                    rest += chunk
                self.posts += head.startswith(b"POST")
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                    b"Connection: close\r\n\r\n0\r\n\r\n"
                )

    def close(self) -> None:
        self._server.close()


def test_a_decode_stream_that_ends_before_any_piece_is_retried_on_another_decode_engine(
    fresh_cluster: Callable[..., ClusterFile], proxy_for: Callable[..., RunningProxy]
) -> None:
    cluster = fresh_cluster()
    fake = EmptyStreamEngine()
    try:
        engines = tuple(
            dataclasses.replace(e, url=fake.url) if e.id == cluster.decode[0].id else e
            for e in cluster.engines
        )
        p = proxy_for(dataclasses.replace(cluster, engines=engines), policy="round_robin", **FAST)
        for _ in range(2):  # round-robin: one of the two goes to the empty engine first
            status, events = stream(f"{p.url}/v1/completions", body(stream=True), timeout_s=30)
            assert status == 200 and events[-1] == "[DONE]"
            assert sum(len(e["choices"]) for e in events[:-1]) == 8 and not any(
                "error" in e for e in events[:-1]
            )
        # at least one went to the empty engine (a health probe can bring it back for the other one too)
        assert fake.posts >= 1
        recs = one_record_each(p, 2)
        assert all(r.status is RequestStatus.OK and r.decode_id == cluster.decode[1].id for r in recs)
    finally:
        fake.close()


@pytest.mark.parametrize("streamed", [False, True])
def test_a_long_answer_is_not_a_stall(
    fresh_cluster: Callable[..., ClusterFile], proxy_for: Callable[..., RunningProxy], streamed: bool
) -> None:
    # ~100 decode steps of ~20 ms: far past a 0.5 s stall timeout, yet the engine is working, not stalled.
    c = fresh_cluster(1, 1)
    p = proxy_for(c, prefill_timeout_s=2.0, stall_timeout_s=0.5)
    send = stream if streamed else request
    status, _ = send(f"{p.url}/v1/completions", body(max_tokens=100, stream=streamed), timeout_s=30)
    assert status == 200
    wait_for(lambda: len(records(p)) == 1, 5.0)  # a stream's record is written just after its last event
    (rec,) = one_record_each(p, 1)
    assert rec.status is RequestStatus.OK and rec.output_tokens == 100
    assert rec.last_token_s is not None and rec.last_token_s - rec.arrival_s > 1.0


def test_a_decode_engine_that_dies_mid_stream_ends_the_stream_with_an_error(
    fresh_cluster: Callable[..., ClusterFile], proxy_for: Callable[..., RunningProxy]
) -> None:
    c = fresh_cluster(1, 2)
    p = proxy_for(c, policy="round_robin", **FAST)
    req = urllib.request.Request(
        f"{p.url}/v1/completions",
        data=json.dumps(body(max_tokens=2000, stream=True)).encode(),
        headers={"Content-Type": "application/json"},
    )
    lines: list[bytes] = []
    with urllib.request.urlopen(req, timeout=30) as r:
        lines.append(r.readline())
        stop_process_group(c.pgids[1])  # decode-0's process: the first decision of round_robin
        lines += list(r)
    text = b"".join(lines).decode()
    assert '"error"' in text and "broke off the stream" in text and text.rstrip().endswith("data: [DONE]")
    (rec,) = one_record_each(p, 1)
    assert rec.status is RequestStatus.FAILED and rec.decode_id == "decode-0"
    assert not p.proxy.signals.healthy["decode-0"]
    # and the next request goes to the survivor
    assert request(f"{p.url}/v1/completions", body())[0] == 200
    assert records(p)[-1].decode_id == "decode-1"


def test_a_prefill_engine_that_dies_before_the_pull_costs_a_retry_not_the_request(
    fresh_cluster: Callable[..., ClusterFile], proxy_for: Callable[..., RunningProxy]
) -> None:
    c = fresh_cluster(2, 1)
    p = proxy_for(c, policy="round_robin", **FAST)
    # refuse pulls: the prefill engine answered, but its KV cannot be read (as if it died right after)
    fault(c.prefill[0].url, refuse_kv_pulls=True)
    status, out = request(f"{p.url}/v1/completions", body(), timeout_s=30)
    assert status == 200, out
    recs = one_record_each(p, 1)
    assert recs[0].status is RequestStatus.OK and recs[0].prefill_id == "prefill-1"
    assert metric(p.url, 'calroute_retries_total{phase="decode"}') == 1


def test_an_expired_kv_lease_still_answers(
    fresh_cluster: Callable[..., ClusterFile], proxy_for: Callable[..., RunningProxy], tmp_path: Any
) -> None:
    from calroute.engines import launch

    launched = launch.up_emulated(1, 1, tmp_path / "short-lease", kv_lease_s=0.0)
    try:
        p = proxy_for(launched.file, **FAST)
        assert request(f"{p.url}/v1/completions", body())[0] == 200  # vLLM: stale KV, still HTTP 200
        (rec,) = one_record_each(p, 1)
        assert rec.status is RequestStatus.OK
        wait_for(lambda: metric(launched.file.prefill[0].url, "vllm:nixl_num_kv_expired_reqs_total") >= 1)
    finally:
        launched.stop()


def test_metrics_going_away_leaves_the_engine_in_routing(
    fresh_cluster: Callable[..., ClusterFile], proxy_for: Callable[..., RunningProxy]
) -> None:
    c = fresh_cluster(1, 1)
    p = proxy_for(c, **FAST)
    wait_for(lambda: p.proxy.signals.last_sample_s["decode-0"] is not None, 5.0)  # a sample came first
    fault(c.decode[0].url, metrics_down=True)
    time.sleep(1.0)
    assert p.proxy.signals.healthy["decode-0"]
    assert request(f"{p.url}/v1/completions", body())[0] == 200
    age = p.proxy.signals.last_sample_s["decode-0"]
    assert age is not None and p.proxy.now() - age > 0.5  # the sample is stale, and says so
    assert p.proxy.signals.metrics_failures["decode-0"] > 5


def test_an_engine_that_comes_back_is_routed_to_again(
    fresh_cluster: Callable[..., ClusterFile], proxy_for: Callable[..., RunningProxy]
) -> None:
    c = fresh_cluster(1, 2)
    p = proxy_for(c, policy="round_robin", **FAST)
    fault(c.decode[0].url, error_rate=1.0)
    assert request(f"{p.url}/v1/completions", body())[0] == 200  # retried on decode-1
    assert not p.proxy.signals.healthy["decode-0"]
    fault(c.decode[0].url, error_rate=0.0)
    wait_for(lambda: p.proxy.signals.healthy["decode-0"], 5.0)  # the health probe brings it back
    for _ in range(4):
        assert request(f"{p.url}/v1/completions", body())[0] == 200
    assert "decode-0" in {r.decode_id for r in records(p)[-4:]}


def test_under_concurrent_load_a_crash_loses_nothing(
    fresh_cluster: Callable[..., ClusterFile], proxy_for: Callable[..., RunningProxy]
) -> None:
    c = fresh_cluster(2, 2)
    p = proxy_for(c, **FAST)
    results: list[int] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        for j in range(8):
            try:
                status, _ = (stream if j % 2 else request)(
                    f"{p.url}/v1/completions", body(max_tokens=40, stream=bool(j % 2)), timeout_s=60
                )
            except Exception:  # the stream broke: a failed request, still one record
                status = -1
            with lock:
                results.append(status)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    stop_process_group(c.pgids[3])  # decode-0
    for t in threads:
        t.join(120)
    assert len(results) == 48
    recs = one_record_each(p, 48)
    assert all(r.status in (RequestStatus.OK, RequestStatus.FAILED) for r in recs)
    assert sum(s == 200 for s in results) >= 40
