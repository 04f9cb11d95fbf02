"""A raw HTTP/1.1 engine on 127.0.0.1 for the client's tests (test_client.py, test_answer.py): it answers as
its handler writes, byte for byte, and counts connections and requests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from calroute.proxy.http.client import Endpoint

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, bytes], Awaitable[bool]]
BODY = {"prompt": "hi", "max_tokens": 3, "stream": True}


class Engine:
    """A raw HTTP/1.1 server: reads each request (head and Content-Length body), lets ``handler`` answer,
    and counts connections and requests."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.bodies: list[bytes] = []
        self.heads: list[bytes] = []

    async def __aenter__(self) -> Endpoint:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.endpoint = Endpoint(f"http://127.0.0.1:{port}", keepalive_s=4.0)
        return self.endpoint

    async def __aexit__(self, *exc: object) -> None:
        self.endpoint.close()
        self.server.close()

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                body = await r.readexactly(length)
                self.heads.append(head)
                self.bodies.append(body)
                if not await self.handler(r, w, body):
                    break
                await w.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            w.close()


async def json_answer(r: asyncio.StreamReader, w: asyncio.StreamWriter, body: bytes) -> bool:
    out = json.dumps({"echo": json.loads(body)}).encode()
    w.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(out) + out
    )
    return True


def sse_head(w: asyncio.StreamWriter) -> None:
    w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")


def sse_chunk(w: asyncio.StreamWriter, i: int) -> None:
    event = b'data: {"n": %d}\n\n' % i
    w.write(b"%x\r\n%s\r\n" % (len(event), event))


def collect(into: list[bytes]) -> Callable[[bytes], bool]:
    def on_part(part: bytes) -> bool:
        into.append(part)
        return True

    return on_part


def run(coro: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 10.0))
