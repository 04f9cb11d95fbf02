"""What the relay reads in the SSE it forwards."""

from __future__ import annotations

import pytest

from calroute.proxy.http.sse import ABORT_ERROR, MAX_ERROR_BYTES, scan

TOKEN = b'data: {"id":"c","choices":[{"index":0,"text":"hi"}]}\n\n'
USAGE = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7}}\n\n'
DONE = b"data: [DONE]\n\n"
ERROR = b'data: {"error":{"message":"boom","code":500}}\n\n'
ABORT = b'data: {"id":"c","choices":[{"index":0,"text":"x","finish_reason":"abort"}]}\n\n'


@pytest.mark.parametrize(
    ("events", "keep_usage", "sent", "content", "tokens", "error"),
    [
        (TOKEN, False, TOKEN, True, None, None),
        (TOKEN + USAGE + DONE, True, TOKEN + USAGE + DONE, True, 7, None),
        (TOKEN + USAGE + DONE, False, TOKEN + DONE, True, 7, None),  # usage read, then dropped
        (USAGE + DONE, False, DONE, False, 7, None),
        (DONE, False, DONE, False, None, None),
        (ERROR + DONE, False, ERROR + DONE, False, None, '{"error":{"message":"boom","code":500}}'),
        (b'data: {"choices":[],"usage":{"completion_tokens":"x"}}\n\n', True, None, False, None, None),
        (TOKEN + ABORT + DONE, False, None, True, None, ABORT_ERROR),  # vLLM's engine core died mid-stream
    ],
)
def test_scan(
    events: bytes, keep_usage: bool, sent: bytes | None, content: bool, tokens: int | None, error: str | None
) -> None:
    got = scan(events, keep_usage)
    assert got.events == (events if sent is None else sent)
    assert (got.content, got.output_tokens, got.error) == (content, tokens, error)


def test_a_long_error_is_cut() -> None:
    event = b'data: {"error":{"message":"' + b"x" * 1000 + b'"}}\n\n'
    got = scan(event, False)
    assert got.error is not None and len(got.error) == MAX_ERROR_BYTES
