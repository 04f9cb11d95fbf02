"""Several emulated engines in one process and event loop, and the KV side channel between them.

A decode engine pulls held KV from the prefill engine named in ``kv_transfer_params`` (remote_host,
remote_port): directly when that engine lives in this process, over HTTP otherwise. An unreachable
prefill engine fails the pull after the handshake timeout, as NIXL's does (about 5 s in vLLM).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from calroute.contract.kv_events import KvEventsConfig, binds, engine_endpoint
from calroute.costmodel.profiles import HardwareProfile
from calroute.emulator.core import EngineCore
from calroute.emulator.faults import Faults
from calroute.emulator.publisher import ZmqPublisher
from calroute.emulator.request import PullFailed
from calroute.emulator.server import EngineServer
from calroute.types import Role

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineSpec:
    role: Role
    port: int  # 0: any free port


@dataclass(frozen=True)
class GroupConfig:
    profile: HardwareProfile
    model_name: str = "emulated"
    host: str = "127.0.0.1"
    time_scale: float = 1.0
    stream_interval: int = 1
    kv_lease_s: float = 30.0
    kv_failure_policy: str = "fail"
    handshake_timeout_s: float = 5.0
    seed: int = 0
    kv_events: KvEventsConfig | None = None  # vLLM's --kv-events-config; engine i's port offset by i


@dataclass
class RunningEngine:
    spec: EngineSpec
    core: EngineCore
    server: EngineServer
    runner: web.AppRunner
    port: int
    crashed: bool = False
    publisher: ZmqPublisher | None = None

    @property
    def kv_events_endpoint(self) -> str | None:
        """Where this engine's KV events are published (None: events off)."""
        return None if self.publisher is None else self.publisher.endpoint

    @property
    def url(self) -> str:
        return f"http://{self.core.address[0]}:{self.port}"


@dataclass
class EngineGroup:
    config: GroupConfig
    engines: list[RunningEngine] = field(default_factory=list)
    _session: aiohttp.ClientSession | None = None

    async def start(self, specs: list[EngineSpec]) -> list[RunningEngine]:
        self._session = aiohttp.ClientSession()
        for i, spec in enumerate(specs):
            self.engines.append(await self._start_one(spec, i))
        return self.engines

    async def _start_one(self, spec: EngineSpec, index: int) -> RunningEngine:
        cfg = self.config
        publisher = None
        if cfg.kv_events is not None and cfg.kv_events.enabled:
            ev = cfg.kv_events
            publisher = ZmqPublisher(
                engine_endpoint(ev.endpoint, index, cfg.host), binds(ev.endpoint), ev.topic, ev.hwm
            )
        core = EngineCore(
            engine_id=str(uuid.uuid4()),
            profile=cfg.profile,
            time_scale=cfg.time_scale,
            kv_lease_s=cfg.kv_lease_s,
            kv_failure_policy=cfg.kv_failure_policy,
            publish_events=None if publisher is None else publisher.publish,
        )
        core.puller = lambda params, pull_tokens: self._pull(core, params, pull_tokens)
        core.releaser = self._release
        server = EngineServer(
            core,
            cfg.model_name,
            cfg.stream_interval,
            Faults(),
            seed=cfg.seed + index,
            on_crash=self._crash_soon,
        )
        runner = web.AppRunner(server.app(), handler_cancellation=True, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, cfg.host, spec.port, reuse_address=True)
        await site.start()
        port = runner.addresses[0][1]
        core.address = (cfg.host, port)
        core.start()
        return RunningEngine(spec, core, server, runner, port, publisher=publisher)

    def _by_port(self, host: str, port: int) -> RunningEngine | None:
        if host not in ("127.0.0.1", "localhost", self.config.host):
            return None
        for e in self.engines:
            if e.port == port and not e.crashed:
                return e
        return None

    async def _pull(self, core: EngineCore, params: dict[str, Any], pull_tokens: int) -> bool:
        """Read ``pull_tokens`` of the held prompt (what the decode engine's cache lacks) from the prefill
        engine ``params`` name."""
        host = str(params["remote_host"])
        port = int(params["remote_port"])
        rid = str(params["remote_request_id"])
        started = time.monotonic()
        local = self._by_port(host, port)
        if local is not None:
            status, found = await local.server.serve_pull(rid, pull_tokens)
        else:
            assert self._session is not None
            try:
                timeout = aiohttp.ClientTimeout(
                    total=self.config.handshake_timeout_s + core.transfer_s(pull_tokens)
                )
                async with self._session.post(
                    f"http://{host}:{port}/_calroute/kv/pull",
                    json={"remote_request_id": rid, "tokens": pull_tokens},
                    timeout=timeout,
                ) as r:
                    status = r.status
                    found = bool((await r.json()).get("found")) if status == 200 else False
            except (aiohttp.ClientError, TimeoutError) as e:
                await asyncio.sleep(max(0.0, self.config.handshake_timeout_s - (time.monotonic() - started)))
                raise PullFailed(f"prefill engine {host}:{port} unreachable ({type(e).__name__})") from e
        if status == 503:
            raise PullFailed(f"prefill engine {host}:{port} refused the KV pull")
        if status != 200:
            raise PullFailed(f"prefill engine {host}:{port} answered the KV pull with HTTP {status}")
        if not found:
            await asyncio.sleep(core.transfer_s(pull_tokens))  # the decode side reads the blocks anyway
        return found

    async def _release(self, params: dict[str, Any]) -> None:
        """Tell a prefill engine to free a request's held blocks unread (the notification vLLM's decode side
        sends for a request aborted before it was scheduled). Best effort, as there: a prefill engine that
        cannot be told frees them when their lease expires."""
        try:
            host = str(params["remote_host"])
            port = int(params["remote_port"])
            rid = str(params["remote_request_id"])
        except (KeyError, TypeError, ValueError):
            return
        local = self._by_port(host, port)
        if local is not None:
            local.core.release_held(rid)
            return
        assert self._session is not None
        try:
            async with self._session.post(
                f"http://{host}:{port}/_calroute/kv/pull",
                json={"remote_request_id": rid, "transfer": False},
                timeout=aiohttp.ClientTimeout(total=self.config.handshake_timeout_s),
            ) as r:
                await r.read()
        except (aiohttp.ClientError, TimeoutError) as e:
            logger.warning("could not tell %s:%s to free the KV of %s: %s", host, port, rid, type(e).__name__)

    def _crash_soon(self, server: EngineServer) -> None:
        for e in self.engines:
            if e.server is server:
                asyncio.get_running_loop().create_task(self.crash(e))

    async def crash(self, engine: RunningEngine) -> None:
        """The engine dies: its port closes, open requests are cut off, held KV is lost."""
        if engine.crashed:
            return
        engine.crashed = True
        engine.server.abort_in_flight()
        await engine.runner.cleanup()
        await engine.core.stop()
        if engine.publisher is not None:
            engine.publisher.close()  # a dead engine's event stream goes silent, as a dead vLLM's does
        logger.warning("engine on port %d crashed (injected fault)", engine.port)

    async def stop(self) -> None:
        for e in self.engines:
            if not e.crashed:
                e.server.abort_in_flight()
                await e.runner.cleanup()
                await e.core.stop()
                if e.publisher is not None:
                    e.publisher.close()
        if self._session is not None:
            await self._session.close()
