"""Freeing a prefill engine's KV when the client leaves during the prefill or between prefill and decode
(docs/proxy.md, "A client that leaves").

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
from collections.abc import Callable, Mapping
from typing import Any

from calroute.contract import handoff
from calroute.proxy.config import PREFILL_GRACE_S, ProxyConfig
from calroute.proxy.engine_client import EngineClient
from calroute.proxy.http import codec
from calroute.proxy.metrics import ProxyMetrics

logger = logging.getLogger(__name__)


async def prefill_exchange(
    engine: EngineClient,
    path: str,
    headers: Mapping[str, str],
    payload: bytes,
    timeout_s: float,
    max_bytes: int,
    held_for_release: Callable[[dict[str, Any]], None],
) -> tuple[int, bytes]:
    """The prefill request to ``engine``, its status and whole answer (the engine says nothing until the
    prefill is done, then answers at once: a bound on its silence is a bound on the exchange). When the task
    awaiting it is cancelled (the client left), the answer is still awaited PREFILL_GRACE_S: one that comes
    with KV params held for a decode engine goes to ``held_for_release``, for the release leg; else the
    request is closed, which vLLM aborts, freeing its blocks. Raises what the engine's client raises."""

    async def exchange() -> tuple[int, bytes]:
        r = await engine.request("POST", path, headers, payload, read_timeout_s=timeout_s)
        async with r:
            return r.status, await r.read(max_bytes)

    task = asyncio.ensure_future(exchange())
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        kv = await _answer_in_grace(task)
        if kv is not None:
            held_for_release(kv)
        raise


async def _answer_in_grace(task: asyncio.Future[tuple[int, bytes]]) -> dict[str, Any] | None:
    try:
        done, _ = await asyncio.wait({task}, timeout=PREFILL_GRACE_S)
    finally:
        if not task.done():  # no answer in the grace (or the wait was cancelled too): close it
            task.cancel()
    if not done or task.cancelled() or task.exception() is not None:
        return None
    status, answer = task.result()
    try:
        kv = codec.loads(answer).get("kv_transfer_params") if status == 200 else None
    except (ValueError, AttributeError):
        return None
    return kv if isinstance(kv, dict) and kv.get("do_remote_prefill") else None


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
