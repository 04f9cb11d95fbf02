"""The measurement requests: one client for a cluster's engines (prefill with handoff, exact-length
streams timed per event, metrics text), and the failures a sweep drops a sample for."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

from calroute.contract.handoff import PREFILL_KV_PARAMS
from calroute.contract.metrics import CACHE_CONFIG_INFO
from calroute.errors import CalrouteError

# Prompt token ids: the emulator accepts [3, 4096) (0-2 are special); real models' vocabularies are larger,
# but the tiny test model's is ~2k, so other clusters get a range every tokenizer accepts.
EMULATED_TOKEN_IDS = (3, 4096)
DEFAULT_TOKEN_IDS = (10, 1000)


class RequestFailed(CalrouteError):
    """One measurement request failed; the sweep drops that sample and carries on."""


class NoSteadyWindow(RequestFailed):
    """A batch's requests never all ran at once: the engine caps concurrent sequences below the batch."""


@dataclass
class StreamTrace:
    """A streaming response as the client saw it: when each SSE event arrived and how many tokens it held."""

    sent_s: float
    events: list[tuple[float, int]] = field(default_factory=list)

    @property
    def first_token_s(self) -> float:
        return self.events[0][0] - self.sent_s


_LABEL = re.compile(r'(\w+)="([^"]*)"')


def kv_bytes_from_metrics(text: str) -> int | None:
    """KV bytes per token from vLLM's ``vllm:cache_config_info`` labels (memory / (blocks x block size)).

    None when the labels are missing or the engine sized its KV by memory fraction (no byte count).
    Blocks are whole, so this can overstate the true figure by under one block's share.
    """
    for line in text.splitlines():
        if line.startswith(CACHE_CONFIG_INFO + "{"):
            labels = dict(_LABEL.findall(line))
            try:
                n_bytes = int(labels["kv_cache_memory_bytes"])
                tokens = int(labels["num_gpu_blocks"]) * int(labels["block_size"])
            except (KeyError, ValueError):
                return None
            return round(n_bytes / tokens) if tokens > 0 and n_bytes > 0 else None
    return None


class EngineClient:
    """Measurement requests to one cluster's engines (the model name, token ids, headers, timeouts)."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        model: str,
        token_ids: tuple[int, int],
        seed: int,
        api_key: str | None = None,
    ) -> None:
        self._session = session
        self._model = model
        self._lo, self._hi = token_ids
        self._rng = np.random.default_rng(seed)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def prompt(self, tokens: int) -> list[int]:
        return [int(i) for i in self._rng.integers(self._lo, self._hi, size=tokens)]

    async def get_text(self, url: str, timeout_s: float) -> str:
        try:
            async with self._session.get(
                url, headers=self._headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as r:
                if r.status != 200:
                    raise RequestFailed(f"GET {url}: HTTP {r.status}")
                return await r.text()
        except (aiohttp.ClientError, TimeoutError) as e:
            raise RequestFailed(f"GET {url}: {type(e).__name__}: {e}") from e

    def _completion(
        self, url: str, body: dict[str, Any], timeout_s: float
    ) -> AbstractAsyncContextManager[aiohttp.ClientResponse]:
        """A completion request to one engine, with the cluster's API key and a bound on the exchange."""
        return self._session.post(
            f"{url}/v1/completions",
            json=body,
            headers=self._headers,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        )

    async def prefill(self, url: str, prompt: list[int], timeout_s: float) -> tuple[float, dict[str, Any]]:
        """(client-observed latency, kv_transfer_params) of a P/D prefill request."""
        body = {
            "model": self._model,
            "prompt": prompt,
            "max_tokens": 1,
            "temperature": 0,
            "kv_transfer_params": dict(PREFILL_KV_PARAMS),
        }
        sent = time.perf_counter()
        try:
            async with self._completion(url, body, timeout_s) as r:
                payload = await r.read()
                done = time.perf_counter()
                status = r.status
        except (aiohttp.ClientError, TimeoutError) as e:
            raise RequestFailed(f"prefill on {url}: {type(e).__name__}: {e}") from e
        if status != 200:
            raise RequestFailed(f"prefill on {url}: HTTP {status}: {payload[:300]!r}")
        try:
            kv = json.loads(payload).get("kv_transfer_params")
        except (ValueError, AttributeError) as e:
            raise RequestFailed(f"prefill on {url}: not a completion object: {payload[:300]!r}") from e
        if not isinstance(kv, dict):
            raise RequestFailed(f"prefill on {url} returned no kv_transfer_params (is a KV connector set?)")
        return done - sent, kv

    async def stream(
        self,
        url: str,
        prompt: list[int],
        max_tokens: int,
        timeout_s: float,
        kv_transfer_params: dict[str, Any] | None = None,
        on_event: Callable[[str], None] | None = None,
    ) -> StreamTrace:
        """A streaming completion with exactly ``max_tokens`` tokens; events are parsed after the stream
        ends, so the client does as little as possible between receiving one chunk and the next.

        ``on_event`` hears "headers" (the engine has parsed and queued the request), "first" (the first
        chunk arrived) and "done" (the stream ended, also on failure).
        """
        hook = on_event or _no_event
        body: dict[str, Any] = {
            "model": self._model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "return_token_ids": True,
        }
        if kv_transfer_params is not None:
            body["kv_transfer_params"] = kv_transfer_params
        chunks: list[tuple[float, bytes]] = []
        sent = time.perf_counter()
        try:
            async with self._completion(url, body, timeout_s) as r:
                hook("headers")
                if r.status != 200:
                    raise RequestFailed(f"stream on {url}: HTTP {r.status}: {(await r.read())[:300]!r}")
                async for data in r.content.iter_any():
                    chunks.append((time.perf_counter(), data))
                    if len(chunks) == 1:
                        hook("first")
        except (aiohttp.ClientError, TimeoutError) as e:
            raise RequestFailed(f"stream on {url}: {type(e).__name__}: {e}") from e
        finally:
            hook("done")
        trace = StreamTrace(sent)
        buffer = b""
        for t, data in chunks:
            buffer += data
            *complete, buffer = buffer.split(b"\n\n")
            for event in complete:
                n = _event_tokens(event, url)
                if n:
                    trace.events.append((t, n))
        total = sum(n for _, n in trace.events)
        if total != max_tokens:
            raise RequestFailed(f"stream on {url}: expected {max_tokens} tokens, got {total}")
        return trace


def _no_event(event: str) -> None:
    pass


def _event_tokens(event: bytes, url: str) -> int:
    """Tokens carried by one SSE event (0 for [DONE] and usage-only events)."""
    for line in event.split(b"\n"):
        if not line.startswith(b"data: "):
            continue
        data = line[6:].strip()
        if data == b"[DONE]":
            return 0
        try:
            obj = json.loads(data)
        except ValueError as e:
            raise RequestFailed(f"stream on {url}: an event is not JSON: {data[:300]!r}") from e
        if not isinstance(obj, dict):
            raise RequestFailed(f"stream on {url}: an event is not a JSON object: {data[:300]!r}")
        if "error" in obj:
            raise RequestFailed(f"stream on {url}: {obj['error']}")
        choices = obj.get("choices") or []
        if not choices:
            return 0
        ids = choices[0].get("token_ids")
        if ids is None:
            raise RequestFailed(f"stream on {url}: the engine ignores return_token_ids")
        return len(ids)
    return 0
