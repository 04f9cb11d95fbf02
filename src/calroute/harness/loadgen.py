"""The open-loop load generator: send each request at its scheduled time, whatever the responses.

Open loop means one task per request, released by the clock, never by an earlier request's answer: a slow
system faces the same offered load as a fast one, and its queues grow as they would in production (a
closed loop would slow its own arrivals down exactly when the system saturates, and hide the collapse that
separates routing policies).

Each request is a streaming ``POST /v1/completions`` whose prompt is ``prompt_tokens`` token ids
(``prompts.py``; distinct per request), with ``max_tokens = output_tokens``, ``ignore_eos``,
``temperature 0``, ``stream_options.include_usage`` and the ``x-calroute-slo`` header. The client measures,
in seconds from the run start (the instant ``arrival_s = 0`` maps to): the first and last content chunk,
and the completion tokens from the usage chunk. Every request ends in exactly one ``RequestRecord`` (the
shared schema): ``ok``; ``failed`` (non-200 answer with the status and a body excerpt, an error event in the
stream, a connection error, or a broken token-count contract); or ``cancelled`` (no answer within
``timeout_s``, or the run was interrupted). TTFT runs from the *scheduled* arrival, so any lateness of the
client counts against the system, never in its favour.

Lateness is the generator's own error: the instant a request's task hands it to the HTTP client, minus its
scheduled time. The default bound on its p99, 10 ms, is 5 % of the tight TTFT target (200 ms on the
a40-qwen2.5-3b profile, 175 ms in the paper) and well above the event loop's own timer granularity (about
1 ms: epoll rounds timeouts up to whole milliseconds). Above it, the offered load was not the schedule
(bursts smeared out, the rate lower than asked) and the run is marked invalid. Lateness stops at the hand-
off: connecting and writing the request are left out, as they are the same for every policy compared.

Hot-path choices: request bodies are built as bytes ahead of their send time (``LEAD_S``), so the JSON of a
4k-token prompt never delays a send; the SSE stream is read in network chunks and only counted (content
events, the usage event), never JSON-decoded but for the one usage line. Python's cyclic garbage collector
is paused for the run (``pause_gc``): with thousands of requests in flight, its full collections stalled the
event loop for up to 150 ms and its middle ones for 25 ms (measured at 200 req/s against an overloaded
engine on this 2-core machine), while a run leaves only about four cyclic garbage objects per request
(measured), collected when the run ends.
"""

from __future__ import annotations

import asyncio
import gc
import json
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

from calroute.errors import ConfigError
from calroute.harness.prompts import ids_json, prompt_json
from calroute.proxy.oracle import ORACLE_HEADER
from calroute.proxy.prefix import CACHED_TOKENS_HEADER
from calroute.results.records import RequestRecord
from calroute.types import RequestSpec, RequestStatus, SloClass
from calroute.workload.tokens import prompt_token_ids

DEFAULT_MAX_LATENESS_S = 0.010
DEFAULT_TIMEOUT_S = 600.0  # a 4k-token output at 100 ms per token under overload still finishes
LEAD_S = 0.02  # a request's task starts this long before its send time, to build the body off the clock
START_DELAY_S = 0.1  # the run's clock starts this long after drive() is called (session, first bodies)
ERROR_EXCERPT_CHARS = 200
TOKEN_CONTRACT = "token-count contract"

_DATA = b"data: {"
_ERROR = b'data: {"error"'
# The usage chunk is the only one with an empty choices list (compact JSON from vLLM and the emulator;
# the spaced form is what Python's json.dumps would write).
_USAGE = (b'"choices":[]', b'"choices": []')


