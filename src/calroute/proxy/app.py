"""The proxy: an OpenAI-compatible front that routes each request to a prefill and a decode engine.

This module is the shell: it builds the parts (router, ledger, engine signals, metrics, connections),
starts and stops them, and serves the surface around generation (models, health, metrics, admin). One
request's life, from admission to its record, is generate.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import IO, Any

from prometheus_client import CONTENT_TYPE_LATEST

from calroute.contract.blocks import BLOCK_TOKENS
from calroute.contract.tokenizer import AsyncTokenizer, Tokenizer
from calroute.policies import check_live_policy, make_policy
from calroute.proxy import admin, surface
from calroute.proxy.config import ENGINE_KEEPALIVE_S, ProxyConfig
from calroute.proxy.engine_client import EngineClient
from calroute.proxy.generate import Generation
from calroute.proxy.http.client import Endpoint
from calroute.proxy.http.messages import Request, Response, json_response
from calroute.proxy.http.server import Server
from calroute.proxy.kv_events import KvEventSubscriber, PreciseIndex
from calroute.proxy.looplag import LoopLag
from calroute.proxy.metrics import ProxyMetrics
from calroute.proxy.prompt_length import PromptLength
from calroute.proxy.signals import ProbeFactory, Signals
from calroute.results.records import RecordWriter
from calroute.routing.build import build_router
from calroute.routing.decisions import DecisionLog
from calroute.routing.ledger import Ledger
from calroute.routing.router import Decision
from calroute.routing.seeds import RouterSeeds

RELEASE_GRACE_S = 2.0  # how long a stopping proxy lets release legs under way finish


class Proxy:
    """``tokenizer``: the served model's (contract/tokenizer.py), whose ids the engines cache; None: text and
    chat prompts are not matched against the engines' caches. ``engines`` (by engine id) and ``probe``
    replace the engine connections and the /metrics and /health polls' (tests: in-memory fake engines); by
    default, the proxy's own HTTP client to each engine's URL."""

    def __init__(
        self,
        cfg: ProxyConfig,
        tokenizer: Tokenizer | AsyncTokenizer | None,
        engines: Mapping[str, EngineClient] | None = None,
        probe: ProbeFactory | None = None,
    ) -> None:
        check_live_policy(cfg.policy)
        self.cfg = cfg
        self._t0 = time.monotonic()
        self.ledger = Ledger(cfg.cluster.instance_specs(), cfg.calibration)
        self.policy_params: dict[str, Any] = dict(cfg.policy_params)
        # The prefix index is bounded by the engines' KV capacities (PrefixIndex), and keyed in the engines'
        # block size (the cluster file's, else the emulator's) and the router's hashes (prefix.prompt_blocks;
        # real vLLM's events are translated into them, contract/blocks.py).
        block_tokens = cfg.cluster.block_tokens or BLOCK_TOKENS
        self.prefix = PreciseIndex(cfg.cluster.instance_specs(), block_tokens) if cfg.prefix_index else None
        # The request and decision logs, open between start and stop.
        self._writer: RecordWriter | None = None
        self._decision_log: DecisionLog | None = None
        self.router = build_router(
            cfg.policy,
            cfg.policy_params,
            cfg.calibration,
            self.ledger,
            seeds=RouterSeeds(predictor=cfg.predictor_seed),  # seeded policies: their "seed" param, or 0
            predictor=cfg.predictor,
            predictor_noise=cfg.predictor_noise,
            online_calibration=cfg.online_calibration,
            # refits rebuild the policy routing then (switch_policy may have changed it)
            policy_factory=lambda cal: make_policy(self.policy_name, self.policy_params, cal),
            prefix=self.prefix,
            on_decision=self._log_decision if cfg.decision_log_path is not None else None,
        )
        self._engine_headers = {"Authorization": f"Bearer {cfg.engine_api_key}"} if cfg.engine_api_key else {}
        self.signals = Signals(
            list(cfg.cluster.engines),
            self.ledger,
            self.now,
            cfg.poll_interval_s,
            cfg.health_interval_s,
            self._engine_headers,
            poll_metrics=self._reads_samples(),
            probe=probe,
            probe_max_bytes=cfg.answer_limits.max_probe_bytes,
        )
        self.metrics = ProxyMetrics(
            self._live, self._prices, tokenizer.counters if tokenizer is not None else None
        )
        self._loop_lag = LoopLag(self.metrics.loop_lag.observe)
        self.prompt_length = PromptLength()
        self.urls = {e.id: e.url for e in cfg.cluster.engines}
        # Client traffic only: the polls and probes keep connections of their own (signals.py).
        self._endpoints: Mapping[str, EngineClient] = (
            engines
            if engines is not None
            else {e.id: Endpoint(e.url, ENGINE_KEEPALIVE_S) for e in cfg.cluster.engines}
        )
        event_endpoints = {
            e.id: e.kv_events_endpoint for e in cfg.cluster.engines if e.kv_events_endpoint is not None
        }
        self.kv_events = (
            KvEventSubscriber(
                event_endpoints,
                self.prefix,
                self.metrics.registry,
                self.now,
                # Only the emulator names blocks by the router's own hashes; real vLLM's are translated.
                translate_hashes=cfg.cluster.kind != "emulated",
            )
            if self.prefix is not None and event_endpoints
            else None
        )
        self.generation = Generation(
            cfg,
            self.router,
            self.signals,
            self.metrics,
            self.prompt_length,
            self._endpoints,
            self._engine_headers,
            self.now,
            tokenizer,
            self.kv_events,
            lambda: self._writer,
        )
        self._log: IO[str] | None = None
        self._decision_stream: IO[str] | None = None
        self._server = Server(
            {
                ("POST", "/v1/completions"): self.generation.completions,
                ("POST", "/v1/chat/completions"): self.generation.chat,
                ("GET", "/v1/models"): self._models,
                ("GET", "/health"): self._health,
                ("GET", "/metrics"): self._metrics,
                ("GET", "/state"): self._state,
                ("POST", "/admin/policy"): self._set_policy,
            },
            cfg.client_limits,
        )

    def now(self) -> float:
        return time.monotonic() - self._t0

    @property
    def policy_name(self) -> str:
        return self.router.policy.name

    def switch_policy(self, name: str, params: dict[str, Any]) -> None:
        """Route with another policy from the next request on (ConfigError if it cannot be made)."""
        check_live_policy(name)
        self.router.switch_policy(make_policy(name, params, self.router.constants or self.cfg.calibration))
        self.policy_params = dict(params)
        self.signals.set_polling(self._reads_samples())

    def _log_decision(self, d: Decision) -> None:
        """The router's decision hook when there is a decision log: logged while it is open."""
        if self._decision_log is not None:
            self._decision_log(d)

    def _reads_samples(self) -> bool:
        """Whether anything reads the engines' metrics samples: the policy, or online recalibration (it
        fits decode steps against the sampled batch)."""
        return self.router.policy.reads_engine_samples or self.cfg.online_calibration

    def _prices(self) -> tuple[float, float]:
        cal = self.router.constants or self.cfg.calibration
        return cal.tau_pre_s, cal.tau_dec_s

    def _live(self) -> list[tuple[str, bool, float | None]]:
        now = self.now()
        return [
            (e, self.signals.healthy[e], None if t is None else now - t)
            for e, t in self.signals.last_sample_s.items()
        ]

    # ---- serving ------------------------------------------------------------------------------------

    async def start(self, host: str, port: int, signals: bool = True) -> int:
        """Open the logs, start the engine signals (unless told not to: they stay as they are until a
        request fails), listen; returns the port (chosen if ``port`` is 0)."""
        if self.cfg.log_path is not None:
            self.cfg.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = self.cfg.log_path.open("a")
            self._writer = RecordWriter(self._log, flush_every=1)
        if self.cfg.decision_log_path is not None:
            self.cfg.decision_log_path.parent.mkdir(parents=True, exist_ok=True)
            self._decision_stream = self.cfg.decision_log_path.open("a", buffering=1)
            self._decision_log = DecisionLog(self._decision_stream)
        if signals:
            self.signals.start()
        if self.kv_events is not None:
            self.kv_events.start()
        self._loop_lag.start()
        return await self._server.start(host, port)

    async def stop(self) -> None:
        """Stop listening, let requests under way finish (briefly), close engines' connections and logs."""
        await self._server.stop()
        await self.signals.stop()
        if self.kv_events is not None:
            await self.kv_events.stop()
        self._loop_lag.stop()
        # Release legs under way free prefill engines' KV (generate.py): a moment to finish, not a wait.
        try:
            await asyncio.wait_for(self.generation.releases.done(), RELEASE_GRACE_S)
        except TimeoutError:
            pass
        self.generation.close()
        for endpoint in self._endpoints.values():
            endpoint.close()
        for stream in (self._log, self._decision_stream):
            if stream is not None:
                stream.close()

    # ---- the rest of the surface --------------------------------------------------------------------

    async def _models(self, request: Request) -> Response:
        return json_response(surface.models(self.cfg.cluster))

    async def _health(self, request: Request) -> Response:
        body, status = surface.health(self.cfg.cluster, self.signals.healthy)
        return json_response(body, status)

    async def _metrics(self, request: Request) -> Response:
        return Response(self.metrics.exposition(), content_type=CONTENT_TYPE_LATEST)

    async def _state(self, request: Request) -> Response:
        return admin.authorized(self.cfg.admin_token, request) or json_response(admin.state(self))

    async def _set_policy(self, request: Request) -> Response:
        return admin.authorized(self.cfg.admin_token, request) or await admin.set_policy(self, request)
