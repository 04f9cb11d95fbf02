"""In-memory fake engines behind the proxy's engine-client protocol (proxy/engine_client.py), and a whole
proxy serving on loopback with them behind it: no engine processes, no engine sockets.

A fake prefill engine answers NixlConnector's handoff as vLLM does (``usage`` and ``kv_transfer_params``
naming the blocks it holds); a fake decode engine "pulls" them (each once: params reused or from a prefill
engine that refuses pulls get an HTTP 500, as vLLM's failed pull) and answers JSON or SSE, completions or
chat, with a usage chunk when asked. Their ``faults`` follow the fault matrix (docs/faults.md): an HTTP
status, a connection that fails before any answer, a stall (a stream gets its head first, as from vLLM),
an empty stream, a stream cut after some pieces, a slow first byte, /metrics or the whole engine gone. And
hostile answers, as the real client reports them (proxy/http/client.py): a whole answer far over its cap,
an SSE event that never ends, bytes that are not HTTP framing (a ProtocolError where the parser would fail).

Silence is bounded as the real client bounds it: a wait longer than the request's ``read_timeout_s`` (for
the head, or between two pieces) raises TimeoutError after ``read_timeout_s``.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from calroute.cluster.file import ClusterFile
from calroute.contract.tokenizer import Tokenizer
from calroute.emulator.api import EmulatorTokenizer
from calroute.proxy.app import Proxy
from calroute.proxy.config import ProxyConfig
from calroute.proxy.engine_client import EngineClient, ProtocolError, UpstreamError
from calroute.proxy.http.answer import read_at_most
from calroute.proxy.http.client import check_head
from calroute.proxy.http.scrape import ScrapeError
from calroute.proxy.signals import Probe
from calroute.results.records import RequestRecord, read_records
from tests.conftest import unreachable_cluster
from tests.proxy.conftest import CAL

MODEL = "emulated"
# Short bounds on an engine's silence: a stall costs a test a fifth of a second.
FAST: dict[str, Any] = {"prefill_timeout_s": 0.2, "stall_timeout_s": 0.2}
HOSTILE_PIECE = 64 * 1024  # a hostile engine's pieces, each a fresh allocation
MISFRAMED = "FramingError: unreadable answer: invalid character in chunk size (fake)"


@dataclass
class Faults:
    status: int | None = None  # answer every request with this HTTP status and an error body
    refuse: bool = False  # the connection fails before any answer (UpstreamError)
    stall: bool = False  # never answers (a stream: its head, then silence)
    empty: bool = False  # a stream's head, then its end with nothing in it
    cut_after: int | None = None  # a stream broken off after this many pieces
    garbage: bool = False  # HTTP 200 (or ``status``) with a body that is not JSON
    first_byte_s: float = 0.0  # the answer's (a stream: its first piece's) delay
    token_interval_s: float = 0.0  # between two pieces of a stream
    refuse_kv_pulls: bool = (
        False  # a prefill engine whose KV cannot be pulled (as if it died after answering)
    )
    metrics_down: bool = False  # /metrics answers 503, generation goes on
    # Hostile answers (sizes in bytes, sent in fresh HOSTILE_PIECE pieces, never held whole by the fake):
    huge_body: int | None = None  # a whole answer (prefill, JSON) of this size: HTTP 200, never valid JSON
    endless_event: int | None = None  # a stream: ``cut_after`` events (0 if None), then one with no end
    misframed: bool = False  # the body breaks off as unreadable framing (a stream: after ``cut_after``)
    # A stream: ``cut_after`` events (0 if None), then these bytes (well framed HTTP, not SSE), then its end.
    not_sse: bytes | None = None
    down: bool = False  # gone: every request and probe fails to connect


@dataclass(frozen=True)
class Sent:
    """One request an engine received."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    read_timeout_s: float | None

    @property
    def request_id(self) -> str:
        return self.headers["X-Request-Id"]


