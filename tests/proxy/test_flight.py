"""What the proxy accepts from a client (validate), a request's record, and the read-only answers:
pure functions, table-driven."""

from __future__ import annotations

from typing import Any

import pytest

from calroute.engines.cluster import ClusterEngine, ClusterFile
from calroute.proxy import surface
from calroute.proxy.flight import Flight, Invalid, forwarded, validate
from calroute.results.records import record_from_json, record_to_json
from calroute.types import RequestStatus, Role, SloClass

MAX_LEN = 4096
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"


@pytest.mark.parametrize(
    ("body", "path", "expected"),
    [
        ({"prompt": "hi"}, COMPLETIONS, None),
        ({"prompt": "hi", "max_tokens": 1, "stream": True}, COMPLETIONS, None),
        ({"prompt": "hi", "max_tokens": MAX_LEN}, COMPLETIONS, None),
        ({"messages": [], "max_completion_tokens": 8}, CHAT, None),
        ({"prompt": "hi", "max_tokens": None}, COMPLETIONS, None),  # null means the default
        ([{"prompt": "hi"}], COMPLETIONS, Invalid("the request body must be a JSON object")),
        ("hi", COMPLETIONS, Invalid("the request body must be a JSON object")),
        ({"messages": []}, COMPLETIONS, Invalid("prompt is required", "prompt")),
        ({"prompt": "hi"}, CHAT, Invalid("messages is required", "messages")),
        (
            {"prompt": "hi", "max_tokens": "8"},
            COMPLETIONS,
            Invalid("max_tokens must be an integer", "max_tokens"),
        ),
        (
            {"prompt": "hi", "max_tokens": 8.0},
            COMPLETIONS,
            Invalid("max_tokens must be an integer", "max_tokens"),
        ),
        (
            {"prompt": "hi", "max_tokens": True},
            COMPLETIONS,
            Invalid("max_tokens must be an integer", "max_tokens"),
        ),
        (
            {"prompt": "hi", "max_tokens": 0},
            COMPLETIONS,
            Invalid(f"max_tokens must be in [1, {MAX_LEN}], got 0", "max_tokens"),
        ),
        (
            {"prompt": "hi", "max_tokens": -5},
            COMPLETIONS,
            Invalid(f"max_tokens must be in [1, {MAX_LEN}], got -5", "max_tokens"),
        ),
        (
            {"messages": [], "max_completion_tokens": MAX_LEN + 1},
            CHAT,
            Invalid(
                f"max_completion_tokens must be in [1, {MAX_LEN}], got {MAX_LEN + 1}", "max_completion_tokens"
            ),
        ),
        ({"prompt": "hi", "stream": "yes"}, COMPLETIONS, Invalid("stream must be a boolean", "stream")),
        ({"prompt": "hi", "stream": 1}, COMPLETIONS, Invalid("stream must be a boolean", "stream")),
    ],
)
def test_validate(body: Any, path: str, expected: Invalid | None) -> None:
    assert validate(body, path, MAX_LEN) == expected


def test_a_flight_becomes_one_record_in_the_shared_schema() -> None:
    f = Flight("r1", 1.0, SloClass.TIGHT, 128, 500, 16, predicted=20, prefill_id="p0", decode_id="d1")
    f.prefill_done_s, f.first_token_s, f.last_token_s, f.output_tokens = 1.1, 1.2, 1.5, 16
    rec = f.record("round_robin", RequestStatus.OK, None)
    assert rec.ttft_s == pytest.approx(0.2)
    assert rec.tpot_s == pytest.approx(0.3 / 15)
    back = record_from_json(record_to_json(rec))
    assert (back.request_id, back.policy, back.prefill_id, back.decode_id) == (
        "r1",
        "round_robin",
        "p0",
        "d1",
    )
    assert (back.prompt_tokens, back.output_tokens, back.status) == (128, 16, RequestStatus.OK)


def _cluster() -> ClusterFile:
    return ClusterFile(
        "emulated",
        "m",
        MAX_LEN,
        (
            ClusterEngine("p0", Role.PREFILL, "http://127.0.0.1:1", 1000),
            ClusterEngine("p1", Role.PREFILL, "http://127.0.0.1:2", 1000),
            ClusterEngine("d0", Role.DECODE, "http://127.0.0.1:3", 1000),
        ),
    )


@pytest.mark.parametrize(
    ("healthy", "status", "counts"),
    [
        ({"p0": True, "p1": True, "d0": True}, 200, (2, 1)),
        ({"p0": False, "p1": True, "d0": True}, 200, (1, 1)),
        ({"p0": False, "p1": False, "d0": True}, 503, (0, 1)),
        ({"p0": True, "p1": True, "d0": False}, 503, (2, 0)),
    ],
)
def test_health_needs_an_engine_in_each_pool(
    healthy: dict[str, bool], status: int, counts: tuple[int, int]
) -> None:
    body, got = surface.health(_cluster(), healthy)
    assert got == status
    assert (body["prefill_instances"], body["decode_instances"]) == counts
    assert body["status"] == ("ok" if status == 200 else "unavailable")


def test_models_lists_the_one_model_as_vllm_does() -> None:
    listing = surface.models(_cluster())
    assert listing["object"] == "list"
    assert [(m["id"], m["max_model_len"], m["owned_by"]) for m in listing["data"]] == [("m", MAX_LEN, "vllm")]


def test_only_trace_context_is_forwarded_from_clients() -> None:
    client = {
        "traceparent": "00-abc-def-01",
        "Authorization": "Bearer client-secret",
        "Cookie": "x=1",
        "x-calroute-slo": "tight",
        "tracestate": "k=v",
    }
    assert forwarded(client) == {"traceparent": "00-abc-def-01", "tracestate": "k=v"}
