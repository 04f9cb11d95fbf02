"""What the proxy reads in a decode engine's SSE stream while relaying it untouched (almost).

The relay forwards whole network reads; this looks at the complete events of one read for the three
things the router needs: whether a content event came (first and last token times), the usage event (the
token count; dropped again when the client did not ask for usage) and an error event or an abort. A pure
function over bytes, with no state and no parse of every event (only the usage event is parsed, once per
stream, for its token count and, on a local prefill's stream, what the engine served from its cache).

Any JSON spacing reads alike: vLLM writes compact JSON (``"choices":[{``), an engine built on Python's json
module writes ``"choices": [{``. Each thing is looked for first in its compact form, a substring test as
cheap as it gets; a read whose content event is compact comes from a compact writer and needs nothing
more. Otherwise a regular expression that allows spacing looks, where the key is present at all.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from calroute.proxy.http import codec

_S = rb"[ \t]*"  # JSON's optional spacing, within one line (an SSE data line)
CONTENT = b'"choices":[{'  # a choice: a token, or the role
USAGE = b'"choices":[]'  # vLLM's usage-only chunk
ERROR = b'data: {"error"'
# vLLM ends a request whose engine core died (or that was aborted) with this finish reason and [DONE]: the
# answer is cut short without an error event. The proxy never aborts a request it is still relaying.
ABORT = b'"finish_reason":"abort"'
_CONTENT = re.compile(rb'"choices"' + _S + rb":" + _S + rb"\[" + _S + rb"\{")
_USAGE = re.compile(rb'"choices"' + _S + rb":" + _S + rb"\[" + _S + rb"\]")
_ERROR = re.compile(rb"^data:" + _S + rb"\{" + _S + rb'"error"' + _S + rb":", re.MULTILINE)
_ABORT = re.compile(rb'"finish_reason"' + _S + rb":" + _S + rb'"abort"')
ABORT_ERROR = "the decode engine aborted the request (finish_reason abort)"
# What a decode stream may hold, as OpenAI's API streams it: events of ``data:`` lines, each a JSON object on
# one line or ``[DONE]``, and the SSE fields a server may add (``event``, ``id``, ``retry``, a ``:`` comment);
# blank lines between events. Anything else (an HTML page from a gateway, a half-written engine) is not
# relayed: a client must never read bytes it cannot parse as the stream it asked for. One regular expression
# over each read's complete events: linear in their bytes, about a microsecond for a token's event.
_LINE = rb"(?:data:" + _S + rb"(?:\{[^\n]*\}|\[DONE\])" + _S + rb"|(?:event|id|retry)(?::[^\n]*)?|:[^\n]*)\n"
_EVENTS = re.compile(rb"(?:(?:" + _LINE + rb")*\n)+")
MAX_ERROR_BYTES = 300


class Scan(NamedTuple):
    events: bytes  # what to send on to the client
    content: bool  # a token (or the role) came
    output_tokens: int | None  # from the usage event, when there was one
    error: str | None  # an error event's JSON, cut to MAX_ERROR_BYTES
    usage: dict[str, Any] | None = None  # the usage event's usage object, as the engine wrote it


def _find(events: bytes, compact: bytes, spaced: re.Pattern[bytes], key: bytes) -> int:
    """Where ``compact`` or its spaced form starts; -1."""
    at = events.find(compact)
    if at >= 0 or key not in events:
        return at
    found = spaced.search(events)
    return -1 if found is None else found.start()


def well_formed(events: bytes) -> bool:
    """``events`` (complete SSE events) are all a decode stream may hold."""
    return _EVENTS.fullmatch(events) is not None


def scan(events: bytes, keep_usage: bool) -> Scan:
    """``events``: complete SSE events (ending with a blank line)."""
    # The common read, a compact writer's token: substring tests alone, no call.
    compact = content = CONTENT in events
    if not compact:
        content = _find(events, CONTENT, _CONTENT, b'"choices"') >= 0
    output_tokens = None
    usage = None
    usage_at = events.find(USAGE) if compact else _find(events, USAGE, _USAGE, b'"choices"')
    if usage_at >= 0:
        start = events.rfind(b"data:", 0, usage_at)
        end = events.find(b"\n\n", usage_at) + 2
        try:
            found = codec.loads(events[start + 5 : end])["usage"]
            output_tokens = int(found["completion_tokens"])
            usage = found
        except (ValueError, KeyError, TypeError):
            pass
        if not keep_usage:
            events = events[:start] + events[end:]
    error = None
    error_at = events.find(ERROR) if compact else _find(events, ERROR, _ERROR, b'"error"')
    if error_at >= 0:
        start = events.find(b"{", error_at)
        error = events[start : start + MAX_ERROR_BYTES].split(b"\n", 1)[0].decode(errors="replace")
    elif (ABORT in events) if compact else _find(events, ABORT, _ABORT, b'"abort"') >= 0:
        error = ABORT_ERROR
    return Scan(events, content, output_tokens, error, usage)
