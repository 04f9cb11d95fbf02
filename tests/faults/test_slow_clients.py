"""Slow clients: one that sends its body in pieces, one that reads its stream slowly, one that stops halfway
through sending. None of them may hold up anyone else, and each admitted request still ends in one record."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import pytest

from calroute.cluster.file import ClusterFile
from calroute.results.records import RequestRecord, read_records
from calroute.types import RequestStatus
from tests.emulator.http import request
from tests.proxy.harness import RunningProxy

pytestmark = pytest.mark.faults


def connect(url: str) -> socket.socket:
    u = urlsplit(url)
    return socket.create_connection((u.hostname or "127.0.0.1", u.port or 80), timeout=30)


def head(body: bytes) -> bytes:
    return (
        b"POST /v1/completions HTTP/1.1\r\nHost: calroute\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n"
    )


def records(p: RunningProxy) -> list[RequestRecord]:
    assert p.proxy.cfg.log_path is not None
    return list(read_records(p.proxy.cfg.log_path)) if p.proxy.cfg.log_path.exists() else []


def test_slow_clients_hold_up_nobody(
    fresh_cluster: Callable[..., ClusterFile], proxy_for: Callable[..., RunningProxy]
) -> None:
    c = fresh_cluster(1, 1)
    p = proxy_for(c)
    body = {"model": "emulated", "prompt": "slow " * 50, "max_tokens": 300, "ignore_eos": True}
    payload = json.dumps({**body, "stream": True}).encode()
    done: dict[str, bytes] = {}

    def slow_sender() -> None:  # the body in 10-byte pieces over ~2 s
        with connect(p.url) as s:
            s.sendall(head(payload))
            for i in range(0, len(payload), max(1, len(payload) // 20)):
                s.sendall(payload[i : i + max(1, len(payload) // 20)])
                time.sleep(0.1)
            done["sender"] = b"".join(iter(lambda: s.recv(65536), b""))

    # 256 bytes every 50 ms: ~5 KB/s, under half the rate the events come at; 100 tokens (~25 KB) keep it
    # reading slowly for ~5 s, well past the normal request below and the slow sender's body
    reader_payload = json.dumps({**body, "max_tokens": 100, "stream": True}).encode()

    def slow_reader() -> None:
        with connect(p.url) as s:
            s.sendall(head(reader_payload) + reader_payload)
            chunks = []
            while chunk := s.recv(256):
                chunks.append(chunk)
                time.sleep(0.05)
            done["reader"] = b"".join(chunks)

    threads = [threading.Thread(target=f) for f in (slow_sender, slow_reader)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    # meanwhile a normal request is served at normal speed
    started = time.monotonic()
    status, out = request(f"{p.url}/v1/completions", {**body, "max_tokens": 4}, timeout_s=30)
    assert status == 200 and out["usage"]["completion_tokens"] == 4
    assert time.monotonic() - started < 2.0
    # a client that stops halfway through its body and goes away was never admitted: no record, no harm
    with connect(p.url) as s:
        s.sendall(head(payload) + payload[: len(payload) // 2])
    for t in threads:
        t.join(60)
    for name in ("sender", "reader"):
        assert done[name].startswith(b"HTTP/1.1 200"), done.get(name, b"")[:200]
        # chunked transfer encoding: the stream's last event, then the terminating chunk
        assert done[name].rstrip().endswith(b"data: [DONE]\n\n\r\n0"), done[name][-200:]
        assert b'"error"' not in done[name]
    deadline = time.monotonic() + 5
    while len(records(p)) < 3:
        assert time.monotonic() < deadline, records(p)
        time.sleep(0.05)
    time.sleep(0.5)
    recs = records(p)
    assert len(recs) == 3 and all(r.status is RequestStatus.OK for r in recs)
    assert p.proxy.ledger.in_flight_requests() == 0
