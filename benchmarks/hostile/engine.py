"""The bad engine of benchmarks/attack.py: the emulator's bad_answer fault set on one decode engine, its kind
switched in turn by a thread of the measuring side; and the proxy's own count of what it met (/metrics)."""

from __future__ import annotations

import json
import threading
import urllib.request
from typing import Any

BAD_ENGINE_RATE = 0.2  # the share of its generation requests the bad decode engine answers badly
BAD_ANSWER_KINDS = ("oversized", "malformed", "not_json")  # in turn
BAD_SWITCH_S = 1.0


def _faults(url: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        f"{url}/_calroute/faults", data=data, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=5.0) as r:
        out: dict[str, Any] = json.loads(r.read())
        return out


class BadEngine(threading.Thread):
    """Sets the bad_answer fault on one engine, its kind switched every BAD_SWITCH_S, until stopped; then
    clears it and keeps the engine's count of injected answers by kind."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stop_event = threading.Event()
        self.switches = 0
        self.errors: list[str] = []
        self.injected: dict[str, int] = {}

    def run(self) -> None:
        while True:
            kind = BAD_ANSWER_KINDS[self.switches % len(BAD_ANSWER_KINDS)]
            try:
                _faults(self.url, {"bad_answer_rate": BAD_ENGINE_RATE, "bad_answer": kind})
                self.switches += 1
            except (OSError, ValueError) as e:
                self.errors.append(f"{type(e).__name__}: {e}")
            if self.stop_event.wait(BAD_SWITCH_S):
                break
        try:
            state = _faults(self.url, {"bad_answer_rate": 0.0})
            self.injected = {k: v for k, v in state["injected"]["bad_answer"].items() if v}
        except (OSError, ValueError, KeyError) as e:
            self.errors.append(f"{type(e).__name__}: {e}")

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=15)


def proxy_counters(url: str) -> dict[str, Any]:
    """The proxy's engine protocol errors and retries, from its /metrics (label sets as they come)."""
    wanted = ("calroute_engine_protocol_errors_total", "calroute_retries_total")
    out: dict[str, Any] = {}
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5.0) as r:
            text = r.read().decode()
    except OSError as e:
        return {"error": f"{type(e).__name__}: {e}"}
    for line in text.splitlines():
        if line.startswith(wanted):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out