@dataclass(frozen=True)
class LoadResult:
    """What a run produced: one record per request (in schedule order) and how well the schedule was kept."""

    records: list[RequestRecord]
    lateness_p50_s: float
    lateness_p99_s: float
    lateness_max_s: float
    max_lateness_s: float  # the bound on p99 lateness the run was held to
    valid: bool  # p99 lateness within the bound: the offered load was the schedule
    duration_s: float  # run start to the end of the last response
    schedule_s: float  # run start to the last scheduled send
    started_unix_s: float  # wall-clock time of the run start, to line records up with engine logs
    # request id -> the proxy's id of it (its X-Request-Id answer header): what the proxy's own records are
    # filed under (harness/live.py joins them); a request the proxy never answered has none
    proxy_ids: dict[str, str] = field(default_factory=dict)

    def lateness_dict(self) -> dict[str, Any]:
        return {
            "p50_s": self.lateness_p50_s,
            "p99_s": self.lateness_p99_s,
            "max_s": self.lateness_max_s,
            "bound_p99_s": self.max_lateness_s,
        }


def request_body(model: str, spec: RequestSpec, index: int, prompt_seed: int) -> bytes:
    """The JSON body of one request, as bytes (``index`` picks the request's distinct prompt; a request
    naming prefix blocks shares their tokens with every request naming them, workload/tokens.py)."""
    if spec.prefix_blocks:
        prompt = ids_json(prompt_token_ids(spec, seed=prompt_seed))
    else:
        prompt = prompt_json(index, spec.prompt_tokens, prompt_seed)
    return b"".join(
        (
            b'{"model":',
            json.dumps(model).encode(),
            b',"prompt":',
            prompt,
            b',"max_tokens":%d' % spec.output_tokens,
            b',"ignore_eos":true,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}',
        )
    )


REQUEST_ID_HEADER = "X-Request-Id"
_PROXY_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")  # an answer's header is untrusted: an id, nothing else


def _count_header(value: str | None) -> int:
    """A proxy's x-calroute-cached-tokens (0 when absent: a proxy without a prefix index, or a bad value)."""
    return int(value) if value is not None and value.isdigit() and len(value) <= 12 else 0


def _completion_tokens(block: bytes) -> int | None:
    """completion_tokens of the usage event in ``block`` (complete SSE lines), None if unreadable."""
    for line in block.split(b"\n"):
        if line.startswith(_DATA) and (_USAGE[0] in line or _USAGE[1] in line):
            try:
                return int(json.loads(line[6:])["usage"]["completion_tokens"])
            except (ValueError, KeyError, TypeError):
                return None
    return None


def _error_event(block: bytes) -> str:
    start = block.index(_ERROR) + 6
    end = block.find(b"\n", start)
    return block[start : end if end >= 0 else len(block)].decode(errors="replace")[:ERROR_EXCERPT_CHARS]


