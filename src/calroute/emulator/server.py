"""One emulated engine's HTTP server (aiohttp): the surface routers and benchmarks use of vLLM.

Routes: /v1/completions and /v1/chat/completions (JSON and SSE), /v1/models, /health, /metrics, /tokenize,
/detokenize, /reset_prefix_cache; and two of our own: /_calroute/kv/pull (the side channel a decode
engine pulls held KV through, or frees it unread with ``"transfer": false``: our stand-in for NIXL) and
/_calroute/faults (inject faults at run time: what they are, and the bad answers, in faults.py).
Several servers may share a process and an event loop (see group.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from aiohttp import web

from calroute.contract.blocks import BLOCK_TOKENS
from calroute.emulator import api, tokens
from calroute.emulator.core import EngineCore
from calroute.emulator.faults import BAD_ANSWERS, Faults, bad_answer
from calroute.emulator.metrics import EngineMetrics
from calroute.emulator.request import EngineRequest

logger = logging.getLogger(__name__)


def _error(e: api.ApiError) -> web.Response:
    return web.json_response(e.body(), status=e.status)


class EngineServer:
    def __init__(
        self,
        core: EngineCore,
        model_name: str,
        stream_interval: int = 1,
        faults: Faults | None = None,
        seed: int = 0,
        on_crash: Callable[[EngineServer], None] | None = None,
        prompt_tokens_details: bool = True,
    ) -> None:
        """``prompt_tokens_details``: usage reports the prompt tokens served from the prefix cache, as vLLM
        does with --enable-prompt-tokens-details, which the project's real engines run with
        (cluster/vllm.py)."""
        if stream_interval < 1:
            raise ValueError(f"stream_interval must be >= 1, got {stream_interval}")
        self.core = core
        self.model_name = model_name
        self.stream_interval = stream_interval
        self.faults = faults or Faults()
        self.prompt_tokens_details = prompt_tokens_details
        self.metrics = EngineMetrics(core, model_name)
        core.observer = self.metrics.observe
        self._rng = random.Random(seed)
        # The bad_answer fault's own draws: setting it shifts no other fault's, and seed 0's first 25 draws
        # (every one over 0.2) would leave a short run at rate 0.2 without a single bad answer.
        self._bad_rng = random.Random(f"{seed}:bad_answer")
        self._on_crash = on_crash
        self._handlers: set[asyncio.Task[Any]] = set()
        self.bad_answers: Counter[str] = Counter({k: 0 for k in BAD_ANSWERS})  # injected, by kind
        self.created = int(time.time())

    @property
    def max_model_len(self) -> int:
        return self.core.profile.limits.max_model_len

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.add_routes(
            [
                web.post("/v1/completions", self._completions),
                web.post("/v1/chat/completions", self._chat),
                web.get("/v1/models", self._models),
                web.get("/health", self._health),
                web.get("/metrics", self._metrics),
                web.post("/tokenize", self._tokenize),
                web.post("/detokenize", self._detokenize),
                web.post("/reset_prefix_cache", self._reset_prefix_cache),
                web.post("/_calroute/kv/pull", self._kv_pull),
                web.get("/_calroute/faults", self._get_faults),
                web.post("/_calroute/faults", self._set_faults),
            ]
        )
        return app

    # ---- generation ---------------------------------------------------------------------------------

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            return await self._generate_inner(request, chat)
        finally:
            if task is not None:
                self._handlers.discard(task)

    async def _generate_inner(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return _error(api.invalid_json(str(e)))
        try:
            p = api.parse(body, chat, self.model_name, self.max_model_len)
        except api.ApiError as e:
            return _error(e)
        if self.faults.stall:
            if p.stream:  # vLLM's API server sends a stream's head before its engine core makes anything
                await web.StreamResponse(headers={"Content-Type": "text/event-stream"}).prepare(request)
            await asyncio.Event().wait()  # never answers; cancelled when the client goes away
        if self.faults.error_rate and self._rng.random() < self.faults.error_rate:
            status = self.faults.error_status
            kind = "ServiceUnavailableError" if status == 503 else "InternalServerError"
            return _error(api.ApiError(status, f"injected fault: HTTP {status}", None, kind))
        if self.faults.bad_answer_rate and self._bad_rng.random() < self.faults.bad_answer_rate:
            kind = self.faults.bad_answer
            self.bad_answers[kind] += 1
            return await bad_answer(request, kind, p.stream)
        request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        kv = p.kv_transfer_params or {}
        pull = kv if kv.get("do_remote_prefill") else None
        if pull is not None and not all(
            pull.get(k) is not None
            for k in ("remote_engine_id", "remote_request_id", "remote_host", "remote_port")
        ):
            logger.warning("got invalid KVTransferParams %s: computing the prompt locally", pull)
            pull = None
        req = EngineRequest(
            request_id=f"{request_id}-{self.core.next_request_id()}",
            prompt_ids=p.prompt_ids,
            max_tokens=p.max_tokens,
            min_tokens=p.min_tokens,
            ignore_eos=p.ignore_eos,
            kv_pull=pull,
            hold_kv=bool(kv.get("do_remote_decode")),
            notify_every=self.stream_interval if p.stream else 1 << 30,
        )
        self.core.add(req)
        try:
            if p.stream:
                return await self._stream(request, p, req, request_id, kv)
            while not req.finished:
                req.updated.clear()
                await req.updated.wait()
            if req.error is not None:
                return _error(api.ApiError(500, req.error, None, "InternalServerError"))
            return web.json_response(
                api.full_response(
                    p,
                    request_id,
                    self.model_name,
                    req.output_ids,
                    req.finish_reason,
                    req.kv_transfer_params,
                    self._cache_use(req, kv),
                )
            )
        finally:
            if not req.finished:
                self.core.abort(req)  # the client went away (or we crashed): free the engine's work

    def _cache_use(self, req: EngineRequest, kv: dict[str, Any]) -> api.CacheUse | None:
        """What usage reports of the prefix cache (None: not reported): the tokens served from it and those
        the prefill added to it. A decode request of the handoff reports its prefill engine's hit, as vLLM's
        output processor does (the ``remote_prefill_cached_tokens`` of its kv_transfer_params), and adds
        nothing (its prompt came whole, from the cache or the pull); any other, its own lookup's, and the
        prompt's full blocks past it (vLLM's PrefillStats.finalize)."""
        if not self.prompt_tokens_details:
            return None
        if kv.get("do_remote_prefill"):
            remote = kv.get("remote_prefill_cached_tokens")
            if isinstance(remote, int) and not isinstance(remote, bool):
                return remote, 0
        cached = req.cached_tokens
        return cached, max(0, req.prompt_tokens // BLOCK_TOKENS * BLOCK_TOKENS - cached)

    async def _stream(
        self,
        request: web.Request,
        p: api.Parsed,
        req: EngineRequest,
        request_id: str,
        kv: dict[str, Any],
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        created = int(time.time())
        sent = 0
        if p.chat:  # vLLM's first chat chunk carries the role and no content
            await resp.write(
                api.sse(api.stream_chunk(p, request_id, self.model_name, created, [], None, role=True))
            )
        while True:
            if not req.finished:
                req.updated.clear()
                await req.updated.wait()
            if req.error is not None:
                await resp.write(api.sse(api.ApiError(500, req.error, None, "InternalServerError").body()))
                break
            n = len(req.output_ids)
            if n > sent or req.finished:
                new = req.output_ids[sent:n]
                sent = n
                finish = req.finish_reason if req.finished else None
                usage = api.usage(len(p.prompt_ids), n) if p.continuous_usage else None
                chunk = api.stream_chunk(
                    p, request_id, self.model_name, created, new, finish, usage_obj=usage
                )
                await resp.write(api.sse(chunk))
            if req.finished:
                if p.include_usage:
                    chunk = api.usage_chunk(
                        p, request_id, self.model_name, created, n, self._cache_use(req, kv)
                    )
                    await resp.write(api.sse(chunk))
                break
        await resp.write(api.sse("[DONE]"))
        await resp.write_eof()
        return resp

    # ---- the rest of the surface --------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.Response:
        model = {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "vllm",
            "root": self.model_name,
            "parent": None,
            "max_model_len": self.max_model_len,
            "permission": [
                {
                    "id": f"modelperm-{self.core.engine_id}",
                    "object": "model_permission",
                    "created": self.created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }
        return web.json_response({"object": "list", "data": [model]})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.faults.metrics_down:
            return web.Response(status=503, text="metrics unavailable (injected fault)\n")
        return web.Response(body=self.metrics.exposition(), content_type="text/plain", charset="utf-8")

    async def _tokenize(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise api.ApiError(400, "the request body must be a JSON object")
            if "messages" in body:
                ids = api.parse({**body, "max_tokens": 1}, True, self.model_name, 1 << 30).prompt_ids
            else:
                ids = api.parse({**body, "max_tokens": 1}, False, self.model_name, 1 << 30).prompt_ids
        except json.JSONDecodeError as e:
            return _error(api.invalid_json(str(e)))
        except api.ApiError as e:
            return _error(e)
        strs = [tokens.token_str(i) for i in ids] if body.get("return_token_strs") else None
        out = {"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids, "token_strs": strs}
        return web.json_response(out)

    async def _detokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        ids = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(ids, list) or not all(
            isinstance(i, int) and 0 <= i < tokens.VOCAB_SIZE for i in ids
        ):
            return _error(api.ApiError(400, "tokens must be a list of token ids", "tokens"))
        return web.json_response({"prompt": tokens.decode(ids)})

    async def _reset_prefix_cache(self, request: web.Request) -> web.Response:
        self.core.reset_prefix_cache()
        return web.json_response({"success": True})

    # ---- the KV side channel: a decode engine pulls a held prompt's KV --------------------------------

    async def serve_pull(self, remote_request_id: str, tokens: int | None = None) -> tuple[int, bool]:
        """(HTTP status, found). Found: wait the modelled time to move ``tokens`` of the prompt (the part the
        decode engine lacks; None: all of it), then free the blocks."""
        if self.faults.refuse_kv_pulls:
            return 503, False
        prompt_tokens = self.core.held_prompt_tokens(remote_request_id)
        if prompt_tokens is None:
            logger.error(
                "engine %s: potentially invalid KV blocks for unrecognized request %s (may have expired)",
                self.core.engine_id,
                remote_request_id,
            )
            self.core.stats.kv_unknown_pulls += 1
            return 200, False
        moved = prompt_tokens if tokens is None else min(tokens, prompt_tokens)
        await asyncio.sleep(self.core.transfer_s(moved))
        self.core.release_held(remote_request_id)
        return 200, True

    async def _kv_pull(self, request: web.Request) -> web.Response:
        body = await request.json()
        rid = body.get("remote_request_id") if isinstance(body, dict) else None
        if not isinstance(rid, str):
            return _error(api.ApiError(400, "remote_request_id is required", "remote_request_id"))
        if body.get("transfer") is False:  # the decode side aborted first: free the blocks unread
            return web.json_response({"found": self.core.release_held(rid) is not None})
        tokens = body.get("tokens")
        if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0):
            return _error(api.ApiError(400, "tokens must be an integer >= 0", "tokens"))
        status, found = await asyncio.shield(self.serve_pull(rid, tokens))
        return web.json_response({"found": found}, status=status)

    # ---- faults -------------------------------------------------------------------------------------

    def _faults_state(self) -> dict[str, Any]:
        """The settings, and (read only) the bad answers injected so far by kind."""
        return {**asdict(self.faults), "injected": {"bad_answer": dict(self.bad_answers)}}

    async def _get_faults(self, request: web.Request) -> web.Response:
        return web.json_response(self._faults_state())

    async def _set_faults(self, request: web.Request) -> web.Response:
        body = await request.json()
        if not isinstance(body, dict):
            return _error(api.ApiError(400, "the request body must be a JSON object"))
        crash = bool(body.pop("crash", False))
        body.pop("injected", None)  # what GET answered may be posted back: the counts are read only
        try:
            faults = Faults(**{**asdict(self.faults), **body})
            faults.validate()
        except TypeError as e:
            return _error(api.ApiError(400, f"unknown fault: {e}"))
        except api.ApiError as e:
            return _error(e)
        self.faults = faults
        self.core.slowdown = faults.slowdown
        if crash and self._on_crash is not None:
            asyncio.get_running_loop().call_soon(self._on_crash, self)
        return web.json_response(self._faults_state())

    def abort_in_flight(self) -> None:
        """A crash: every open generation request dies without an answer."""
        for task in list(self._handlers):
            task.cancel()
