"""The proxy's error answers (OpenAI's shape, written by the server's ``error_body``): whole, or as the last
event of a stream whose head has gone out; and the two ways a relay can end early."""

from __future__ import annotations

from calroute.errors import CalrouteError
from calroute.proxy.http.messages import error_body, json_error

__all__ = ["ClientGone", "EngineFailed", "error_event", "json_error"]


def error_event(status: int, message: str, kind: str) -> bytes:
    """The end of a stream that failed after its head went out: an error event, then [DONE], as vLLM ends
    a stream it aborts."""
    return b"data: " + error_body(status, message, kind) + b"\n\ndata: [DONE]\n\n"


class EngineFailed(CalrouteError):
    """An engine failed (connection, 5xx, timeout, an answer it could not read) before any output reached
    the client: retry. ``kind``: what was wrong with an answer that came (ProtocolError's kind, or
    "unreadable"); None when none came, or it was a 5xx."""

    def __init__(self, engine_id: str, phase: str, reason: str, kind: str | None = None) -> None:
        super().__init__(reason)
        self.engine_id = engine_id
        self.phase = phase
        self.kind = kind


class ClientGone(CalrouteError, ConnectionResetError):
    """The client went away mid-stream: its record is written and the engine is not at fault. A
    ConnectionResetError, which the server (server.py) takes as a closed connection and leaves quiet; not
    an UpstreamError, so no engine-failure path catches it."""
