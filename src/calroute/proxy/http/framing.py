"""HTTP/1.1 body framing the proxy writes, and the error for framing it cannot read.

The proxy writes chunked bodies in two places, a handler's Stream (server.py) and the SSE relay, which
writes to the client's transport from the engine connection's data callback (relay.py): both frame with
``chunk``. Reading framing is httptools' (reader.py, connection.py).
"""

from __future__ import annotations

from calroute.errors import CalrouteError

LAST_CHUNK = b"0\r\n\r\n"


class FramingError(CalrouteError, ValueError):
    """The bytes are not HTTP/1.1 framing that the proxy reads."""


def chunk(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked body (``data`` not empty: an empty chunk ends the body)."""
    return b"%x\r\n%b\r\n" % (len(data), data)
