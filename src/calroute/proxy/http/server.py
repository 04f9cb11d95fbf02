"""The proxy's HTTP/1.1 server: one asyncio Protocol per client connection, a handler task per request.

The proxy's few routes need little of a web framework, and every request passes through this server, so it
is small: requests are parsed by httptools (llhttp) from the connection's data callback (reader.py, which
bounds everything a request may make the server wait for and hold as it is read), one handler task runs per
request, answers are written straight to the transport (benchmarks/RESULTS.md, "The proxy's own HTTP
server"). This file is the connection's life and its answers; what it guarantees:

- HTTP/1.1 and 1.0, keep-alive (1.1's default, 1.0's on request), pipelined requests answered in order
  (read ahead while an answer is under way; reading pauses once a whole request waits); an idle
  connection is closed after ``keepalive_timeout_s`` (ClientLimits, proxy/config.py), with no answer.
- Past ``max_client_connections`` a new connection gets a 503 and is closed before anything is read (the other
  limits: reader.py; docs/proxy.md, "Client limits").
- A client that shuts its side (a half-close) gets the answers to the requests it sent whole, then the
  close; a request cut short by it gets 400. A half-close and a close look alike until the server writes:
  so that a client that left still cancels its handler, an HTTP/1.1 client whose answer has not begun gets
  a 100 Continue at once, which a closed socket answers with a reset, looked for every EOF_PROBE_S.
- ``Expect: 100-continue`` answered once the request is next in line.
- A request the reader refuses (reader.py: 400, 408, 413, 431, 503) ends the connection: it is
  answered in its turn, then what the client still sends is read and dropped for LINGER_S, so that a close
  does not reset the answer away. An unknown route gets 404, a wrong method 405. All with JSON bodies in
  OpenAI's error shape (``json_error``).
- A client that goes away cancels its request's handler (the proxy records it as cancelled).
- A handler that raises gets a 500 (or, once its response has started, its connection closed).
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import socket
import time
from collections.abc import Mapping
from typing import cast

from calroute.proxy.config import ClientLimits
from calroute.proxy.http.head import status_line
from calroute.proxy.http.messages import Handler, Request, Response, Stream, json_error
from calroute.proxy.http.reader import RequestReader, _Refusal

__all__ = ["Server"]

logger = logging.getLogger(__name__)

# After refusing a request whose body is still coming, read and drop it this long before closing: a close
# with unread data sends a reset, and the client may lose the answer before it reads it.
LINGER_S = 2.0
# After a client shuts its side while its answer is under way: how often to look whether it closed for good.
# A half-close and a close look alike (a FIN) until the server writes: a 100 Continue (which an HTTP/1.1
# client must read past) draws a reset from a closed socket, and the reset shows in the socket's TCP state.
EOF_PROBE_S = 0.25
_TCP_CLOSE = 7  # tcp_states.h
_KINDS = {408: "RequestTimeout", 413: "RequestTooLarge", 503: "ServiceUnavailable"}


class _Connection(RequestReader, asyncio.Protocol):
    """One client connection. Its bytes go to the parser as they arrive (RequestReader); each request read
    whole waits in a queue for its turn; one handler task at a time answers."""

    def __init__(self, server: Server) -> None:
        super().__init__(server, self)
        self._server = server
        self.transport: asyncio.Transport | None = None
        self._task: asyncio.Task[None] | None = None
        self._idle: asyncio.TimerHandle | None = None  # the idle timeout, or the linger after a refusal
        self._eof = False  # the client shut its side: answer what was read, then close
        self._drained: asyncio.Future[None] | None = None
        # The request being answered.
        self.http11 = True
        self.keep_alive = True
        self.started = False  # the current answer's head went out

    # ---- asyncio callbacks ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        server = self._server
        if len(server.connections) >= self._limits.max_client_connections:
            # Answered, not just closed: the client learns why, and that it may try again.
            self.keep_alive = self._reading = False
            message = f"the proxy has {len(server.connections)} client connections open, its limit"
            self._write(self._whole(json_error(503, message, _KINDS[503])))
            return self._close()
        server.connections.add(self)
        self._arm_idle()

    def data_received(self, data: bytes) -> None:
        if not self._reading:
            return
        self._take(data)
        if self._task is None:
            self._next()
        elif self._queue and self.transport is not None:
            self.transport.pause_reading()  # a client pipelining ahead waits for its answers
        self._arm_deadline()

    def eof_received(self) -> bool:
        """The client shut its side of the connection (a half-close): what it sent whole is answered, then
        the connection closed; a request cut short is refused."""
        self._eof = True
        if self._reading and self._phase:
            self._refuse_later(_Refusal(400, "the client ended the connection before its request was whole"))
        self._reading = False
        self._cancel_deadline()
        if self._task is None:
            self._next()
        if self._task is None:
            return False  # nothing under way: the transport closes
        if self.http11 and not self.started:
            self._write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self._probe()
        return True  # an answer under way keeps the transport open

    def _probe(self) -> None:
        """While the answer to a client that shut its side is under way, end it if the client has gone
        (its socket answered the 100 Continue with a reset), as when a client closes mid-request."""
        if self._task is None or self.transport is None or self.transport.is_closing():
            return
        try:
            sock = self.transport.get_extra_info("socket")
            state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]
        except (AttributeError, OSError):  # no TCP socket (a test's fake transport), or not Linux
            return
        if state == _TCP_CLOSE:
            self.transport.abort()  # connection_lost cancels the handler
        else:
            self._loop.call_later(EOF_PROBE_S, self._probe)

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        self._release()
        self._cancel_deadline()
        if self._idle is not None:
            self._idle.cancel()
        if self._task is not None:
            self._task.cancel()  # the proxy's handler records the request as cancelled
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def pause_writing(self) -> None:
        if self._drained is None or self._drained.done():
            self._drained = self._loop.create_future()

    def resume_writing(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    async def drain(self) -> None:
        if self._drained is not None and not self._drained.done():
            await self._drained

    # ---- what the reader asks of the connection ------------------------------------------------------

    def _busy(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _queued(self) -> None:
        if self._task is None:
            self._next()

    # ---- answering -----------------------------------------------------------------------------------

    def _next(self) -> None:
        """With no answer under way: start answering the next request read, or, if the one being read
        waits for it, say 100 Continue."""
        if self._queue:
            item = self._queue.popleft()
            if isinstance(item, _Refusal):
                return self._refuse(item.status, item.message)
            if self._idle is not None:
                self._idle.cancel()
                self._idle = None
            self.http11, self.keep_alive, self.started = item.http11, item.keep_alive, False
            self._task = self._loop.create_task(self._answer(item))
        elif self._continue_owed:
            self._continue_owed = False
            self._write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _refuse(self, status: int, message: str) -> None:
        """A request that cannot be read: answer it and close, as what follows it cannot be framed."""
        self.keep_alive = self._reading = False
        self._queue.clear()
        self._cancel_deadline()
        self._write(self._whole(json_error(status, message, _KINDS.get(status, "BadRequestError"))))
        transport = self.transport
        if transport is None or transport.is_closing() or not transport.can_write_eof():
            return self._close()
        transport.resume_reading()  # read and drop what the client still sends
        transport.write_eof()
        if self._idle is not None:
            self._idle.cancel()
        self._idle = self._loop.call_later(LINGER_S, self._close)

    async def _answer(self, request: Request) -> None:
        try:
            answer = await self._server.route(request)
            if isinstance(answer, Response):
                if self.started:
                    raise RuntimeError("a whole answer after a streamed one began")
                self._write(self._whole(answer))
            elif not answer.ended:
                await answer.write_eof()
        except asyncio.CancelledError:
            self._task = None
            self._close()
            raise
        except ConnectionError:
            self.keep_alive = False
        except Exception:
            logger.exception("handler for %s %s failed", request.method, request.path)
            self.keep_alive = False
            if not self.started:
                self._write(
                    self._whole(
                        json_error(500, "internal error in the proxy (see its log)", "InternalServerError")
                    )
                )
        self._task = None
        if not self.keep_alive or (self._eof and not self._queue):
            self._close()
        elif self.transport is not None and not self.transport.is_closing():
            if not self._phase:  # else the next request's head or body is under its deadline
                self._arm_idle()
            self._next()
            if not self._queue:
                self.transport.resume_reading()
            self._arm_deadline()

    def _whole(self, r: Response) -> bytes:
        framing = "" if self.keep_alive else "Connection: close\r\n"
        extra = "".join(f"{k}: {v}\r\n" for k, v in r.headers.items())
        head = (
            f"{status_line(r.status)}{self.common_headers()}Content-Type: {r.content_type}\r\n{extra}"
            f"Content-Length: {len(r.body)}\r\n{framing}\r\n"
        )
        return head.encode() + r.body

    def common_headers(self) -> str:
        return f"Date: {self._server.date()}\r\nServer: calroute\r\n"

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _arm_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        self._idle = self._loop.call_later(self._limits.keepalive_timeout_s, self._close)

    def _close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()  # after what is buffered has gone out


class Server:
    """Routes: exact paths, each with the methods it takes."""

    def __init__(self, routes: Mapping[tuple[str, str], Handler], limits: ClientLimits) -> None:
        self._routes = dict(routes)
        self._paths = {path for _, path in routes}
        self.limits = limits
        self.connections: set[_Connection] = set()
        self.buffered_body_bytes = 0  # of requests being read, on every connection
        self._server: asyncio.Server | None = None
        self._date_s = -1
        self._date = ""

    def date(self) -> str:
        now_s = int(time.time())
        if now_s != self._date_s:
            self._date_s, self._date = now_s, email.utils.formatdate(now_s, usegmt=True)
        return self._date

    async def route(self, request: Request) -> Response | Stream:
        handler = self._routes.get((request.method, request.path))
        if handler is not None:
            return await handler(request)
        if request.path in self._paths:
            allowed = ", ".join(sorted(m for m, p in self._routes if p == request.path))
            message = f"{request.method} is not allowed on {request.path}: use {allowed}"
            return json_error(405, message, "MethodNotAllowed")
        return json_error(404, f"no route {request.path}", "NotFound")

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the port (the one chosen when ``port`` is 0)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), host, port, backlog=1024)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop listening, give requests under way ``grace_s`` to finish, then close every connection."""
        if self._server is not None:
            self._server.close()
        deadline = time.monotonic() + grace_s
        while any(c._task is not None for c in self.connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for c in list(self.connections):
            if c._task is not None:
                c._task.cancel()
            if c.transport is not None:
                c.transport.close()
        if self._server is not None:
            await self._server.wait_closed()
