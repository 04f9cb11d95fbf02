"""The proxy end to end on emulated engines, over real sockets on both sides: streamed and whole answers
equal a direct completion, and a stream reaches HTTP/1.0 and 1.1 clients framed for each. The logic
between (decisions, handoff, retries, failover, records, the surface) is tested on in-memory fake engines
(test_generate.py, test_app.py); engine deaths on real processes in tests/faults/."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from typing import Any

from calroute.cluster.file import ClusterFile
from calroute.results.records import read_records
from calroute.types import RequestStatus
from tests.emulator.http import request, stream
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
