"""One request's life in the proxy: admit, prefill, decode, relay, record.

Per request: validate, classify (SLO header), estimate the prompt length, let the router (the simulator's
policy, predictor and ledger) pick the pair, prefill with ``max_tokens=1`` and ``do_remote_decode``, then
decode with the returned ``kv_transfer_params``, relaying the decode engine's answer (SSE passes through).
A local decision (RouteDecision.local) skips the prefill engine: the decode engine gets the client's body
without ``kv_transfer_params`` and prefills the prompt itself, as vLLM's kv_both engine serves such a
request; its answer is relayed as any decode's, and the prefill ends with the first token.
A failed prefill is retried on another prefill engine; a decode that fails before any output is retried on
another decode engine with a fresh prefill (transfer params are never reused), and a local attempt so too,
on whichever path the router then decides. Engine 4xx answers go back to the client and never count against
the engine. Every admitted request ends in exactly one record.

Engines are not trusted: every answer is read up to its cap (AnswerLimits.max_answer_bytes whole,
max_event_bytes an SSE event), and one over it or misframed is an engine failure like a 5xx, counted in
calroute_engine_protocol_errors_total. What went wrong (the engine, the exception) goes to the log, the
record and the metrics; the client only ever reads that the engines could not serve its request.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from calroute.contract import handoff
from calroute.contract.tokenizer import AsyncTokenizer, Tokenizer
from calroute.errors import NoCandidateError
from calroute.proxy.config import SLOW_STEPS_PER_TOKEN, ProxyConfig
from calroute.proxy.engine_client import EngineAnswer, EngineClient, UpstreamError
from calroute.proxy.errors import ClientGone, EngineFailed, error_event, json_error
from calroute.proxy.flight import Flight, Invalid, board
from calroute.proxy.http import codec
from calroute.proxy.http.answer import ProtocolError
from calroute.proxy.http.client import UnsafeRequest
from calroute.proxy.http.messages import Request, Response, Stream
from calroute.proxy.kv_events import KvEventSubscriber
from calroute.proxy.metrics import ProxyMetrics
from calroute.proxy.prefix import CACHED_TOKENS_HEADER, cached_tokens, prompt_blocks
from calroute.proxy.prompt_length import PromptLength, Refused, exact_prompt
from calroute.proxy.relay import StreamRelay
from calroute.proxy.release import Releases, prefill_exchange
from calroute.proxy.signals import Signals
from calroute.results.records import RecordWriter
from calroute.routing.block_hash import machine_token_ids
from calroute.routing.router import Router
from calroute.types import RequestStatus

logger = logging.getLogger(__name__)

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
# The proxy's id of an answered request, as vLLM's server names its own: what the request's record and
# decision log are filed under, so that a client can find them (the live harness joins its records by it).
REQUEST_ID_HEADER = "X-Request-Id"
# What the client reads when engines failed it: never which engine, its address or the exception.
ENGINES_FAILED = "the engines could not serve this request"
STREAM_BROKE = "the decode engine broke off the stream"
NOT_SENT = "the proxy could not send this request to an engine"
ENGINE_REFUSED = "the engine refused this request"


def _failed(engine_id: str, phase: str, e: BaseException) -> EngineFailed:
    """An engine's failure, from what its client raised: a ProtocolError keeps its kind."""
    kind = e.kind if isinstance(e, ProtocolError) else None
    return EngineFailed(engine_id, phase, f"{type(e).__name__}: {e}", kind)


def _status_failed(engine_id: str, phase: str, status: int) -> EngineFailed:
    """A 5xx, or a 3xx: the proxy follows no redirect, nor hands an engine's on to the client."""
    return EngineFailed(engine_id, phase, f"HTTP {status}", "status" if status < 400 else None)


def _engine_name(engine_id: str, phase: str) -> str:
    """The engine as logs and records name it, by the phase it failed in ("local": a decode engine
    prefilling the prompt itself)."""
    return f"decode engine {engine_id} (local prefill)" if phase == "local" else f"{phase} engine {engine_id}"


