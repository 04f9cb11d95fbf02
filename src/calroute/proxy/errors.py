"""The proxy's JSON error answers (OpenAI's shape, written by the server's ``json_error``) and the two ways
a relay can end early."""

from __future__ import annotations

from calroute.proxy.http.server import json_error

__all__ = ["ClientGone", "EngineFailed", "json_error"]


class EngineFailed(Exception):
    """An engine failed (connection, 5xx, timeout) before any output reached the client: retry."""

    def __init__(self, engine_id: str, phase: str, reason: str) -> None:
        super().__init__(reason)
        self.engine_id = engine_id
        self.phase = phase


class ClientGone(ConnectionResetError):
    """The client went away mid-stream: its record is written and the engine is not at fault. A
    ConnectionResetError, which the server (server.py) takes as a closed connection and leaves quiet; not
    an UpstreamError, so no engine-failure path catches it."""
