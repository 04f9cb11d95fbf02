"""What the relay reads in the SSE it forwards, whatever the engine's JSON spacing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from calroute.proxy.http.sse import ABORT_ERROR, MAX_ERROR_BYTES, scan, well_formed

COMPACT = {"separators": (",", ":")}  # as vLLM writes
SPACED: dict[str, Any] = {}  # as Python's json.dumps writes by default: ", " and ": "

TEXT = {"id": "c", "choices": [{"index": 0, "text": "hi", "finish_reason": None}]}  # /v1/completions
ROLE = {"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant"}}]}  # /v1/chat/completions
DELTA = {"id": "c", "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]}
USAGE = {"id": "c", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 7}}
BAD_USAGE = {"choices": [], "usage": {"completion_tokens": "x"}}
ERROR = {"error": {"message": "boom", "code": 500}}
ABORT = {"id": "c", "choices": [{"index": 0, "text": "x", "finish_reason": "abort"}]}
DONE = b"data: [DONE]\n\n"


def event(value: dict[str, Any], spacing: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(value, **spacing).encode() + b"\n\n"


@pytest.mark.parametrize("spacing", [COMPACT, SPACED], ids=["compact", "spaced"])
@pytest.mark.parametrize(
    ("values", "keep_usage", "sent", "content", "tokens", "error"),
    [
        ([TEXT], False, [TEXT], True, None, None),
        ([ROLE, DELTA], False, [ROLE, DELTA], True, None, None),
        ([TEXT, USAGE, DONE], True, [TEXT, USAGE, DONE], True, 7, None),
        ([TEXT, USAGE, DONE], False, [TEXT, DONE], True, 7, None),  # usage read, then dropped
        ([DELTA, USAGE, DONE], False, [DELTA, DONE], True, 7, None),
        ([USAGE, DONE], False, [DONE], False, 7, None),
        ([DONE], False, [DONE], False, None, None),
        ([ERROR, DONE], False, [ERROR, DONE], False, None, "error"),
        ([BAD_USAGE], True, [BAD_USAGE], False, None, None),
        ([TEXT, ABORT, DONE], False, [TEXT, ABORT, DONE], True, None, ABORT_ERROR),  # the engine core died
        ([DELTA, ERROR, DONE], False, [DELTA, ERROR, DONE], True, None, "error"),
    ],
)
def test_scan(
    values: list[Any],
    keep_usage: bool,
    sent: list[Any],
    content: bool,
    tokens: int | None,
    error: str | None,
    spacing: dict[str, Any],
) -> None:
    def wire(items: list[Any]) -> bytes:
        return b"".join(v if isinstance(v, bytes) else event(v, spacing) for v in items)

    got = scan(wire(values), keep_usage)
    assert got.events == wire(sent)
    assert (got.content, got.output_tokens) == (content, tokens)
    assert got.usage == (USAGE["usage"] if tokens is not None else None)  # as the engine wrote it
    if error == "error":  # the error event's JSON, as the engine wrote it
        assert got.error == json.dumps(ERROR, **spacing)
    else:
        assert got.error == error


@pytest.mark.parametrize(
    "events",
    [
        b'data: {"id":"c","choices":[{"delta":{"content":"say \\"choices\\": [] and \\"error\\""}}]}\n\n',
        b'data: {"model":"choices","choices":[{"text":"[]"}]}\n\n',
    ],
)
def test_look_alikes_inside_strings_are_not_usage_or_errors(events: bytes) -> None:
    got = scan(events, False)
    assert (got.events, got.content, got.output_tokens, got.error) == (events, True, None, None)


def test_a_long_error_is_cut() -> None:
    event = b'data: {"error":{"message":"' + b"x" * 1000 + b'"}}\n\n'
    got = scan(event, False)
    assert got.error is not None and len(got.error) == MAX_ERROR_BYTES


@pytest.mark.parametrize(
    ("events", "ok"),
    [
        (event(TEXT, COMPACT) + event(USAGE, SPACED) + DONE, True),
        (b'data:{"a":1}\n\n', True),  # no space after the colon, as SSE allows
        (b'data: {"a":1} \n\n', True),
        (b': keep-alive\n\nevent: message\nid: 7\nretry: 1000\ndata: {"a":1}\n\n', True),
        (b"\n\n" + DONE, True),  # a blank line between events
        (b"<html>\n\n<body>502 Bad Gateway</body>\n\n", False),  # a gateway's page
        (b'data: {"a":1\n\n', False),  # a JSON object cut short
        (b"data: hello\n\n", False),  # data that is no JSON object
        (b"data: [DONE] and more\n\n", False),
        (b'field: {"a":1}\n\n', False),  # no SSE field
        (b'data: {"a":1}\r\n\r\n', False),  # CRLF: not how a decode engine writes
    ],
)
def test_only_sse_events_of_json_objects_are_well_formed(events: bytes, ok: bool) -> None:
    assert well_formed(events) is ok
