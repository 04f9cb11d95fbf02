"""JSON on the proxy's hot path: the client's body read once and written twice (prefill, decode), the
prefill answer and the usage event read. orjson does each in a fraction of the standard library's time
(benchmarks/RESULTS.md, "JSON on the proxy's hot path": -9 % of the proxy's CPU per request). The standard
library stays the fallback for the one value orjson will not write, an integer beyond 64 bits, which a
client may send and an engine should judge.

orjson reads numbers as the standard library does except in two corners, both of which end in a 4xx
either way: NaN and Infinity are not JSON and are refused, and an integer beyond 64 bits reads as a float.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

DecodeError = json.JSONDecodeError  # orjson's own error is a subclass


def loads(data: bytes | str) -> Any:
    """DecodeError if ``data`` is not JSON (or not UTF-8)."""
    return orjson.loads(data)


def dumps(value: Any) -> bytes:
    """Compact JSON bytes."""
    try:
        return orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError: an integer beyond 64 bits
        return json.dumps(value, separators=(",", ":")).encode()
