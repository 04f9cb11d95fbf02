"""The proxy end to end on emulated engines: outputs, logs, decisions, bad input, failover, admin."""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from calroute.engines.cluster import ClusterFile
from calroute.engines.procs import stop_process_group
from calroute.results.records import read_records
from calroute.types import RequestStatus
from tests.engines.http import metric, request, stream
from tests.proxy.harness import RunningProxy

PROMPT = "The quick brown fox jumps over the lazy dog. " * 20


def body(**kw: Any) -> dict[str, Any]:
    return {
        "model": "emulated",
        "prompt": PROMPT,
        "max_tokens": 12,
        "ignore_eos": True,
        "temperature": 0,
        **kw,
    }


def records(p: RunningProxy) -> list[Any]:
    assert p.proxy.cfg.log_path is not None
    return list(read_records(p.proxy.cfg.log_path))


def wait_for(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_outputs_equal_a_direct_greedy_completion(
    cluster: ClusterFile, proxy_for: Callable[..., RunningProxy]
) -> None:
    p = proxy_for(cluster)
    _, direct = request(f"{cluster.decode[0].url}/v1/completions", body())
    status, via = request(f"{p.url}/v1/completions", body())
    assert status == 200 and via["choices"][0]["text"] == direct["choices"][0]["text"]
    assert via["usage"]["completion_tokens"] == 12
    status, events = stream(f"{p.url}/v1/completions", body(stream=True))
    assert events[-1] == "[DONE]" and all("usage" not in e for e in events[:-1])  # usage only when asked
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == direct["choices"][0]["text"]
    _, events = stream(f"{p.url}/v1/completions", body(stream=True, stream_options={"include_usage": True}))
    assert events[-2]["usage"]["completion_tokens"] == 12
    chat = {
        "model": "emulated",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5,
        "ignore_eos": True,
    }
    _, direct_chat = request(f"{cluster.decode[1].url}/v1/chat/completions", chat)
    _, via_chat = request(f"{p.url}/v1/chat/completions", chat)
    assert via_chat["choices"][0]["message"]["content"] == direct_chat["choices"][0]["message"]["content"]


def test_a_stream_reaches_http_1_0_and_1_1_clients_framed_for_each(
    cluster: ClusterFile, proxy_for: Callable[..., RunningProxy]
) -> None:
    # After the head, the relay writes to the client's socket itself, framed as aiohttp chose for the
    # response: chunked for HTTP/1.1, the bare bytes up to the connection's close for HTTP/1.0.
    p = proxy_for(cluster)
    host, port = p.url.removeprefix("http://").split(":")
    payload = json.dumps(body(stream=True)).encode()
    answers = {}
    for version in ("1.0", "1.1"):
        head = (
            f"POST /v1/completions HTTP/{version}\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
        )
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(head.encode() + payload)
            raw = b""
            while chunk := sock.recv(65536):
                raw += chunk
        head_bytes, _, rest = raw.partition(b"\r\n\r\n")
        chunked = b"transfer-encoding: chunked" in head_bytes.lower()
        assert chunked == (version == "1.1"), head_bytes
        if chunked:
            decoded = b""
            while rest:
                size, _, rest = rest.partition(b"\r\n")
                n = int(size, 16)
                decoded, rest = decoded + rest[:n], rest[n + 2 :]
            rest = decoded
        answers[version] = [e for e in rest.decode().split("\n\n") if e]
    assert answers["1.0"][-1] == answers["1.1"][-1] == "data: [DONE]"
    texts = {
        v: "".join(json.loads(e.removeprefix("data: "))["choices"][0]["text"] for e in events[:-1])
        for v, events in answers.items()
    }
    assert texts["1.0"] == texts["1.1"] != ""
    wait_for(lambda: len(records(p)) == 2)
    assert all(r.status is RequestStatus.OK for r in records(p))


def test_every_request_is_logged_once_in_the_shared_schema(
    cluster: ClusterFile, proxy_for: Callable[..., RunningProxy]
) -> None:
    p = proxy_for(cluster)
    for i in range(6):
        if i % 2:
            stream(f"{p.url}/v1/completions", body(stream=True), timeout_s=30)
        else:
            request(f"{p.url}/v1/completions", body(), timeout_s=30)
    request(f"{p.url}/v1/completions", body(max_tokens=-1))  # rejected before admission: not logged
    recs = records(p)
    assert len(recs) == 6 and len({r.request_id for r in recs}) == 6
    assert all(re.fullmatch(r"[0-9a-f]{32}", r.request_id) for r in recs)  # as long as a uuid4's hex
    for r in recs:
        assert r.status is RequestStatus.OK and r.output_tokens == 12 and r.prompt_tokens > 100
        assert r.prefill_done_s is not None and r.first_token_s is not None and r.last_token_s is not None
        assert r.arrival_s < r.prefill_done_s <= r.first_token_s <= r.last_token_s
        assert r.prefill_id in ("prefill-0", "prefill-1") and r.decode_id in ("decode-0", "decode-1")


def test_round_robin_decisions_alternate(
    cluster: ClusterFile, proxy_for: Callable[..., RunningProxy]
) -> None:
    p = proxy_for(cluster, policy="round_robin")
    for _ in range(6):
        request(f"{p.url}/v1/completions", body(max_tokens=2))
    recs = records(p)
    assert [r.prefill_id for r in recs] == ["prefill-0", "prefill-1"] * 3
    assert [r.decode_id for r in recs] == ["decode-0", "decode-1"] * 3


@pytest.mark.parametrize(
    ("send", "status", "message"),
    [
        ({"raw": b"{not json"}, 400, "not valid JSON"),
        ({"body": [1, 2]}, 400, "JSON object"),
        ({"body": {"max_tokens": 5}}, 400, "prompt is required"),
        ({"body": body(max_tokens=-5)}, 400, "max_tokens must be in"),
        ({"body": body(max_tokens=0)}, 400, "max_tokens must be in"),
        ({"body": body(max_tokens=10**9)}, 400, "max_tokens must be in"),
        ({"body": body(max_tokens="12")}, 400, "must be an integer"),
        ({"body": body(max_tokens=True)}, 400, "must be an integer"),
        ({"body": body(stream="yes")}, 400, "stream must be a boolean"),
        ({"raw": b'{"prompt": "' + b"x" * (9 * 1024 * 1024) + b'"}'}, 413, "larger than"),
        ({"raw": b"\xff\xfe{}"}, 400, "not valid JSON"),
    ],
)
def test_bad_input_gets_a_4xx_json_error(
    cluster: ClusterFile,
    proxy_for: Callable[..., RunningProxy],
    send: dict[str, Any],
    status: int,
    message: str,
) -> None:
    p = proxy_for(cluster)
    got, out = request(f"{p.url}/v1/completions", send.get("body"), raw=send.get("raw"))
    assert got == status and message in out["error"]["message"]
    assert request(f"{p.url}/v1/completions", body(max_tokens=1))[0] == 200  # still serving


def test_unknown_slo_class_is_a_400(cluster: ClusterFile, proxy_for: Callable[..., RunningProxy]) -> None:
    import json
    import urllib.error
    import urllib.request

    p = proxy_for(cluster)
    req = urllib.request.Request(
        f"{p.url}/v1/completions",
        data=json.dumps(body()).encode(),
        headers={"Content-Type": "application/json", "x-calroute-slo": "platinum"},
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 400 and "x-calroute-slo" in e.value.read().decode()


def test_engine_4xx_goes_back_to_the_client_and_the_engine_stays_in(
    cluster: ClusterFile, proxy_for: Callable[..., RunningProxy]
) -> None:
    p = proxy_for(cluster)
    got, out = request(f"{p.url}/v1/completions", body(model="no-such-model"))
    assert got == 404 and "does not exist" in out["error"]["message"]
    assert all(p.proxy.signals.healthy.values())
    (rec,) = records(p)
    assert rec.status is RequestStatus.REJECTED


def test_admin_endpoints_need_the_token(cluster: ClusterFile, proxy_for: Callable[..., RunningProxy]) -> None:
    import json
    import urllib.error
    import urllib.request

    closed = proxy_for(cluster)
    assert request(f"{closed.url}/state")[0] == 403
    p = proxy_for(cluster, admin_token="s3cret")
    assert request(f"{p.url}/state")[0] == 401

    def admin(path: str, payload: Any = None, token: str = "s3cret") -> tuple[int, Any]:
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(
            f"{p.url}{path}", data=data, headers={"Authorization": f"Bearer {token}"}
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    assert admin("/state", token="wrong")[0] == 401
    status, state = admin("/state")
    assert status == 200 and state["policy"] == "marginal_cost" and len(state["engines"]) == 4
    assert admin("/admin/policy", {"policy": "round_robin"}) == (200, {"policy": "round_robin", "params": {}})
    assert admin("/admin/policy", {"policy": "nope"})[0] == 400
    assert admin("/admin/policy", {"policy": "marginal_cost", "params": {"rho": -1}})[0] == 400
    assert admin("/state")[1]["policy"] == "round_robin"


def test_engines_are_scraped_only_while_something_reads_the_samples(
    cluster: ClusterFile, proxy_for: Callable[..., RunningProxy]
) -> None:
    import json
    import urllib.request

    def samples(p: RunningProxy) -> dict[str, float | None]:
        return dict(p.proxy.signals.last_sample_s)

    def switch(p: RunningProxy, policy: str) -> None:
        req = urllib.request.Request(
            f"{p.url}/admin/policy",
            data=json.dumps({"policy": policy}).encode(),
            headers={"Authorization": "Bearer t"},
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200

    p = proxy_for(cluster, policy="round_robin", admin_token="t")
    time.sleep(0.5)  # ten poll intervals
    assert set(samples(p).values()) == {None}
    switch(p, "marginal_cost")  # reads kv_used_tokens: the polls start
    wait_for(lambda: None not in samples(p).values())
    switch(p, "least_loaded")  # reads none: the polls stop (a cancelled poll records nothing)
    before = samples(p)
    time.sleep(0.3)
    assert samples(p) == before
    online = proxy_for(cluster, policy="round_robin", online_calibration=True)  # fits on sampled batches
    wait_for(lambda: None not in samples(online).values())


def test_queue_kv_routes_on_the_polled_samples(
    cluster: ClusterFile, proxy_for: Callable[..., RunningProxy]
) -> None:
    # llm-d's scorers read only the engines' metrics: the proxy polls them, and requests spread over
    # both pools (ties rotate; an engine seen busy scores lower).
    p = proxy_for(cluster, policy="queue_kv")
    wait_for(lambda: None not in p.proxy.signals.last_sample_s.values())
    for _ in range(6):
        request(f"{p.url}/v1/completions", body(max_tokens=2), timeout_s=30)
    recs = records(p)
    assert [r.status for r in recs] == [RequestStatus.OK] * 6
    assert {r.prefill_id for r in recs} == {"prefill-0", "prefill-1"}
    assert {r.decode_id for r in recs} == {"decode-0", "decode-1"}


def test_proxy_metrics_and_health(cluster: ClusterFile, proxy_for: Callable[..., RunningProxy]) -> None:
    p = proxy_for(cluster)
    request(f"{p.url}/v1/completions", body(max_tokens=3))
    assert metric(p.url, "calroute_requests_total") == 1
    assert metric(p.url, "calroute_decision_seconds_count") == 1
    wait_for(lambda: metric(p.url, "calroute_event_loop_lag_seconds_count") >= 1)  # every 0.1 s
    assert metric(p.url, "calroute_engine_healthy") == 4
    wait_for(lambda: metric(p.url, "calroute_signal_age_seconds") < 4 * 0.5)
    assert request(f"{p.url}/health") == (
        200,
        {"status": "ok", "prefill_instances": 2, "decode_instances": 2},
    )
    _, models = request(f"{p.url}/v1/models")
    assert models["data"][0]["id"] == "emulated"


# ---- failover (destructive: fresh clusters) -----------------------------------------------------------


def test_a_failing_prefill_engine_is_retried_elsewhere(
    fresh_cluster: Callable[..., ClusterFile], proxy_for: Callable[..., RunningProxy]
) -> None:
    c = fresh_cluster()
    p = proxy_for(c, policy="round_robin")
    request(f"{c.prefill[0].url}/_calroute/faults", {"error_rate": 1.0})
    for _ in range(4):
        assert request(f"{p.url}/v1/completions", body(max_tokens=3))[0] == 200
    recs = records(p)
    assert all(r.status is RequestStatus.OK and r.prefill_id == "prefill-1" for r in recs)
    assert metric(p.url, 'calroute_retries_total{phase="prefill"}') >= 1


def test_a_crashed_decode_engine_is_taken_out_and_requests_complete(
    fresh_cluster: Callable[..., ClusterFile], proxy_for: Callable[..., RunningProxy]
) -> None:
    c = fresh_cluster()
    p = proxy_for(c)
    stop_process_group(c.pgids[2])  # decode-0's process
    for _ in range(4):
        status, out = request(f"{p.url}/v1/completions", body(max_tokens=3), timeout_s=30)
        assert status == 200, out
    assert not p.proxy.signals.healthy["decode-0"]
    assert {r.decode_id for r in records(p)} == {"decode-1"}


def test_a_dead_pool_is_still_tried_then_answered_with_a_clear_502(
    fresh_cluster: Callable[..., ClusterFile], proxy_for: Callable[..., RunningProxy]
) -> None:
    c = fresh_cluster(1, 1)
    p = proxy_for(c)
    stop_process_group(c.pgids[1])  # the only decode engine
    wait_for(lambda: not p.proxy.signals.healthy["decode-0"])
    assert request(f"{p.url}/health")[0] == 503
    # no healthy decode engine: the router tries them all anyway (panic mode), and reports why it failed
    status, out = request(f"{p.url}/v1/completions", body(max_tokens=3))
    assert status == 502 and "decode engine decode-0" in out["error"]["message"]
    (rec,) = records(p)
    assert rec.status is RequestStatus.FAILED and "decode-0" in (rec.error or "")


def test_a_client_that_disconnects_mid_stream_frees_the_engine(
    fresh_cluster: Callable[..., ClusterFile], proxy_for: Callable[..., RunningProxy]
) -> None:
    import json
    import urllib.request

    c = fresh_cluster(1, 1)
    p = proxy_for(c)
    req = urllib.request.Request(
        f"{p.url}/v1/completions",
        data=json.dumps(body(max_tokens=3000, stream=True)).encode(),
        headers={"Content-Type": "application/json"},
    )
    r = urllib.request.urlopen(req, timeout=10)
    r.readline()
    wait_for(lambda: metric(c.decode[0].url, "vllm:num_requests_running") == 1)
    r.close()
    wait_for(lambda: metric(c.decode[0].url, "vllm:num_requests_running") == 0)
    wait_for(lambda: len(records(p)) == 1)
    (rec,) = records(p)
    assert rec.status is RequestStatus.CANCELLED and rec.error == "client disconnected"
    # the client left; the engine did nothing wrong: no engine error counted, still in routing
    assert p.proxy.metrics.engine_errors.labels("decode-0")._value.get() == 0
    assert p.proxy.signals.healthy["decode-0"]


def test_engine_api_key_is_sent_but_never_logged(
    cluster: ClusterFile, proxy_for: Callable[..., RunningProxy], tmp_path: Path
) -> None:
    p = proxy_for(cluster, engine_api_key="engine-key-123")
    assert request(f"{p.url}/v1/completions", body(max_tokens=2))[0] == 200
    assert p.proxy.cfg.log_path is not None
    assert "engine-key-123" not in p.proxy.cfg.log_path.read_text()


def _post(url: str, headers: dict[str, str]) -> tuple[int, str]:
    import json
    import urllib.error
    import urllib.request

    req = urllib.request.Request(
        url, data=json.dumps(body()).encode(), headers={"Content-Type": "application/json", **headers}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_the_oracle_predictor_reads_the_true_length_from_its_header(
    cluster: ClusterFile, proxy_for: Callable[..., RunningProxy]
) -> None:
    from calroute import aio
    from calroute.harness.loadgen import drive
    from calroute.proxy.oracle import ORACLE_HEADER
    from calroute.types import RequestSpec, SloClass

    p = proxy_for(cluster, predictor="oracle")
    url = f"{p.url}/v1/completions"
    for bad in ({}, {ORACLE_HEADER: "many"}, {ORACLE_HEADER: "0"}):
        status, text = _post(url, bad)
        assert status == 400 and ORACLE_HEADER in text
    assert _post(url, {ORACLE_HEADER: "37"})[0] == 200
    # The load generator sends each request's own length: the proxy predicts exactly it.
    specs = [RequestSpec(f"r{i}", 0.01 * i, 32, n, SloClass.TIGHT) for i, n in enumerate((3, 9, 5))]
    result = aio.run(drive(p.url, specs, cluster.model, oracle_header=True))
    assert all(r.status is RequestStatus.OK for r in result.records)
    wait_for(lambda: len(records(p)) == 4)
    assert sorted(r.predicted_output_tokens for r in records(p)) == [3, 5, 9, 37]


def test_injected_predictor_error_is_seeded(
    cluster: ClusterFile, proxy_for: Callable[..., RunningProxy]
) -> None:
    from calroute.proxy.oracle import ORACLE_HEADER

    def predictions(seed: int) -> list[int]:
        p = proxy_for(cluster, predictor="oracle", predictor_noise=0.5, predictor_seed=seed)
        for _ in range(6):
            assert _post(f"{p.url}/v1/completions", {ORACLE_HEADER: "100"})[0] == 200
        wait_for(lambda: len(records(p)) == 6)
        return [r.predicted_output_tokens for r in records(p)]

    first = predictions(1)
    assert any(n != 100 for n in first) and all(n >= 1 for n in first)
    assert predictions(1) == first and predictions(2) != first
