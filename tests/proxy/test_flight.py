"""What the proxy accepts from a client (validate), a request's record, and the read-only answers:
pure functions, table-driven."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from calroute.cluster.file import ClusterEngine, ClusterFile
from calroute.contract import handoff
from calroute.proxy import surface
from calroute.proxy.flight import (
    MAX_DEPTH,
    PROMPT_TYPES,
    Flight,
    Invalid,
    forwarded,
    valid_traceparent,
    valid_tracestate,
    validate,
)
from calroute.proxy.http import codec
from calroute.proxy.oracle import oracle_tokens
from calroute.proxy.prompt_length import PromptLength
from calroute.results.records import record_from_json, record_to_json
from calroute.types import RequestStatus, Role, SloClass

MAX_LEN = 4096
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
RANGE = f"max_tokens must be in [1, {MAX_LEN}], got {{}}"
DEEP = f"{{}} is nested more than {MAX_DEPTH} levels deep (the body counting as one)"


def nest(depth: int) -> Any:
    """Arrays nested ``depth`` deep."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


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
        ({"prompt": "hi", "stream": None}, COMPLETIONS, None),  # null: the default
        # the prompt's forms
        ({"prompt": [1, 2]}, COMPLETIONS, None),
        ({"prompt": ["a", "b"]}, COMPLETIONS, None),
        ({"prompt": [[1], [2, 3]]}, COMPLETIONS, None),
        ({"prompt": []}, COMPLETIONS, None),  # the engine's call
        ({"prompt": 3}, COMPLETIONS, Invalid(f"prompt must be {PROMPT_TYPES}", "prompt")),
        ({"prompt": [1, True]}, COMPLETIONS, Invalid(f"prompt must be {PROMPT_TYPES}", "prompt")),
        ({"prompt": [5, False, 7]}, COMPLETIONS, Invalid(f"prompt must be {PROMPT_TYPES}", "prompt")),
        ({"prompt": [1, 2.0]}, COMPLETIONS, Invalid(f"prompt must be {PROMPT_TYPES}", "prompt")),
        ({"prompt": [0, 1, -3, 2**70]}, COMPLETIONS, None),  # JSON integers all: the engine judges them
        ({"prompt": ["a", 1]}, COMPLETIONS, Invalid(f"prompt must be {PROMPT_TYPES}", "prompt")),
        ({"prompt": [[1], [[2]]]}, COMPLETIONS, Invalid(f"prompt must be {PROMPT_TYPES}", "prompt")),
        ({"prompt": [None]}, COMPLETIONS, Invalid(f"prompt must be {PROMPT_TYPES}", "prompt")),
        ({"messages": [], "prompt": 3}, CHAT, None),  # a chat request's prompt is not read
        # messages
        ({"messages": [{"role": "user", "content": None}]}, CHAT, None),
        ({"messages": [{"role": "user"}]}, CHAT, None),
        ({"messages": [{"role": "u", "content": [{"type": "image_url", "image_url": {}}]}]}, CHAT, None),
        ({"messages": {}}, CHAT, Invalid("messages must be a list of message objects", "messages")),
        ({"messages": [[]]}, CHAT, Invalid("messages[0] must be an object", "messages")),
        ({"messages": [{"role": None}]}, CHAT, Invalid("messages[0].role must be a string", "messages")),
        (
            {"messages": [{"role": "u", "content": 1.5}]},
            CHAT,
            Invalid("messages[0].content must be a string or a list of content parts", "messages"),
        ),
        (
            {"messages": [{"role": "u", "content": [{"type": "text", "text": 7}]}]},
            CHAT,
            Invalid("messages[0].content[0].text must be a string", "messages"),
        ),
        (
            {"messages": [{"role": "u", "content": [{"type": "text", "text": "a"}, 3]}]},
            CHAT,
            Invalid("messages[0].content[1] must be an object", "messages"),
        ),
        (
            {"messages": [{"role": "u", "content": [{"text": "a"}]}]},
            CHAT,
            Invalid("messages[0].content[0].type must be a string", "messages"),
        ),
        # the other fields read
        ({"prompt": "hi", "max_tokens": 2**64}, COMPLETIONS, Invalid(RANGE.format(2**64), "max_tokens")),
        (
            {"prompt": "hi", "stream_options": []},
            COMPLETIONS,
            Invalid("stream_options must be an object", "stream_options"),
        ),
        (
            {"prompt": "hi", "stream_options": {"include_usage": 1}},
            COMPLETIONS,
            Invalid("stream_options.include_usage must be a boolean", "stream_options"),
        ),
        ({"prompt": "hi", "model": 1}, COMPLETIONS, Invalid("model must be a string", "model")),
        ({"prompt": "hi", "n": 1.0}, COMPLETIONS, Invalid("n must be an integer", "n")),
        ({"prompt": "hi", "n": -1}, COMPLETIONS, Invalid("n must be at least 1, got -1", "n")),
        (
            {"prompt": "hi", "min_tokens": False},
            COMPLETIONS,
            Invalid("min_tokens must be an integer", "min_tokens"),
        ),
        (
            {"prompt": "hi", "ignore_eos": "yes"},
            COMPLETIONS,
            Invalid("ignore_eos must be a boolean", "ignore_eos"),
        ),
        # depth: the body counts as one level
        ({"prompt": "hi", "x": nest(MAX_DEPTH - 1)}, COMPLETIONS, None),
        ({"prompt": "hi", "x": nest(MAX_DEPTH)}, COMPLETIONS, Invalid(DEEP.format("x"), "x")),
        ({"prompt": "hi", "x": {"y": nest(MAX_DEPTH)}}, COMPLETIONS, Invalid(DEEP.format("x"), "x")),
        (
            {"messages": [{"role": "u", "x": nest(MAX_DEPTH)}]},
            CHAT,
            Invalid(DEEP.format("messages"), "messages"),
        ),
        ({"messages": [], "prompt": nest(MAX_DEPTH)}, CHAT, Invalid(DEEP.format("prompt"), "prompt")),
    ],
)
def test_validate(body: Any, path: str, expected: Invalid | None) -> None:
    assert validate(body, path, MAX_LEN) == expected