class _Run:
    """The shared state of one run: the session, the clock, and the per-request results."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        model: str,
        requests: Sequence[RequestSpec],
        t0: float,
        slo_header: bool,
        oracle_header: bool,
        policy: str,
        prompt_seed: int,
        timeout_s: float,
        progress: Callable[[int, int], None] | None,
        on_record: Callable[[RequestRecord], None] | None,
    ) -> None:
        self.session = session
        self.url = url
        self.model = model
        self.requests = requests
        self.t0 = t0
        self.policy = policy
        self.prompt_seed = prompt_seed
        self.timeout_s = timeout_s
        self.progress = progress
        self.on_record = on_record
        self.loop = asyncio.get_running_loop()
        base = {"Content-Type": "application/json"}
        self.headers = {
            c: {**base, "x-calroute-slo": c.value} if slo_header else base
            for c in (SloClass.TIGHT, SloClass.LOOSE)
        }
        self.oracle_header = oracle_header
        n = len(requests)
        self.records: list[RequestRecord | None] = [None] * n
        self.proxy_ids: dict[str, str] = {}
        self.lateness_s = np.full(n, np.nan)  # NaN: never sent (the run was interrupted first)
        self.done = 0
        self.last_end = t0

    def _headers(self, spec: RequestSpec) -> dict[str, str]:
        headers = self.headers[spec.slo_class]
        if self.oracle_header:
            return {**headers, ORACLE_HEADER: str(spec.output_tokens)}
        return headers

    async def send(self, i: int) -> None:
        spec = self.requests[i]
        loop = self.loop
        at = self.t0 + spec.arrival_s
        body = request_body(self.model, spec, i, self.prompt_seed)
        first: float | None = None
        last: float | None = None
        tokens: int | None = None
        cached = 0
        status = RequestStatus.OK
        error: str | None = None
        try:
            delay = at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            self.lateness_s[i] = loop.time() - at
            async with (
                asyncio.timeout(self.timeout_s),
                self.session.post(self.url, data=body, headers=self._headers(spec)) as r,
            ):
                if r.status != 200:
                    excerpt = (await r.content.read(4 * ERROR_EXCERPT_CHARS)).decode(errors="replace")
                    status, error = RequestStatus.FAILED, f"HTTP {r.status}: {excerpt[:ERROR_EXCERPT_CHARS]}"
                else:
                    cached = _count_header(r.headers.get(CACHED_TOKENS_HEADER))
                    proxy_id = r.headers.get(REQUEST_ID_HEADER)
                    if proxy_id is not None and _PROXY_ID.fullmatch(proxy_id):
                        self.proxy_ids[spec.request_id] = proxy_id
                    carry = b""
                    async for chunk in r.content.iter_any():
                        now = loop.time()
                        buf = carry + chunk if carry else chunk
                        cut = buf.rfind(b"\n") + 1
                        block, carry = buf[:cut], buf[cut:]
                        if not block:
                            continue
                        # Count, don't parse: content events are data events other than usage and error.
                        events = block.count(_DATA)
                        if not events:
                            continue
                        usage = block.count(_USAGE[0]) + block.count(_USAGE[1])
                        errors = block.count(_ERROR)
                        if usage:
                            tokens = _completion_tokens(block)
                        if errors and error is None:
                            status, error = RequestStatus.FAILED, _error_event(block)
                        if events > usage + errors:
                            if first is None:
                                first = now
                            last = now
        except aiohttp.ClientError as e:  # first: aiohttp's own timeouts are connection failures
            status, error = RequestStatus.FAILED, f"{type(e).__name__}: {e}"[:ERROR_EXCERPT_CHARS]
        except TimeoutError:  # before OSError, its base class: our deadline expired
            status, error = RequestStatus.CANCELLED, f"no complete answer within {self.timeout_s:g} s"
        except (OSError, ValueError) as e:
            status, error = RequestStatus.FAILED, f"{type(e).__name__}: {e}"[:ERROR_EXCERPT_CHARS]
        except asyncio.CancelledError:
            self._finish(i, first, last, tokens, RequestStatus.CANCELLED, "run interrupted")
            raise
        if status is RequestStatus.OK:
            if tokens != spec.output_tokens:
                status = RequestStatus.FAILED
                got = "no usage chunk" if tokens is None else f"{tokens} completion tokens"
                error = f"{TOKEN_CONTRACT}: max_tokens {spec.output_tokens}, got {got}"
            elif first is None:
                status, error = RequestStatus.FAILED, "no content chunk in the stream"
        self._finish(i, first, last, tokens, status, error, cached)

    async def send_all(self, order: list[int]) -> None:
        """Release one task per request, in ``order``, ``LEAD_S`` before its send time; wait for all."""
        loop = self.loop
        pending: set[asyncio.Task[None]] = set()
        try:
            for i in order:
                delay = self.t0 + self.requests[i].arrival_s - LEAD_S - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                task = loop.create_task(self.send(i))
                pending.add(task)
                task.add_done_callback(pending.discard)
            while pending:
                await asyncio.gather(*pending)
        finally:  # interrupted: every request in flight ends as cancelled
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)

    def _finish(
        self,
        i: int,
        first: float | None,
        last: float | None,
        tokens: int | None,
        status: RequestStatus,
        error: str | None,
        cached_tokens: int = 0,
    ) -> None:
        spec = self.requests[i]
        t0 = self.t0
        rec = RequestRecord(
            request_id=spec.request_id,
            slo_class=spec.slo_class,
            prompt_tokens=spec.prompt_tokens,
            target_output_tokens=spec.output_tokens,
            predicted_output_tokens=0,  # the client predicts nothing; the router's guess is in its own log
            output_tokens=tokens or 0,
            policy=self.policy,
            prefill_id=None,  # the client cannot see the routing decision
            decode_id=None,
            arrival_s=spec.arrival_s,
            prefill_done_s=None,
            first_token_s=None if first is None else first - t0,
            last_token_s=None if last is None else last - t0,
            status=status,
            error=error,
            cached_tokens=cached_tokens,
        )
        self.records[i] = rec
        self.done += 1
        self.last_end = max(self.last_end, self.loop.time())
        if self.on_record is not None:
            self.on_record(rec)
        if self.progress is not None:
            self.progress(self.done, len(self.requests))


@contextmanager
def _gc_paused(pause: bool) -> Iterator[None]:
    was_enabled = gc.isenabled()
    if pause:
        gc.disable()
    try:
        yield
    finally:
        if pause and was_enabled:
            gc.enable()
            gc.collect()


async def drive(
    target_url: str,
    requests: Sequence[RequestSpec],
    model: str,
    *,
    slo_header: bool = True,
    oracle_header: bool = False,
    progress: Callable[[int, int], None] | None = None,
    max_lateness_s: float = DEFAULT_MAX_LATENESS_S,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    policy: str = "live",
    prompt_seed: int = 0,
    on_record: Callable[[RequestRecord], None] | None = None,
    pause_gc: bool = True,
) -> LoadResult:
    """Send ``requests`` to ``target_url`` on their schedule (``arrival_s`` from the run start).

    ``oracle_header`` sends each request's true output length, for a proxy running the oracle predictor
    (proxy/oracle.py). ``policy`` labels the records; ``prompt_seed`` varies the prompts between runs;
    ``progress(done, total)`` and ``on_record(record)`` are called as each request ends (on the event loop:
    keep them cheap).
    """
    if not requests:
        raise ConfigError("drive() needs at least one request")
    if max_lateness_s <= 0 or timeout_s <= 0:
        raise ConfigError(f"max_lateness_s and timeout_s must be > 0, got {max_lateness_s}, {timeout_s}")
    url = target_url.rstrip("/") + "/v1/completions"
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
    loop = asyncio.get_running_loop()
    # limit=0: an open loop must never queue behind a connection cap (that would be a closed loop).
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=None)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30.0)
    with _gc_paused(pause_gc):
        async with aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False) as s:
            t0 = loop.time() + START_DELAY_S
            started_unix_s = time.time() + START_DELAY_S
            run = _Run(
                s,
                url,
                model,
                requests,
                t0,
                slo_header,
                oracle_header,
                policy,
                prompt_seed,
                timeout_s,
                progress,
                on_record,
            )
            await run.send_all(order)
    records = [r for r in run.records if r is not None]
    sent = run.lateness_s[~np.isnan(run.lateness_s)]
    p50, p99, worst = (float(x) for x in np.percentile(sent, [50, 99, 100])) if sent.size else (0.0, 0.0, 0.0)
    return LoadResult(
        records=records,
        lateness_p50_s=p50,
        lateness_p99_s=p99,
        lateness_max_s=worst,
        max_lateness_s=max_lateness_s,
        valid=p99 <= max_lateness_s and sent.size == len(requests) and len(records) == len(requests),
        duration_s=run.last_end - t0,
        schedule_s=max(r.arrival_s for r in requests),
        started_unix_s=started_unix_s,
        proxy_ids=run.proxy_ids,
    )