class Generation:
    """The two generation routes. The proxy (app.py) owns the parts and the surface around them; this
    class only serves requests with them. ``kv_events``: the subscriber to the engines' KV events, when
    they publish them. ``writer``: the request log's writer while it is open (the proxy opens it at start,
    after building this), else None."""

    def __init__(
        self,
        cfg: ProxyConfig,
        router: Router,
        signals: Signals,
        metrics: ProxyMetrics,
        prompt_length: PromptLength,
        endpoints: Mapping[str, EngineClient],
        engine_headers: Mapping[str, str],
        now: Callable[[], float],
        tokenizer: Tokenizer | AsyncTokenizer | None,
        kv_events: KvEventSubscriber | None,
        writer: Callable[[], RecordWriter | None],
    ) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.router = router
        self.signals = signals
        self.metrics = metrics
        self.prompt_length = prompt_length
        self._endpoints = endpoints
        self._engine_headers = engine_headers
        self.now = now
        self.kv_events = kv_events
        self._writer = writer
        # Long prompts are tokenized off the event loop, one at a time: a thread, since the model's tokenizer
        # releases the GIL while it encodes (tokenizer/hf.py), which is what costs: milliseconds for an
        # 8k-token prompt. (The emulator's tokenizer is Python and holds it.)
        self._tokenize_pool = (
            ThreadPoolExecutor(1, thread_name_prefix="calroute-tokenize")
            if tokenizer is not None and not isinstance(tokenizer, AsyncTokenizer)
            else None
        )
        # Request ids: a random 64-bit prefix per proxy process, then a counter. Unique across proxies and
        # restarts as uuid4 would be (and as long), without a getrandom call per request.
        self._id_prefix = os.urandom(8).hex()
        self._ids = itertools.count()
        self.releases = Releases(endpoints, engine_headers, cfg, metrics)

    @property
    def writer(self) -> RecordWriter | None:
        return self._writer()

    def close(self) -> None:
        if self._tokenize_pool is not None:
            self._tokenize_pool.shutdown(wait=False, cancel_futures=True)
        self.releases.close()
        if isinstance(self.tokenizer, AsyncTokenizer):
            self.tokenizer.close()

    @property
    def policy_name(self) -> str:
        """What records and metrics are labelled with: the policy routing now (it can be switched)."""
        return self.router.policy.name

    async def completions(self, request: Request) -> Response | Stream:
        return await self._generate(request, "/v1/completions")

    async def chat(self, request: Request) -> Response | Stream:
        return await self._generate(request, "/v1/chat/completions")

    async def _generate(self, request: Request, path: str) -> Response | Stream:
        request_id = f"{self._id_prefix}{next(self._ids):016x}"
        arrival_s = self.now()
        boarded = board(request, path, self.cfg, self.prompt_length, request_id, arrival_s)
        if isinstance(boarded, Invalid):
            # The client's mistake, refused before anything was routed: one record, as the client's error.
            refused = Flight(request_id, arrival_s, self.cfg.default_slo, 0, None, 0)
            self._finish(refused, RequestStatus.REJECTED, f"HTTP 400: {boarded.message}")
            return json_error(400, boarded.message, param=boarded.param)
        body, flight = boarded
        if flight.prompt_ids is None:
            answer = await self._tokenize(body, path == "/v1/chat/completions", flight)
            if answer is not None:
                return answer
        if self.router.prefix is not None:
            flight.prefix_blocks = prompt_blocks(
                body,
                path == "/v1/chat/completions",
                self.tokenizer,
                self.router.prefix.block_tokens,
                flight.prompt_ids,
            )
        try:
            return await self._serve(request, body, path, flight)
        except Exception as e:
            if not isinstance(e, ConnectionError):  # the proxy's own failure (the server answers 500)
                self._finish(flight, RequestStatus.FAILED, f"proxy error: {type(e).__name__}: {e}"[:500])
            raise
        finally:
            if not flight.recorded:  # the client went away: the handler was cancelled, or its write broke
                self._finish(flight, RequestStatus.CANCELLED, "client disconnected")
            if flight.handoff is not None:
                decode_id, kv = flight.handoff
                flight.handoff = None
                self.releases.send(flight.request_id, decode_id, path, body, kv)

    async def _tokenize(self, body: dict[str, Any], chat: bool, f: Flight) -> Response | None:
        """The prompt's exact length and token ids from the served model's tokenizer, into ``f``; the 400
        when the engine would refuse the prompt, else None. Without a tokenizer (or for a completions prompt
        it does not read), ``f`` keeps the estimate made at boarding."""
        if self.tokenizer is None:
            self.metrics.prompt_length_estimated.inc()
            return None
        ids = await exact_prompt(
            self.tokenizer, self._tokenize_pool, body, chat, f.prompt_chars, self.cfg.cluster.max_model_len
        )
        if ids is None:
            self.metrics.prompt_length_estimated.inc()
            return None
        if isinstance(ids, Refused):
            self._finish(f, RequestStatus.REJECTED, f"HTTP 400: {ids.message}"[:500])
            return json_error(400, ids.message, param=ids.param)
        f.prompt_ids = machine_token_ids(ids)
        f.prompt_tokens = max(1, len(ids))
        f.prompt_chars = None  # exact: nothing for the character ratio to learn
        return None

    async def _serve(self, request: Request, body: dict[str, Any], path: str, f: Flight) -> Response | Stream:
        last_error = "no attempt made"
        f.priced_prompt_tokens, f.prompt_estimated = f.prompt_tokens, f.prompt_chars is not None
        for _ in range(self.cfg.max_attempts):
            started = time.perf_counter()
            try:
                d = self.router.admit(
                    f.request_id,
                    f.prompt_tokens,
                    f.slo,
                    self.now(),
                    f.oracle_tokens,
                    prefix_blocks=f.prefix_blocks,
                )
            except NoCandidateError as e:
                self._finish(f, RequestStatus.FAILED, str(e))
                return await self._error(
                    f, 503, f"no engine can serve the request: {e}", "ServiceUnavailable"
                )
            self.metrics.decision.observe(time.perf_counter() - started)
            route = d.route
            f.admitted, f.predicted = True, d.admission.predicted_output_tokens
            f.prefill_id, f.decode_id = route.prefill_id, route.decode_id
            f.local, f.path_reason = route.local, route.reason
            self.metrics.route_paths.labels(
                self.policy_name, "local" if route.local else "remote", route.reason
            ).inc()
            # the hit expected on the engine that prefills (on the local path prefill_id is the decode engine)
            f.predicted_cached_tokens = d.match.get(route.prefill_id, 0)
            f.cached_tokens = 0
            f.prefill_done_s = f.first_token_s = f.last_token_s = None
            try:
                if route.local:
                    return await self._decode(request, body, path, f, None)
                kv, client_error = await self._prefill(body, path, f)
                if client_error is not None:
                    return client_error
                return await self._decode(request, body, path, f, kv)
            except EngineFailed as e:
                last_error = f"{_engine_name(e.engine_id, e.phase)}: {e}"
                self._engine_failed(e.engine_id, e.phase, str(e), e.kind, f)
                self.metrics.retries.labels(e.phase).inc()
                self.router.done(f.request_id, f.prompt_tokens, 0, self.now(), ok=False)
                f.admitted = False
                # A decode engine that failed is not sent a release; the prefill engine's lease frees them.
                f.handoff = None
            except UnsafeRequest as e:
                # The proxy built a request it must not send (a header with a line break: the allow-list
                # and its checks, flight.py, should make this impossible). Every engine would get the same
                # bytes, so none is at fault and no retry can help: a 500, the proxy's own failure.
                logger.error("request %s not sent to an engine: %s", f.request_id, e)
                self._finish(f, RequestStatus.FAILED, f"not sent: {e}")
                return await self._error(f, 500, NOT_SENT, "InternalServerError")
        self._finish(f, RequestStatus.FAILED, last_error)
        return await self._error(f, 502, ENGINES_FAILED, "BadGateway")

    def _engine_failed(self, engine_id: str, phase: str, reason: str, kind: str | None, f: Flight) -> None:
        """An engine failed a request: out of routing, counted, logged (the details stay here)."""
        self.signals.mark_failed(engine_id, reason)
        self.metrics.engine_errors.labels(engine_id).inc()
        if kind is not None:
            self.metrics.engine_protocol_errors.labels(engine_id, kind).inc()
            logger.warning(
                "%s answered request %s unreadably (%s): %s",
                _engine_name(engine_id, phase),
                f.request_id,
                kind,
                reason,
            )

    async def _error(
        self, f: Flight, status: int, message: str, kind: str, payload: bytes | None = None
    ) -> Response | Stream:
        """The answer to a request that cannot be served (its record already written). Before its response
        head went out: an HTTP error with a JSON body (an engine's 4xx body as it came). After (a stream
        whose head went out with a decode engine's, then every attempt failed): an error event and the end
        of the stream, as vLLM ends a stream it cannot finish."""
        if f.stream is None:
            if payload is not None:
                return Response(payload, status)
            return json_error(status, message, kind)
        if payload is not None:
            message = payload[:500].decode(errors="replace")
        try:
            await f.stream.write(error_event(status, message, kind))
            await f.stream.write_eof()
        except ConnectionError:
            pass  # the client left: the record stands
        return f.stream

    def _headers(self, f: Flight) -> dict[str, str]:
        return {**f.forwarded, **self._engine_headers, "X-Request-Id": f.request_id}

    async def _prefill(
        self, body: dict[str, Any], path: str, f: Flight
    ) -> tuple[dict[str, Any] | None, Response | Stream | None]:
        assert f.prefill_id is not None

        def held_for_release(kv: dict[str, Any]) -> None:  # the client left as the prefill ended
            f.handoff = (f.decode_id or "", kv)

        try:
            status, payload = await prefill_exchange(
                self._endpoints[f.prefill_id],
                path,
                self._headers(f),
                codec.dumps(handoff.prefill_body(body)),
                self.cfg.prefill_timeout_s,
                self.cfg.answer_limits.max_answer_bytes,
                held_for_release,
            )
        except (UpstreamError, TimeoutError) as e:
            raise _failed(f.prefill_id, "prefill", e) from e
        if status >= 500 or 300 <= status < 400:
            raise _status_failed(f.prefill_id, "prefill", status)
        if status >= 400:
            return None, await self._client_error(f, status, payload)
        f.prefill_done_s = self.now()
        try:
            out = codec.loads(payload)
            prompt_tokens = int(out["usage"]["prompt_tokens"])
        except (ValueError, KeyError, TypeError) as e:
            raise EngineFailed(
                f.prefill_id, "prefill", f"unreadable prefill response: {str(e)[:200]}", "unreadable"
            ) from e
        self.router.prefill_done(f.request_id, f.prefill_done_s, prompt_tokens)
        self._prompt_counted(f, f.prefill_id, prompt_tokens)
        kv = out.get("kv_transfer_params")
        f.cached_tokens = cached_tokens(out, kv)
        self._blocks_owed(f, f.prefill_id)
        if not isinstance(kv, dict) or not kv:
            return None, None
        if kv.get("do_remote_prefill"):
            f.handoff = (f.decode_id or "", kv)  # the prefill engine holds the blocks until they are pulled
        return kv, None

    def _prompt_counted(self, f: Flight, engine_id: str, prompt_tokens: int) -> None:
        """The engine that prefilled the prompt counted ``prompt_tokens``: the request's length from now on,
        and what the length estimate learns from."""
        if f.prompt_chars is None and prompt_tokens != f.prompt_tokens:
            # priced exactly, yet not what the engine prefilled: a tokenizer or template that drifted
            self.metrics.prompt_tokens_mismatch.labels(engine_id).inc()
        self.prompt_length.learn(f.prompt_chars, prompt_tokens)
        f.prompt_tokens = prompt_tokens

    def _blocks_owed(self, f: Flight, engine_id: str) -> None:
        """``engine_id`` prefilled the prompt: where it cached blocks the index did not know of, their
        BlockStored is owed (kv_events.py: a stream that stays silent then counts as stale)."""
        prefix = self.router.prefix
        if (
            self.kv_events is not None
            and prefix is not None
            and len(f.prefix_blocks) * prefix.block_tokens > f.predicted_cached_tokens
        ):
            self.kv_events.expect(engine_id)

    def _first_token(self, f: Flight, now: float) -> None:
        """The first token came. On the local path the prefill ended with it: the router's first_token
        ends its prefill too (the ledger's phase 0), and the decode engine's new blocks are owed."""
        self.router.first_token(f.request_id, now)
        if f.local:
            f.prefill_done_s = now
            self._blocks_owed(f, f.decode_id or "")

    def _local_usage(self, f: Flight, usage: Any) -> None:
        """A local prefill's usage, as its decode engine reported it: the prompt's length as the engine
        counted it, and what it served from its prefix cache (``prompt_tokens_details.cached_tokens``)."""
        if not isinstance(usage, dict):
            return
        f.cached_tokens = cached_tokens({"usage": usage}, None)
        prompt_tokens = usage.get("prompt_tokens")
        if type(prompt_tokens) is int and prompt_tokens > 0:
            self._prompt_counted(f, f.decode_id or "", prompt_tokens)

    async def _client_error(self, f: Flight, status: int, payload: bytes) -> Response | Stream:
        """An engine refused the request as malformed: the client's problem, not the engine's. Its JSON
        error goes back as it came; a refusal that is no JSON object (a gateway's HTML page in front of the
        engine) is not handed on: the client gets the status with the proxy's own JSON error instead."""
        self._finish(f, RequestStatus.REJECTED, f"HTTP {status}: {payload[:200].decode(errors='replace')}")
        try:
            readable = isinstance(codec.loads(payload), dict)
        except ValueError:
            readable = False
        if not readable:
            return await self._error(f, status, f"{ENGINE_REFUSED} (HTTP {status})", "BadRequestError")
        return await self._error(f, status, "", "BadRequestError", payload)

    async def _decode(
        self, request: Request, body: dict[str, Any], path: str, f: Flight, kv: dict[str, Any] | None
    ) -> Response | Stream:
        assert f.decode_id is not None
        try:
            r = await self._endpoints[f.decode_id].request(
                "POST",
                path,
                self._headers(f),
                codec.dumps(handoff.decode_body(body, kv)),
                read_timeout_s=self._silence_bound_s(body, f),
            )
            async with r:
                if r.status >= 500 or 300 <= r.status < 400:
                    raise _status_failed(f.decode_id, f.hop, r.status)
                if r.status >= 400:
                    # vLLM's decode side frees a refused request's remote blocks itself (its serving
                    # layer's abort_immediately path): nothing to release.
                    f.handoff = None
                    return await self._client_error(
                        f, r.status, await r.read(self.cfg.answer_limits.max_answer_bytes)
                    )
                if not body.get("stream"):
                    return await self._relay_json(r, f)
                return await self._relay_stream(request, r, f, handoff.client_wants_usage(body))
        except (UpstreamError, TimeoutError) as e:
            raise _failed(f.decode_id, f.hop, e) from e

    def _silence_bound_s(self, body: dict[str, Any], f: Flight) -> float:
        """How long the decode engine may stay silent before it counts as stalled. A stream sends a token
        every step; a JSON answer says nothing until the last one, so its bound grows with the tokens asked
        for, priced at SLOW_STEPS_PER_TOKEN calibrated decode steps each (a full batch, a long context). On
        the local path the prefill comes first, in silence: the bound adds what a prefill engine is given
        (prefill_timeout_s)."""
        prefill_s = self.cfg.prefill_timeout_s if f.local else 0.0
        if body.get("stream"):
            return self.cfg.stall_timeout_s + prefill_s
        limit = body.get("max_tokens") or body.get("max_completion_tokens")
        tokens = limit if isinstance(limit, int) else self.cfg.cluster.max_model_len - f.prompt_tokens
        step_s = SLOW_STEPS_PER_TOKEN * self.cfg.calibration.tau_dec_s
        return self.cfg.stall_timeout_s + prefill_s + tokens * step_s

    async def _relay_json(self, r: EngineAnswer, f: Flight) -> Response:
        payload = await r.read(self.cfg.answer_limits.max_answer_bytes)
        f.handoff = None  # the decode engine answered: it pulled the blocks
        now = self.now()
        try:
            out = codec.loads(payload)
        except ValueError as e:
            # Not the JSON the client asked for (an HTML page from a gateway, a half-written engine): never
            # handed on; an engine failure like a 5xx, retried while the client has nothing yet.
            raise EngineFailed(
                f.decode_id or "", f.hop, f"unreadable completion: {str(e)[:200]}", "unreadable"
            ) from e
        if not isinstance(out, dict):
            raise EngineFailed(f.decode_id or "", f.hop, "unreadable completion: not an object", "unreadable")
        try:
            f.output_tokens = int(out["usage"]["completion_tokens"])
        except (KeyError, TypeError, ValueError):
            f.output_tokens = 0  # a completion without usage is still the answer
        # A JSON answer has no token timing: first and last token are the moment it arrives.
        f.first_token_s = f.last_token_s = now
        self._first_token(f, now)
        if f.local:
            self._local_usage(f, out.get("usage"))
        self._finish(f, RequestStatus.OK, None)
        return Response(payload, r.status, headers={REQUEST_ID_HEADER: f.request_id})

    async def _relay_stream(
        self, request: Request, r: EngineAnswer, f: Flight, client_wants_usage: bool
    ) -> Response | Stream:
        """Relay the decode engine's SSE stream (relay.py). The response head goes to the client as soon
        as the decode engine's own does, as vLLM sends it, so that the client has read it before the first
        token comes. Every piece, the first included, goes from the engine connection's data callback
        straight to the client: the first token does not wait for this task to wake (under load, behind the
        other streams' pieces of the same loop turn). Until a first piece comes, a failure is the engine's
        and the caller retries elsewhere, into the same response.

        Two sides can fail after that and they mean different things: a read from the engine that breaks
        is the engine's fault (out of routing); a write to the client that breaks is the client leaving
        (the engine is fine). The record is written before the stream's end goes out, so a client that
        has seen the whole answer can already find its record."""
        if f.stream is None:
            # What the prefill engine served from its cache; on the local path the decode engine says so
            # only at the end, in its usage event (the client's, when asked for).
            headers = {**SSE_HEADERS, REQUEST_ID_HEADER: f.request_id}
            if not f.local:
                headers[CACHED_TOKENS_HEADER] = str(f.cached_tokens)
            try:
                f.stream = request.stream(200, headers)
            except ConnectionError as e:
                raise self._client_gone(f) from e
        resp = f.stream
        relay = StreamRelay(
            client_wants_usage,
            self.now,
            lambda now: self._first_token(f, now),
            self.cfg.answer_limits.max_event_bytes,
        )
        try:
            relay.attach(resp.transport, resp.chunked, r)
            try:
                await r.relay(relay.piece)
                if relay.pending:
                    # An event the stream never ended: an SSE client drops it, and it was never checked
                    # (relay.py). The stream broke off: retried if it was all there was, else cut off.
                    raise ProtocolError("unreadable", "the stream ended inside an event")
                if not relay.started:
                    raise EngineFailed(f.decode_id or "", f.hop, "empty response")
                tail = b""
            except (UpstreamError, TimeoutError) as e:
                if not relay.started:
                    raise  # nothing reached the client: the caller retries on another decode engine
                # The tokens so far went out; an event cut short does not, the end of the stream does.
                relay.drop_pending()
                error = f"decode engine {f.decode_id} broke off the stream: {type(e).__name__}: {e}"
                kind = e.kind if isinstance(e, ProtocolError) else None
                self._engine_failed(f.decode_id or "", f.hop, error, kind, f)
                relay.error = error
                tail = error_event(502, STREAM_BROKE, "BadGateway")
            finally:
                relay.detach()
            if relay.client_gone:
                raise self._client_gone(f)
            if tail:
                await self._to_client(f, resp.write(tail))
        finally:
            if relay.heard:  # the decode engine answered with events: it had pulled the blocks
                f.handoff = None
            f.first_token_s, f.last_token_s = relay.first_token_s, relay.last_token_s
            if relay.output_tokens is not None:
                f.output_tokens = relay.output_tokens
            if f.local:
                self._local_usage(f, relay.usage)
        self._finish(f, RequestStatus.FAILED if relay.error else RequestStatus.OK, relay.error)
        try:
            await resp.write_eof()
        except ConnectionError:
            pass  # the client left after the last byte was written: the record stands
        return resp

    def _client_gone(self, f: Flight) -> ClientGone:
        self._finish(f, RequestStatus.CANCELLED, "client disconnected")
        return ClientGone()

    async def _to_client(self, f: Flight, write: Awaitable[Any]) -> None:
        try:
            await write
        except ConnectionError as e:
            raise self._client_gone(f) from e

    def _finish(self, f: Flight, status: RequestStatus, error: str | None) -> None:
        if f.recorded:
            return
        f.recorded = True
        now = self.now()
        ok = status is RequestStatus.OK
        if f.admitted:
            if ok and f.first_token_s is None:
                self.router.first_token(f.request_id, now)
            self.router.done(f.request_id, f.prompt_tokens, f.output_tokens, now, ok, f.first_token_s)
            f.admitted = False
        policy = self.policy_name
        rec = f.record(policy, status, error)
        writer = self._writer()
        if writer is not None:
            writer.write(rec)
        self.metrics.requests.labels(policy, f.prefill_id or "", f.decode_id or "", status.value).inc()
        if ok:
            self.metrics.prompt_tokens.labels(policy).inc(f.prompt_tokens)
            self.metrics.cached_tokens.labels(policy).inc(f.cached_tokens)
            self.metrics.predicted_cached_tokens.labels(policy).inc(f.predicted_cached_tokens)
        if ok and rec.ttft_s is not None:
            self.metrics.ttft.observe(rec.ttft_s)
            if f.output_tokens >= 2 and rec.tpot_s is not None:
                self.metrics.tpot.observe(rec.tpot_s)
