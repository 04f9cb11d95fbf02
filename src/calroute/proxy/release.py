"""Freeing a prefill engine's KV when the client leaves between prefill and decode (docs/proxy.md, "A client
that leaves").

After a prefill with ``do_remote_decode``, vLLM's prefill engine keeps the prompt's blocks until a decode
engine pulls them, or until their lease expires: ``kv_lease_duration``, 30 s by default in vLLM 0.32
(nixl/base_scheduler.py), renewed by the decode engine's heartbeats while it has the request queued. vLLM has
no call that frees them from outside. So when a client leaves after its prefill engine answered and before
its decode engine made a token, the proxy still sends the decode leg, cut to one token and not streamed
(``handoff.release_body``): the decode engine pulls the blocks, which frees them on the prefill engine, and
ends. (A decode leg the decode engine had already taken frees them too, once it is aborted: vLLM's decode
side tells the prefill engine to free the blocks of a request it drops before scheduling it. The release
then finds them gone, which the prefill engine logs and the decode engine ignores.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from calroute.contract import handoff
from calroute.proxy.config import ProxyConfig
from calroute.proxy.engine_client import EngineClient
from calroute.proxy.http import codec
from calroute.proxy.metrics import ProxyMetrics

logger = logging.getLogger(__name__)


class Releases:
    """The release legs under way, each a task of its own: the request's handler is being cancelled when
    one is sent. Its answer is read to its cap and dropped; the request's record is already written."""

    def __init__(
        self,
        endpoints: Mapping[str, EngineClient],
        engine_headers: Mapping[str, str],
        cfg: ProxyConfig,
        metrics: ProxyMetrics,
    ) -> None:
        self._endpoints = endpoints
        self._engine_headers = engine_headers
        self._cfg = cfg
        self._metrics = metrics
        self._tasks: set[asyncio.Task[None]] = set()

    def send(
        self, request_id: str, decode_id: str, path: str, body: dict[str, Any], kv: dict[str, Any]
    ) -> None:
        """Send ``decode_id`` the release leg of ``body`` (the client's), with the prefill engine's ``kv``."""
        payload = codec.dumps(handoff.release_body(body, kv))
        task = asyncio.get_running_loop().create_task(
            self._leg(request_id, decode_id, path, payload), name=f"release-{request_id}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _leg(self, request_id: str, decode_id: str, path: str, payload: bytes) -> None:
        endpoint = self._endpoints.get(decode_id)
        outcome = "failed"
        try:
            if endpoint is not None:
                r = await endpoint.request(
                    "POST",
                    path,
                    {**self._engine_headers, "X-Request-Id": request_id},
                    payload,
                    read_timeout_s=self._cfg.prefill_timeout_s,
                )
                async with r:
                    await r.read(self._cfg.answer_limits.max_answer_bytes)
                outcome = "ok" if r.status < 400 else "refused"
        except Exception as e:  # nobody waits for this answer: what went wrong is logged, not raised
            logger.warning(
                "release of request %s's KV through decode engine %s failed: %s: %s",
                request_id,
                decode_id,
                type(e).__name__,
                e,
            )
        self._metrics.kv_releases.labels(outcome).inc()

    async def done(self) -> None:
        """Until every release leg sent so far has ended (the proxy's stop; tests)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
