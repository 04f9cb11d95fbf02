"""The proxy's JSON error answers (OpenAI's shape) and the two ways a relay can end early."""

from __future__ import annotations

from aiohttp import web


def json_error(
    status: int, message: str, kind: str = "BadRequestError", param: str | None = None
) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return web.json_response(body, status=status)


class EngineFailed(Exception):
    """An engine failed (connection, 5xx, timeout) before any output reached the client: retry."""

    def __init__(self, engine_id: str, phase: str, reason: str) -> None:
        super().__init__(reason)
        self.engine_id = engine_id
        self.phase = phase


class ClientGone(ConnectionResetError):
    """The client went away mid-stream: its record is written and the engine is not at fault. A
    ConnectionResetError, which aiohttp's server takes as a premature disconnect and leaves quiet; not an
    aiohttp.ClientError, so no engine-failure path catches it."""