def sse(obj: dict[str, Any] | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def error_json(status: int, message: str, kind: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": status}}).encode()


async def _wait(delay_s: float, timeout_s: float | None) -> None:
    """Silence of ``delay_s`` (forever if infinite), cut by the client's bound on silence."""
    if timeout_s is not None and delay_s > timeout_s:
        await asyncio.sleep(timeout_s)
        raise TimeoutError(f"the engine was silent for {timeout_s:g} s")
    if delay_s == float("inf"):
        await asyncio.Event().wait()
    elif delay_s > 0:
        await asyncio.sleep(delay_s)


class FakeAnswer:
    """An answer whose body comes from an async iterator of pieces (EngineAnswer)."""

    def __init__(self, status: int, body: AsyncIterator[bytes], payload: bytes | None = None) -> None:
        self.status = status
        self.payload = payload  # a whole answer's body, for tests to compare with
        self._body = body
        self.ended = False  # the body was read to its end
        self.closed = False  # the consumer left the ``async with`` block
        self.calls: list[str] = []  # pause / resume / stop
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._task: asyncio.Task[None] | None = None
        self._done: asyncio.Future[bool] | None = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.closed = True
        if self._task is not None:
            self._task.cancel()

    async def next_part(self) -> bytes | None:
        await self._resumed.wait()
        part = await anext(self._body, None)
        if part is None:
            self.ended = True
        return part

    async def parts(self) -> AsyncIterator[bytes]:
        while (part := await self.next_part()) is not None:
            yield part

    async def read(self, max_bytes: int | None = None) -> bytes:
        return await read_at_most(self.next_part, max_bytes)

    def relay(self, on_part: Callable[[bytes], bool]) -> Awaitable[bool]:
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._done = done

        async def pump() -> None:
            try:
                while (part := await self.next_part()) is not None:
                    if not on_part(part):
                        self._resolve(False)
                        return
                self._resolve(True)
            except Exception as e:  # the engine's failure, or the consumer's own
                if not done.done():
                    done.set_exception(e)

        self._task = asyncio.get_running_loop().create_task(pump())
        return done

    def _resolve(self, outcome: bool) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_result(outcome)

    def stop(self) -> None:
        self.calls.append("stop")
        if self._task is not None:
            self._task.cancel()
        self._resolve(False)

    def pause_reading(self) -> None:
        self.calls.append("pause")
        self._resumed.clear()

    def resume_reading(self) -> None:
        self.calls.append("resume")
        self._resumed.set()


class FakeEngine:
    """One engine (EngineClient). ``sent``: what it received; ``answers``: what it answered with."""

    def __init__(self, engine_id: str, role: str, url: str, cluster: FakeCluster) -> None:
        self.id, self.role, self.url = engine_id, role, url
        self.faults = Faults()
        self.sent: list[Sent] = []
        self.answers: list[FakeAnswer] = []
        self.running = 0  # requests whose answer is under way (its /metrics gauge)
        self.scrapes = 0
        self.closed = False
        self._cluster = cluster
        self._issued = 0

    async def request(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes | None = None,
        read_timeout_s: float | None = None,
    ) -> FakeAnswer:
        check_head(method, path, headers)  # as the real client does, before anything is sent
        sent = Sent(path, dict(headers), json.loads(body or b"{}"), read_timeout_s)
        self.sent.append(sent)
        self._cluster.log.append((self.id, sent))
        f = self.faults
        if f.down or f.refuse:
            raise UpstreamError("ConnectionRefusedError: [Errno 111] Connection refused (fake)")
        streamed = self.role == "decode" and bool(sent.body.get("stream"))
        if f.stall and not streamed:
            await _wait(float("inf"), read_timeout_s)
        if not streamed:
            await _wait(f.first_byte_s, read_timeout_s)
        answer = self._answer(sent, streamed)
        self.answers.append(answer)
        return answer

    def _answer(self, sent: Sent, streamed: bool) -> FakeAnswer:
        f = self.faults
        if f.status is not None and f.garbage:  # a refusal from a gateway in front of the engine
            return whole(f.status, b"<html><body>%d</body></html>" % f.status)
        if f.status is not None:
            kind = "BadRequestError" if f.status < 500 else "InternalServerError"
            return whole(f.status, error_json(f.status, f"injected fault: HTTP {f.status}", kind))
        if sent.body.get("model") != MODEL:
            message = f"The model `{sent.body.get('model')}` does not exist."
            return whole(404, error_json(404, message, "NotFoundError"))
        if f.garbage:
            return whole(200, b"<html>not json</html>")
        streamed_now = streamed and (f.endless_event is not None or f.misframed or f.not_sse is not None)
        if f.huge_body is not None and not streamed:
            return FakeAnswer(200, hostile(f.huge_body, b'{"id":"', False))
        if f.misframed and not streamed_now:
            return FakeAnswer(200, hostile(HOSTILE_PIECE, b'{"id":"', True))
        chat = sent.path.endswith("chat/completions")
        prompt_tokens = prompt_length(sent.body, chat)
        if self.role == "prefill":
            self._issued += 1
            remote_id = f"{sent.request_id}-{self.id}-{self._issued}"
            handed: dict[str, Any] = {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_block_ids": [[self._issued]],
                "remote_engine_id": self.id,
                "remote_request_id": remote_id,
                "remote_host": "127.0.0.1",
                "remote_port": 5600,
            }
            self._cluster.held[remote_id] = self.id
            return whole(200, json.dumps(completion(chat, 1, prompt_tokens, handed)).encode())
        kv = sent.body.get("kv_transfer_params")
        if kv is not None:
            source = self._cluster.held.pop(str(kv.get("remote_request_id")), None)
            if source is None or self._cluster.engines[source].faults.refuse_kv_pulls:
                return whole(500, error_json(500, "KV transfer failed (fake)", "InternalServerError"))
        n = sent.body.get("max_completion_tokens") or sent.body.get("max_tokens") or 16
        if not streamed:
            return whole(200, json.dumps(completion(chat, n, prompt_tokens, None)).encode())
        options = sent.body.get("stream_options") or {}
        return FakeAnswer(200, self._stream(chat, n, prompt_tokens, bool(options.get("include_usage")), sent))

    async def _stream(
        self, chat: bool, n: int, prompt_tokens: int, usage: bool, sent: Sent
    ) -> AsyncIterator[bytes]:
        f = self.faults
        self.running += 1
        try:
            if f.stall:
                await _wait(float("inf"), sent.read_timeout_s)
            if f.empty:
                return
            pieces = stream_events(chat, n, prompt_tokens, usage)
            for i, piece in enumerate(pieces):
                if i == (f.cut_after or 0) and f.endless_event is not None:
                    async for part in hostile(f.endless_event, b"data: ", f.misframed):
                        yield part
                    return
                if i == (f.cut_after or 0) and f.not_sse is not None:
                    yield f.not_sse
                    return
                if i == (f.cut_after or 0) and f.misframed:
                    raise ProtocolError("framing", MISFRAMED)
                if i == f.cut_after:
                    raise UpstreamError("the engine closed the connection in the middle of the body (fake)")
                await _wait(f.first_byte_s if i == 0 else f.token_interval_s, sent.read_timeout_s)
                yield piece
        finally:
            self.running -= 1

    def close(self) -> None:
        self.closed = True

    # ---- /metrics and /health (the proxy's Signals) ---------------------------------------------------

    def scrape(self, path: str) -> tuple[int, bytes]:
        if self.faults.down:
            raise ScrapeError("UpstreamError: connection refused (fake)")
        if path == "/health":
            return 200, b""
        self.scrapes += 1
        if self.faults.metrics_down:
            return 503, b""
        text = (
            f"vllm:kv_cache_usage_perc 0.0\nvllm:num_requests_running {self.running}\n"
            "vllm:num_requests_waiting 0\n"
        )
        return 200, text.encode()

    # ---- what it received -----------------------------------------------------------------------------

    def sent_for(self, request_id: str) -> list[Sent]:
        return [s for s in self.sent if s.request_id == request_id]


async def hostile(size: int, start: bytes, misframed: bool) -> AsyncIterator[bytes]:
    """``size`` bytes that begin as an answer would and never end it (no blank line, no closing brace), in
    fresh pieces; then a ProtocolError if ``misframed``."""
    sent = 0
    while sent < size:
        n = min(HOSTILE_PIECE, size - sent)
        yield (start + b"x" * (n - len(start))) if sent == 0 else b"x" * n
        sent += n
        await asyncio.sleep(0)
    if misframed:
        raise ProtocolError("framing", MISFRAMED)


def whole(status: int, payload: bytes) -> FakeAnswer:
    async def body() -> AsyncIterator[bytes]:
        yield payload

    return FakeAnswer(status, body(), payload)


def prompt_length(body: dict[str, Any], chat: bool) -> int:
    if chat:
        return 4 + sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
    prompt = body.get("prompt")
    return len(prompt) if isinstance(prompt, list) else len(str(prompt).split())


def token(i: int) -> str:
    return f"t{i} "


def completion(chat: bool, n: int, prompt_tokens: int, kv: dict[str, Any] | None) -> dict[str, Any]:
    text = "".join(token(i) for i in range(n))
    choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
    choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
    return {
        "id": "cmpl-fake",
        "object": "chat.completion" if chat else "text_completion",
        "model": MODEL,
        "choices": [choice],
        "usage": usage,
        "kv_transfer_params": kv,
    }


def stream_events(chat: bool, n: int, prompt_tokens: int, usage: bool) -> list[bytes]:
    """vLLM's events, one per piece: (chat: the role first,) a token each, the usage chunk, [DONE]."""
    kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(choice: dict[str, Any]) -> bytes:
        return sse({"id": "cmpl-fake", "object": kind, "model": MODEL, "choices": [{"index": 0, **choice}]})

    events = [chunk({"delta": {"role": "assistant", "content": ""}, "finish_reason": None})] if chat else []
    for i in range(n):
        finish = "length" if i == n - 1 else None
        events.append(
            chunk({"delta": {"content": token(i)}, "finish_reason": finish})
            if chat
            else chunk({"text": token(i), "finish_reason": finish})
        )
    if usage:
        u = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
        events.append(sse({"id": "cmpl-fake", "object": kind, "model": MODEL, "choices": [], "usage": u}))
    return [*events, sse("[DONE]")]


class FakeProbe:
    """One polled URL of a fake engine (signals.Probe)."""

    def __init__(self, engine: FakeEngine, path: str) -> None:
        self.engine, self.path = engine, path

    async def get(self) -> tuple[int, bytes]:
        return self.engine.scrape(self.path)

    def close(self) -> None:
        pass


@dataclass
class FakeCluster:
    """Fake engines for a cluster file whose URLs are never contacted."""

    prefill: int = 2
    decode: int = 2
    file: ClusterFile = field(init=False)
    engines: dict[str, FakeEngine] = field(init=False)
    held: dict[str, str] = field(default_factory=dict)  # KV held for a pull: remote_request_id -> engine
    log: list[tuple[str, Sent]] = field(default_factory=list)  # every engine's requests, in order

    def __post_init__(self) -> None:
        self.file = unreachable_cluster(self.prefill, self.decode)
        self.engines = {e.id: FakeEngine(e.id, e.role.value, e.url, self) for e in self.file.engines}

    def __getitem__(self, engine_id: str) -> FakeEngine:
        return self.engines[engine_id]

    def probe(self, url: str, headers: Mapping[str, str], timeout_s: float) -> Probe:
        for e in self.engines.values():
            if url.startswith(e.url + "/"):
                return FakeProbe(e, url.removeprefix(e.url))
        raise KeyError(url)

    def clients(self) -> dict[str, EngineClient]:
        return dict(self.engines)

    def sent(self, request_id: str) -> list[tuple[str, Sent]]:
        """Every request any engine received for one client request, in order: (engine id, request)."""
        return [(engine_id, s) for engine_id, s in self.log if s.request_id == request_id]


# ---- the client side ----------------------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def events(self) -> list[Any]:
        """SSE data payloads, JSON-decoded except the final "[DONE]"."""
        out: list[Any] = []
        for event in self.body.decode().split("\n\n"):
            if event.startswith("data: "):
                data = event.removeprefix("data: ")
                out.append(data if data == "[DONE]" else json.loads(data))
        return out


def dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size, _, data = data.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out, data = out + data[:n], data[n + 2 :]
    return out


async def send(
    port: int, path: str, payload: bytes, headers: Mapping[str, str] | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    lines = [f"POST {path} HTTP/1.1", "Host: calroute", "Content-Type: application/json"]
    lines += [f"Content-Length: {len(payload)}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + payload)
    return reader, writer


async def read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines if x)}
    return int(status_line.split()[1]), headers


EMULATOR = EmulatorTokenizer()


class ProxyOnFakes:
    """A whole proxy (Proxy: server, router, ledger, signals, metrics, generation) serving on loopback,
    with fake engines behind it. Its engine signals (the /metrics and /health polls) run only when asked,
    against the fakes."""

    def __init__(
        self,
        fakes: FakeCluster,
        tmp_path: Path,
        signals: bool = False,
        engines: Mapping[str, EngineClient] | None = None,
        tokenizer: Tokenizer | None = EMULATOR,
        **kw: Any,
    ) -> None:
        """``engines``: real clients to put in place of some fakes (by engine id); ``tokenizer``: the
        proxy's (None: none, prompt lengths estimated)."""
        kw.setdefault("health_interval_s", 0.2)
        self.fakes = fakes
        self.cfg = ProxyConfig(
            cluster=fakes.file,
            calibration=CAL,
            log_path=tmp_path / "log.jsonl",
            decision_log_path=tmp_path / "decisions.jsonl",
            **kw,
        )
        self.proxy = Proxy(
            self.cfg, tokenizer, engines={**fakes.clients(), **(engines or {})}, probe=fakes.probe
        )
        self._signals = signals
        self.port = 0

    async def __aenter__(self) -> Self:
        self.port = await self.proxy.start("127.0.0.1", 0, signals=self._signals)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.proxy.stop()

    async def post(
        self,
        body: Any,
        path: str = "/v1/completions",
        headers: Mapping[str, str] | None = None,
        raw: bytes | None = None,
    ) -> Answer:
        payload = raw if raw is not None else json.dumps(body).encode()
        reader, writer = await send(self.port, path, payload, headers)
        try:
            status, head = await read_head(reader)
            rest = await reader.read()
        finally:
            writer.close()
        if head.get("transfer-encoding") == "chunked":
            rest = dechunk(rest)
        return Answer(status, head, rest)

    async def get(self, path: str, headers: Mapping[str, str] | None = None) -> Answer:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        lines = [f"GET {path} HTTP/1.1", "Host: calroute", "Connection: close"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        try:
            status, head = await read_head(reader)
            rest = await reader.read()
        finally:
            writer.close()
        return Answer(status, head, rest)

    def records(self) -> list[RequestRecord]:
        path = self.cfg.log_path
        assert path is not None
        return list(read_records(path)) if path.exists() else []

    def metric(self, name: str, **labels: str) -> float:
        """The sum of a metric's samples whose labels include ``labels``; 0 when there are none."""
        total = 0.0
        for line in self.proxy.metrics.exposition().decode().splitlines():
            m = re.fullmatch(r"(\w+)(?:\{(.*)\})? (\S+)", line)
            if m is None or m[1] != name:
                continue
            have = dict(re.findall(r'(\w+)="([^"]*)"', m[2] or ""))
            if all(have.get(k) == v for k, v in labels.items()):
                total += float(m[3])
        return total


async def until(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)
