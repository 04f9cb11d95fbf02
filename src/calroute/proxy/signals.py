"""Live signals per engine: /metrics polled every 50 ms (KV usage, running, waiting) and /health probes.

An engine that fails a request, or three health probes in a row (one slow answer from an overloaded
engine is not a failure), is taken out of routing; a probe that succeeds brings it back. Metrics that
cannot be read leave the last sample in place (its age shows in the proxy's metrics) and do not, by
themselves, take an engine out: generation may well be working.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from calroute.cluster.file import ClusterEngine
from calroute.contract import metrics as names
from calroute.proxy.config import MAX_PROBE_BYTES
from calroute.proxy.http.scrape import ScrapeError, Scraper
from calroute.routing.ledger import Ledger

logger = logging.getLogger(__name__)

PROBE_FAILURES_TO_MARK = 3


class Probe(Protocol):
    """GET one URL of an engine, again and again (http/scrape.py's Scraper; a fake in tests)."""

    async def get(self) -> tuple[int, bytes]:
        """(status, body); raises ScrapeError when the engine cannot answer."""
        ...

    def close(self) -> None: ...


# Makes the Probe of one URL: (url, headers, timeout_s), as Scraper's constructor takes them.
ProbeFactory = Callable[[str, Mapping[str, str], float], Probe]

_NAMES = {
    names.KV_CACHE_USAGE.encode(): 0,
    names.GPU_CACHE_USAGE.encode(): 0,
    names.NUM_REQUESTS_RUNNING.encode(): 1,
    names.NUM_REQUESTS_WAITING.encode(): 2,
}


def parse_vllm_metrics(text: bytes) -> tuple[float, float, float] | None:
    """(KV usage 0..1, running, waiting), each summed over label sets; None if a gauge is missing.

    Searches for the three gauges instead of parsing every line: a real vLLM exposition is tens of
    kilobytes of histograms, scraped 20 times a second per engine.
    """
    values = [0.0, 0.0, 0.0]
    seen = [False, False, False]
    for name, slot in _NAMES.items():
        if seen[slot]:
            continue
        start = 0
        while True:
            i = text.find(name, start)
            if i < 0:
                break
            end = text.find(b"\n", i)
            line = text[i : end if end >= 0 else len(text)]
            start = i + len(name)
            after = line[len(name) : len(name) + 1]
            if after not in (b"{", b" "):
                continue  # a longer name with this prefix, e.g. ..._by_reason
            if i > 0 and text[i - 1 : i] != b"\n":
                continue  # inside a # HELP or # TYPE line
            try:
                values[slot] += float(line.rsplit(b" ", 1)[1])
                seen[slot] = True
            except (ValueError, IndexError):
                continue
    return (values[0], values[1], values[2]) if all(seen) else None


class Signals:
    def __init__(
        self,
        engines: list[ClusterEngine],
        ledger: Ledger,
        now: Callable[[], float],
        poll_interval_s: float = 0.05,
        health_interval_s: float = 1.0,
        headers: dict[str, str] | None = None,
        poll_metrics: bool = True,
        probe: ProbeFactory | None = None,
        probe_max_bytes: int = MAX_PROBE_BYTES,
    ) -> None:
        probe = probe or functools.partial(Scraper, max_bytes=probe_max_bytes)
        self.engines = engines
        self.poll_metrics = poll_metrics  # scrape /metrics (only what reads the samples needs it)
        self.ledger = ledger
        self._now = now
        self.poll_interval_s = poll_interval_s
        self.health_interval_s = health_interval_s
        self._headers = headers or {}
        self.healthy = {e.id: True for e in engines}
        self.last_sample_s: dict[str, float | None] = {e.id: None for e in engines}
        self.metrics_failures = {e.id: 0 for e in engines}
        self._probe_failures = {e.id: 0 for e in engines}
        self._health_task: asyncio.Task[None] | None = None
        self._polls: list[asyncio.Task[None]] = []
        # one kept-alive connection per engine for /metrics and one for /health: a bounded, steady number
        # of sockets however long the proxy runs
        self._metrics = {
            e.id: probe(f"{e.url}/metrics", self._headers, max(1.0, 10 * poll_interval_s)) for e in engines
        }
        self._health = {
            e.id: probe(f"{e.url}/health", self._headers, max(2.0, health_interval_s)) for e in engines
        }

    def start(self) -> None:
        self._health_task = asyncio.get_running_loop().create_task(self._health_loop())
        self.set_polling(self.poll_metrics)

    def set_polling(self, on: bool) -> None:
        """Scrape every engine's /metrics from now on, or stop. The samples taken so far stay in the
        ledger, with their age."""
        self.poll_metrics = on
        if self._health_task is None:  # not started: start() applies it
            return
        if on and not self._polls:
            loop = asyncio.get_running_loop()
            self._polls = [loop.create_task(self._poll(e)) for e in self.engines]
        elif not on:
            for t in self._polls:
                t.cancel()
            self._polls = []

    async def stop(self) -> None:
        tasks = [*self._polls, *([self._health_task] if self._health_task is not None else [])]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._polls, self._health_task = [], None
        for scraper in (*self._metrics.values(), *self._health.values()):
            scraper.close()

    def mark_failed(self, engine_id: str, reason: str) -> None:
        if self.healthy.get(engine_id):
            logger.warning("engine %s out of routing: %s", engine_id, reason)
        self.healthy[engine_id] = False
        self.ledger.set_healthy(engine_id, False)

    def _mark_ok(self, engine_id: str) -> None:
        if not self.healthy.get(engine_id):
            logger.info("engine %s back in routing", engine_id)
        self.healthy[engine_id] = True
        self.ledger.set_healthy(engine_id, True)

    async def _poll(self, engine: ClusterEngine) -> None:
        scraper = self._metrics[engine.id]
        while True:
            started = time.monotonic()
            try:
                status, body = await scraper.get()
                parsed = parse_vllm_metrics(body) if status == 200 else None
                if parsed is not None:
                    usage, running, waiting = parsed
                    now = self._now()
                    self.ledger.record_sample(
                        engine.id, round(usage * engine.kv_capacity_tokens), int(running), int(waiting), now
                    )
                    self.last_sample_s[engine.id] = now
                    self.metrics_failures[engine.id] = 0
                else:
                    self.metrics_failures[engine.id] += 1
            except ScrapeError:
                self.metrics_failures[engine.id] += 1
            await asyncio.sleep(max(0.0, self.poll_interval_s - (time.monotonic() - started)))

    async def _health_loop(self) -> None:
        while True:
            results = await asyncio.gather(*(self._probe(e) for e in self.engines))
            for e, ok in zip(self.engines, results, strict=True):
                if ok:
                    self._probe_failures[e.id] = 0
                    self._mark_ok(e.id)
                else:
                    self._probe_failures[e.id] += 1
                    if self._probe_failures[e.id] >= PROBE_FAILURES_TO_MARK:
                        self.mark_failed(e.id, f"{PROBE_FAILURES_TO_MARK} health probes failed")
            await asyncio.sleep(self.health_interval_s)

    async def _probe(self, engine: ClusterEngine) -> bool:
        try:
            status, _ = await self._health[engine.id].get()
        except ScrapeError:
            return False
        return status == 200
