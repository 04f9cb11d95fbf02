"""A small synchronous HTTP client for engine tests (standard library only)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def request(url: str, body: Any = None, timeout_s: float = 60.0, raw: bytes | None = None) -> tuple[int, Any]:
    """POST ``body`` as JSON (GET when None): (status, parsed JSON or text)."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            status, payload = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, payload = e.code, e.read()
    text = payload.decode()
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


def stream(url: str, body: Any, timeout_s: float = 60.0) -> tuple[int, list[Any]]:
    """POST a streaming request: (status, SSE data payloads, JSON-decoded except the final "[DONE]")."""
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    events: list[Any] = []
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        for line in r:
            line = line.strip()
            if line.startswith(b"data: "):
                data = line[6:].decode()
                events.append(data if data == "[DONE]" else json.loads(data))
        return r.status, events


def metric(base_url: str, name: str) -> float:
    """The sum of a metric's samples over all label sets (vLLM labels every sample by engine)."""
    status, text = request(f"{base_url}/metrics")
    assert status == 200, text
    total = 0.0
    found = False
    for line in str(text).splitlines():
        if line.startswith((name + "{", name + " ")):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    assert found, f"metric {name} not in /metrics"
    return total