def test_the_depth_limit_is_what_the_encoder_writes_back() -> None:
    """A body at MAX_DEPTH goes out as both handoff bodies through orjson itself, not the fallback (whose
    recursion ends in a RecursionError a few hundred levels further)."""
    body = {"prompt": "hi", "x": nest(MAX_DEPTH - 1)}
    assert validate(body, COMPLETIONS, MAX_LEN) is None
    for out in (handoff.prefill_body(body), handoff.decode_body({**body, "stream": True}, {"a": {"b": 1}})):
        assert orjson.loads(orjson.dumps(out)) == out
    assert orjson.loads(codec.dumps(body)) == body
    with pytest.raises(orjson.JSONEncodeError):  # one more level is more than orjson writes
        orjson.dumps({"x": nest(MAX_DEPTH)})


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("37", 37),
        ("0", None),
        ("-3", None),
        ("²", None),
        ("٣", None),
        ("9" * 5000, None),
        (" 5", None),
        ("9" * 18, 10**18 - 1),
        ("9" * 19, None),
    ],
)
def test_the_oracle_header_is_a_positive_count_or_nothing(value: str | None, expected: int | None) -> None:
    assert oracle_tokens(value) == expected


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"prompt": [5, 6, 7]}, (3, None)),
        ({"prompt": [[5, 6], [7]]}, (3, None)),
        ({"prompt": ["x" * 40, "y" * 40]}, (20, 80)),
        ({"prompt": ["x" * 40]}, (10, 40)),
        ({"prompt": {"a": 1}}, (1, 0)),
        ({"prompt": [True, 1]}, (1, 0)),
        (
            {
                "messages": [
                    {
                        "role": "u",
                        "content": [{"type": "text", "text": "x" * 40}, {"type": "text", "text": 5}],
                    }
                ]
            },
            (11, 43),
        ),
        ({"messages": [{"role": "u", "content": [{"type": "text", "text": ["a"]}, "b", 3]}]}, (1, 3)),
        ({"messages": [{"role": "u", "content": {"text": "x"}}, 7]}, (1, 4)),
        ({"messages": 5}, (1, 0)),
    ],
)
def test_the_prompt_length_of_any_body_without_raising(
    body: dict[str, Any], expected: tuple[int, int | None]
) -> None:
    assert PromptLength(chars_per_token=4.0).estimate(body) == expected


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


TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"  # W3C's own example


def test_only_trace_context_is_forwarded_from_clients() -> None:
    client = {
        "traceparent": TP,
        "Authorization": "Bearer client-secret",
        "Cookie": "x=1",
        "x-calroute-slo": "tight",
        "tracestate": "k=v",
    }
    assert forwarded(client) == {"traceparent": TP, "tracestate": "k=v"}


TRACEPARENTS = [
    (TP, True),
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", True),  # not sampled
    ("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", True),  # a later version
    ("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09-what-comes-next", True),  # may add fields
    ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", False),  # the forbidden version
    ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", False),  # trace-id all zero
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", False),  # parent-id all zero
    ("00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01", False),  # uppercase hex
    ("00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01", False),  # trace-id too short
    ("00-4bf92f3577b34da6a3ce929d0e0e47360-0f067aa0ba902b7-01", False),  # fields misplaced
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1", False),  # flags too short
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g", False),  # flags not hex
    (TP + "-extra", False),  # version 00 is exactly 55 characters
    (TP + "0", False),
    ("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0100", False),  # more, but not after a "-"
    (TP + "\nX-Evil: 1", False),  # the probe's: a line feed and a second header
    ("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-\r\nX-Evil: 1", False),
    ("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-a b", False),  # spaces
    (TP + "\x00", False),
    (" " + TP, False),
    ("", False),
    ("00-abc-def-01", False),
]


@pytest.mark.parametrize(("value", "valid"), TRACEPARENTS)
def test_a_traceparent_is_forwarded_only_when_it_follows_the_w3c_grammar(value: str, valid: bool) -> None:
    assert valid_traceparent(value) is valid
    assert forwarded({"traceparent": value}) == ({"traceparent": value} if valid else {})
    # W3C: a tracestate goes only with a valid traceparent
    assert forwarded({"traceparent": value, "tracestate": "k=v"}) == (
        {"traceparent": value, "tracestate": "k=v"} if valid else {}
    )


TRACESTATES = [
    ("congo=t61rcWkgMzE", True),
    ("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE", True),
    ("rojo=00f067aa0ba902b7 , \tcongo=t61rcWkgMzE", True),  # optional spaces and tabs around commas
    ("rojo=1,,congo=2", True),  # an empty member is allowed
    ("fw529a3039@dt=1,t0_-*/x=v a l", True),  # a multi-tenant key; spaces inside a value
    ("a=" + "v" * 256, True),
    (",".join(f"k{i}=v" for i in range(32)), True),
    (",".join(f"k{i}=v" for i in range(33)), False),  # more than 32 members
    ("a=" + "v" * 257, False),  # a value over 256 characters
    ("a=" + "v" * 255 + ",b=" + "v" * 252, True),  # 512 characters are the most
    ("a=" + "v" * 255 + ",b=" + "v" * 253, False),
    ("Congo=t61", False),  # keys are lowercase
    ("1abc=v", False),  # a simple key begins with a letter
    ("k=v,k=w", False),  # a key appears once
    ("k", False),  # no "="
    ("k=", False),  # an empty value
    ("k=v=w", False),  # "=" inside a value
    ("k=v ", True),  # trailing spaces belong to the separator
    ("k=v\nX-Evil: 1", False),  # control characters
    ("k=v\r", False),
    ("k=v\x00", False),
    ("k=v\x7f", False),
    ("", False),
    (" , ", False),  # nothing in it
]


@pytest.mark.parametrize(("value", "valid"), TRACESTATES)
def test_a_tracestate_is_forwarded_only_when_it_follows_the_w3c_grammar(value: str, valid: bool) -> None:
    assert valid_tracestate(value) is valid
    expected = {"traceparent": TP, **({"tracestate": value} if valid else {})}
    assert forwarded({"traceparent": TP, "tracestate": value}) == expected  # an invalid one alone is dropped
