"""What the proxy reads in a decode engine's SSE stream while relaying it untouched (almost).

The relay forwards whole network reads; this looks at the complete events of one read for the three
things the router needs: whether a content event came (first and last token times), the usage event (the
token count; dropped again when the client did not ask for usage) and an error event or an abort. A pure
function over bytes: no parse of every event, no state.
"""

from __future__ import annotations

from typing import NamedTuple

from calroute.proxy.http import codec

CONTENT = b'"choices":[{'
USAGE = b'"choices":[]'  # vLLM's usage-only chunk
ERROR = b'data: {"error"'
# vLLM ends a request whose engine core died (or that was aborted) with this finish reason and [DONE]: the
# answer is cut short without an error event. The proxy never aborts a request it is still relaying.
ABORT = b'"finish_reason":"abort"'
ABORT_ERROR = "the decode engine aborted the request (finish_reason abort)"
MAX_ERROR_BYTES = 300


class Scan(NamedTuple):
    events: bytes  # what to send on to the client
    content: bool  # a token (or the role) came
    output_tokens: int | None  # from the usage event, when there was one
    error: str | None  # an error event's JSON, cut to MAX_ERROR_BYTES


def scan(events: bytes, keep_usage: bool) -> Scan:
    """``events``: complete SSE events (ending with a blank line)."""
    output_tokens = None
    usage_at = events.find(USAGE)
    if usage_at >= 0:
        start = events.rfind(b"data: ", 0, usage_at)
        end = events.find(b"\n\n", usage_at) + 2
        try:
            output_tokens = int(codec.loads(events[start + 6 : end])["usage"]["completion_tokens"])
        except (ValueError, KeyError, TypeError):
            pass
        if not keep_usage:
            events = events[:start] + events[end:]
    error = None
    error_at = events.find(ERROR)
    if error_at >= 0:
        cut = events[error_at + 6 : error_at + 6 + MAX_ERROR_BYTES]
        error = cut.split(b"\n", 1)[0].decode(errors="replace")
    elif ABORT in events:
        error = ABORT_ERROR
    return Scan(events, CONTENT in events, output_tokens, error)
