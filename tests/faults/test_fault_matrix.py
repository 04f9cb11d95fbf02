"""The fault matrix (docs/faults.md) on real engine processes: what only they can show (an engine that dies
mid-stream or under load, an expired KV lease). Every admitted request must end in exactly one terminal
record. The rest of the matrix (5xx, 4xx, stalls, empty and cut streams, refused KV pulls, /metrics gone, an
engine coming back) runs on in-memory fake engines: tests/proxy/test_generate.py and test_app.py."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from calroute.cluster.file import ClusterFile
from calroute.cluster.procs import stop_process_group
from calroute.emulator.faults import BAD_ANSWERS
from calroute.results.records import read_records
from calroute.types import RequestStatus
from tests.emulator.http import metric, request, stream
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


def wait_for(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


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


def test_an_expired_kv_lease_still_answers(
    fresh_cluster: Callable[..., ClusterFile], proxy_for: Callable[..., RunningProxy], tmp_path: Any
) -> None:
    from calroute.cluster import launch

    launched = launch.up_emulated(1, 1, tmp_path / "short-lease", kv_lease_s=0.0)
    try:
        p = proxy_for(launched.file, **FAST)
        assert request(f"{p.url}/v1/completions", body())[0] == 200  # vLLM: stale KV, still HTTP 200
        (rec,) = one_record_each(p, 1)
        assert rec.status is RequestStatus.OK
        wait_for(lambda: metric(launched.file.prefill[0].url, "vllm:nixl_num_kv_expired_reqs_total") >= 1)
    finally:
        launched.stop()


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


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "stream"])
def test_every_bad_answer_of_an_emulated_engine_is_retried_on_another(
    streamed: bool, cluster: ClusterFile, proxy_for: Callable[..., RunningProxy]
) -> None:
    """The emulator's bad_answer fault over real sockets, each kind in turn (oversized, malformed framing,
    a 200 that is neither JSON nor SSE): every request still gets its whole answer, from the other decode
    engine, and the client never reads a byte of the bad ones."""
    p = proxy_for(cluster, policy="round_robin", **FAST)
    bad = cluster.decode[0]
    before = request(f"{bad.url}/_calroute/faults")[1]["injected"]["bad_answer"]  # the cluster is shared
    try:
        for kind in BAD_ANSWERS:
            state = request(f"{bad.url}/_calroute/faults", {"bad_answer_rate": 1.0, "bad_answer": kind})[1]
            assert state["bad_answer"] == kind
            for _ in range(2):  # round robin: one of the two meets the bad engine, once a probe took it back
                wait_for(lambda: p.proxy.signals.healthy[bad.id], 5.0)
                if streamed:
                    status, events = stream(f"{p.url}/v1/completions", body(stream=True))
                    assert status == 200 and events[-1] == "[DONE]" and len(events) == 9, (kind, events)
                    assert not any("error" in e for e in events[:-1]), (kind, events)
                else:
                    status, out = request(f"{p.url}/v1/completions", body())
                    assert status == 200 and out["usage"]["completion_tokens"] == 8, (kind, out)
    finally:
        state = request(f"{bad.url}/_calroute/faults", {"bad_answer_rate": 0.0})[1]
    injected = {k: n - before[k] for k, n in state["injected"]["bad_answer"].items()}
    assert all(injected[kind] >= 1 for kind in BAD_ANSWERS), injected  # each kind was met
    recs = records(p)
    assert len(recs) == 2 * len(BAD_ANSWERS) and all(r.status is RequestStatus.OK for r in recs)
    assert all(r.decode_id != bad.id for r in recs)
    # Each an engine failure (a JSON answer cut short by a close is one too, but not a protocol error).
    assert metric(p.url, "calroute_engine_errors_total") == sum(injected.values())
