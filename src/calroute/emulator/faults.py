"""The faults an emulated engine can be told to show at run time (``POST /_calroute/faults``,
docs/engines.md), and the bad answers of its bad_answer fault, written at the socket level as a broken or
hostile engine would (server.py serves them)."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from calroute.emulator import api


@dataclass
class Faults:
    """Faults an engine can be told to show (all off by default)."""

    error_rate: float = 0.0  # fraction of completion requests answered with HTTP error_status
    error_status: int = 500  # 500 (an engine bug) or 503 (vLLM's answer when the engine core is dead)
    stall: bool = False  # accept completion requests and never answer (a stream gets its head first)
    slowdown: float = 1.0  # every iteration takes this many times longer
    refuse_kv_pulls: bool = False  # the prefill side refuses decode engines' pulls
    metrics_down: bool = False  # /metrics answers 503 while generation keeps working
    bad_answer_rate: float = 0.0  # fraction of generation requests answered badly, as bad_answer says
    bad_answer: str = "oversized"  # one of BAD_ANSWERS

    def validate(self) -> None:
        if not 0.0 <= self.error_rate <= 1.0:
            raise api.ApiError(400, f"error_rate must be in [0, 1], got {self.error_rate}", "error_rate")
        if self.error_status not in (500, 502, 503, 504):
            raise api.ApiError(
                400, f"error_status must be a 5xx server error, got {self.error_status}", "error_status"
            )
        if self.slowdown < 1.0:
            raise api.ApiError(400, f"slowdown must be >= 1, got {self.slowdown}", "slowdown")
        if isinstance(self.bad_answer_rate, bool) or not isinstance(self.bad_answer_rate, (int, float)):
            raise api.ApiError(400, "bad_answer_rate must be a number", "bad_answer_rate")
        if not 0.0 <= self.bad_answer_rate <= 1.0:
            raise api.ApiError(
                400, f"bad_answer_rate must be in [0, 1], got {self.bad_answer_rate}", "bad_answer_rate"
            )
        if self.bad_answer not in BAD_ANSWERS:
            raise api.ApiError(
                400,
                f"bad_answer must be one of {', '.join(BAD_ANSWERS)}, got {self.bad_answer!r}",
                "bad_answer",
            )


# The bad_answer fault's kinds. Sizes: well over the proxy's caps (AnswerLimits.max_answer_bytes, 16 MiB, for
# a whole answer; max_event_bytes, 1 MiB, for one SSE event), written a piece at a time.
BAD_ANSWERS = ("oversized", "malformed", "not_json")
OVERSIZED_BODY_BYTES = 32 * 1024 * 1024  # a non-stream answer's JSON body
OVERSIZED_EVENT_BYTES = 4 * 1024 * 1024  # a stream's first SSE event, with no blank line
MALFORMED_SENT_BYTES = 100  # of a Content-Length twice as large, then a close
_PIECE = b"x" * (256 * 1024)
NOT_JSON_BODY = b"<html><body><h1>502 Bad Gateway</h1></body></html>\n"


async def bad_answer(request: web.Request, kind: str, stream: bool) -> web.StreamResponse:
    """Answer a generation request as the bad_answer fault says, at the socket level:

    - oversized: a 200 whose body (JSON, Content-Length OVERSIZED_BODY_BYTES) or first SSE event (``data:
      `` then OVERSIZED_EVENT_BYTES with no line break, then the end of the stream) is far over the proxy's
      caps; written in 256 KiB pieces, each once the last has drained, so the emulator holds none whole;
    - malformed: broken framing, then a close: a stream's chunked body starts with a chunk size that is no
      hex number; a JSON answer announces a Content-Length twice what it sends;
    - not_json: a 200 with the Content-Type the client expects and an HTML body (not JSON, nor SSE).
    """
    transport = request.transport
    if kind == "oversized":
        if stream:
            resp = web.StreamResponse(
                headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
            )
            await resp.prepare(request)
            await resp.write(b"data: ")
            total = OVERSIZED_EVENT_BYTES
        else:
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            resp.content_length = OVERSIZED_BODY_BYTES
            await resp.prepare(request)
            head = b'{"id":"cmpl-oversized","pad":"'
            await resp.write(head)
            total = OVERSIZED_BODY_BYTES - len(head) - 2
        for at in range(0, total, len(_PIECE)):
            await resp.write(_PIECE[: min(len(_PIECE), total - at)])  # write() drains before it returns
        if not stream:
            await resp.write(b'"}')
        await resp.write_eof()
        return resp
    if kind == "malformed":
        if stream:
            resp = web.StreamResponse(
                headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
            )
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            if transport is not None:  # past aiohttp's chunk writer: a size line that is no hex number
                transport.write(b"zz\r\ndata: {}\n\n\r\n")
        else:
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            resp.content_length = 2 * MALFORMED_SENT_BYTES
            await resp.prepare(request)
            await resp.write(b'{"id":"cmpl-malformed","pad":"'.ljust(MALFORMED_SENT_BYTES, b"x"))
        if transport is not None:
            transport.close()  # aiohttp's own end of the response then fails quietly on the closed transport
        return resp
    content_type = "text/event-stream" if stream else "application/json"
    return web.Response(body=NOT_JSON_BODY, headers={"Content-Type": content_type})
