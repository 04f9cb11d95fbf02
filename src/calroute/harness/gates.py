"""Correctness gates: what must hold of a cluster's engines before any measurement means anything.

The paper's protocol (§IV-B) runs three gates before measuring and one reset before every run:

* **token-count contract**: a request with ``max_tokens=N`` and ``ignore_eos`` yields exactly N tokens, on
  every engine, as JSON and as a stream. Every workload fixes each request's output length; an engine that
  stops early or runs long changes the load it was given and its TPOT, so policies would be compared on
  different work.
* **greedy equivalence**: the same prompt at temperature 0 gives the same token ids on every engine
  (bitwise; the paper checks it across decode GPUs, we check prefill engines too). A request's output then
  does not depend on where it was routed, and neither does its length when EOS is honoured.
* **warm-up of every prefill x decode pair**: one full NixlConnector handoff per pair (prefill with
  ``max_tokens=1`` and ``kv_transfer_params.do_remote_decode``, decode with the returned params), checked
  against a direct greedy completion on the same decode engine. The first transfer over a cold pair can be
  anomalous (connection set-up, memory registration), and must not land in a measured run; a pair whose
  handoff yields different tokens is broken.
* **prefix-cache reset** (``POST /reset_prefix_cache`` on every engine, before each run): added in the paper
  after identical configurations measured 20+ points apart because of session ordering.

Gates talk to the engines directly (not through a proxy), and never raise on engine misbehaviour: a
connection error, a timeout, a non-200 answer or an unreadable body fails the gate with a detail naming
the engine. Each gate runs its own event loop (``asyncio.run``), so call them outside one.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from calroute.cluster.file import ClusterEngine, ClusterFile
from calroute.contract import handoff
from calroute.errors import CalrouteError
from calroute.harness.prompts import prompt_ids

DEFAULT_TIMEOUT_S = 120.0  # per request: a real vLLM engine's first requests on CPU take seconds
CONTRACT_MAX_TOKENS = (1, 7, 33)
GREEDY_PROMPT_TOKENS = (17, 300)  # one under a KV block, one spanning many
GREEDY_OUTPUT_TOKENS = 24
PAIR_PROMPT_TOKENS = 100  # several KV blocks, so the handoff really moves KV
PAIR_OUTPUT_TOKENS = 16
_EXCERPT = 160

# Errors an engine can cause; anything else is a bug in calroute and propagates.
_ENGINE_ERRORS = (aiohttp.ClientError, TimeoutError, OSError, ValueError, KeyError, TypeError, IndexError)


@dataclass(frozen=True)
class GateResult:
    name: str
    passed: bool
    detail: str


class GateFailed(CalrouteError):
    """One or more gates failed; ``results`` has every gate that ran."""

    def __init__(self, results: list[GateResult]) -> None:
        self.results = results
        failed = "; ".join(f"{r.name}: {r.detail}" for r in results if not r.passed)
        super().__init__(f"correctness gates failed: {failed}")


class _EngineError(CalrouteError):
    """An engine answered, but not as the gate requires."""


class _Client:
    def __init__(self, session: aiohttp.ClientSession, model: str, timeout_s: float) -> None:
        self.session = session
        self.model = model
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)

    def body(self, prompt: list[int], max_tokens: int, **kw: Any) -> dict[str, Any]:
        return {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 0,
            "return_token_ids": True,
            **kw,
        }

    async def post(
        self, engine: ClusterEngine, path: str, body: dict[str, Any] | None, parse: bool = True
    ) -> Any:
        """POST; the parsed JSON answer (None when not ``parse``), or _EngineError on a non-200 answer."""
        async with self.session.post(f"{engine.url}{path}", json=body, timeout=self.timeout) as r:
            payload = await r.read()
            if r.status != 200:
                excerpt = payload[:_EXCERPT].decode(errors="replace")
                raise _EngineError(f"{engine.id}: HTTP {r.status} on {path}: {excerpt}")
            return json.loads(payload) if parse else None

    async def complete(self, engine: ClusterEngine, body: dict[str, Any]) -> tuple[list[int], int]:
        """A JSON completion: (token ids, usage.completion_tokens)."""
        out = await self.post(engine, "/v1/completions", body)
        ids = out["choices"][0].get("token_ids")
        if not isinstance(ids, list):
            raise _EngineError(f"{engine.id}: no token_ids in the answer (return_token_ids unsupported?)")
        return [int(t) for t in ids], int(out["usage"]["completion_tokens"])

    async def stream(self, engine: ClusterEngine, body: dict[str, Any]) -> tuple[list[int], int | None]:
        """A streamed completion: (token ids over all chunks, usage.completion_tokens or None)."""
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        ids: list[int] = []
        usage: int | None = None
        async with self.session.post(f"{engine.url}/v1/completions", json=body, timeout=self.timeout) as r:
            if r.status != 200:
                excerpt = (await r.read())[:_EXCERPT].decode(errors="replace")
                raise _EngineError(f"{engine.id}: HTTP {r.status} on a stream: {excerpt}")
            async for line in r.content:
                if not line.startswith(b"data: {"):
                    continue
                event = _json(line[6:])
                if "error" in event:
                    raise _EngineError(f"{engine.id}: error event in the stream: {str(event)[:_EXCERPT]}")
                if event.get("usage") and not event.get("choices"):
                    usage = int(event["usage"]["completion_tokens"])
                for choice in event.get("choices") or ():
                    ids.extend(int(t) for t in choice.get("token_ids") or ())
        return ids, usage


def _json(raw: bytes) -> dict[str, Any]:
    out = json.loads(raw)
    if not isinstance(out, dict):
        raise ValueError(f"expected a JSON object, got {raw[:_EXCERPT]!r}")
    return out


async def _attempt(check: Awaitable[str | None], engine_id: str) -> str | None:
    """Await one check: its problem (a string) or None. Engine misbehaviour is a problem, never raised."""
    try:
        return await check
    except _EngineError as e:
        return str(e)
    except _ENGINE_ERRORS as e:
        return f"{engine_id}: {type(e).__name__}: {e}"[: 2 * _EXCERPT]


def _run(
    name: str,
    cluster: ClusterFile,
    timeout_s: float,
    check: Callable[[_Client], Awaitable[tuple[list[str], str]]],
) -> GateResult:
    """Run an async gate body: (problems, what was checked) -> GateResult."""

    async def main() -> tuple[list[str], str]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            return await check(_Client(session, cluster.model, timeout_s))

    problems, checked = asyncio.run(main())
    if problems:
        return GateResult(name, False, f"{len(problems)} problem(s): " + "; ".join(problems))
    return GateResult(name, True, checked)


def check_token_counts(
    cluster: ClusterFile,
    max_tokens: tuple[int, ...] = CONTRACT_MAX_TOKENS,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> GateResult:
    """Every engine gives exactly ``max_tokens`` tokens with ``ignore_eos``, as JSON and as a stream."""

    async def check(c: _Client) -> tuple[list[str], str]:
        async def one(e: ClusterEngine, n: int) -> str | None:
            prompt = prompt_ids(f"gate:tokens:{e.id}:{n}", 32)
            ids, usage = await c.complete(e, c.body(prompt, n))
            if usage != n or len(ids) != n:
                return f"{e.id}: max_tokens {n} gave {len(ids)} token ids, usage {usage} (JSON)"
            ids, streamed = await c.stream(e, c.body(prompt, n))
            if streamed != n:
                return f"{e.id}: max_tokens {n} gave usage {streamed} in the stream"
            if ids and len(ids) != n:  # token ids per chunk are optional in a stream; when sent, they count
                return f"{e.id}: max_tokens {n} streamed {len(ids)} token ids"
            return None

        jobs = [_attempt(one(e, n), f"{e.id} (max_tokens {n})") for e in cluster.engines for n in max_tokens]
        problems = [p for p in await asyncio.gather(*jobs) if p]
        sizes = ", ".join(map(str, max_tokens))
        return problems, f"{len(cluster.engines)} engines x max_tokens {sizes}, JSON and SSE: exact"

    return _run("token-count", cluster, timeout_s, check)


def check_greedy_equivalence(
    cluster: ClusterFile,
    output_tokens: int = GREEDY_OUTPUT_TOKENS,
    prompt_tokens: tuple[int, ...] = GREEDY_PROMPT_TOKENS,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> GateResult:
    """The same prompts at temperature 0 give identical token ids on every engine (decode and prefill)."""
    engines = cluster.decode + cluster.prefill  # the reference is the first decode engine

    async def check(c: _Client) -> tuple[list[str], str]:
        problems: list[str] = []
        for length in prompt_tokens:
            body = c.body(prompt_ids(f"gate:greedy:{length}", length), output_tokens)
            outs: dict[str, list[int]] = {}

            async def one(e: ClusterEngine, body: dict[str, Any], outs: dict[str, list[int]]) -> None:
                outs[e.id] = (await c.complete(e, body))[0]

            errors = await asyncio.gather(
                *(
                    _attempt(_no_problem(one(e, body, outs)), f"{e.id} ({length}-token prompt)")
                    for e in engines
                )
            )
            problems += [p for p in errors if p]
            ref_id = next((e.id for e in engines if e.id in outs), None)
            if ref_id is None:
                continue
            ref = outs[ref_id]
            for e in engines:
                got = outs.get(e.id)
                if got is not None and got != ref:
                    at = next(
                        (i for i, (a, b) in enumerate(zip(got, ref, strict=False)) if a != b),
                        min(len(got), len(ref)),
                    )
                    problems.append(
                        f"{e.id} differs from {ref_id} on a {length}-token prompt from output token {at}"
                    )
        sizes = " and ".join(map(str, prompt_tokens))
        return (
            problems,
            f"{len(engines)} engines, {sizes}-token prompts, {output_tokens} tokens: identical ids",
        )

    return _run("greedy-equivalence", cluster, timeout_s, check)


async def _no_problem(check: Awaitable[None]) -> str | None:
    await check
    return None


def warm_up_pairs(
    cluster: ClusterFile,
    output_tokens: int = PAIR_OUTPUT_TOKENS,
    prompt_tokens: int = PAIR_PROMPT_TOKENS,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> GateResult:
    """One full prefill -> decode handoff per pair, whose output must equal a direct greedy completion.

    Pairs run one at a time: a pair's first transfer is the thing being absorbed, and overlapping them
    would only blur the handoff times reported. The handoff comes before the direct completion, so the
    decode engine cannot serve the handed-off prompt from its own prefix cache.
    """
    handoff_s: list[float] = []

    async def pair(c: _Client, p: ClusterEngine, d: ClusterEngine) -> str | None:
        base = c.body(prompt_ids(f"gate:pair:{p.id}:{d.id}", prompt_tokens), output_tokens)
        started = time.perf_counter()
        out = await c.post(p, "/v1/completions", handoff.prefill_body(base))
        kv = out.get("kv_transfer_params") if isinstance(out, dict) else None
        if not isinstance(kv, dict) or not kv:
            return f"{p.id} -> {d.id}: the prefill answer has no kv_transfer_params"
        handed, usage = await c.complete(d, handoff.decode_body(base, kv))
        handoff_s.append(time.perf_counter() - started)
        if usage != output_tokens or len(handed) != output_tokens:
            return f"{p.id} -> {d.id}: {len(handed)} tokens after the handoff, asked {output_tokens}"
        direct, _ = await c.complete(d, base)
        if handed != direct:
            return f"{p.id} -> {d.id}: the handoff's output differs from {d.id}'s direct completion"
        return None

    async def check(c: _Client) -> tuple[list[str], str]:
        problems: list[str] = []
        for p in cluster.prefill:
            for d in cluster.decode:
                problem = await _attempt(pair(c, p, d), f"{p.id} -> {d.id}")
                if problem:
                    problems.append(problem)
        pairs = len(cluster.prefill) * len(cluster.decode)
        span = ""
        if handoff_s:
            span = f"; prefill + decode {min(handoff_s) * 1e3:.0f}-{max(handoff_s) * 1e3:.0f} ms"
        return problems, f"{pairs} prefill x decode pairs warmed, outputs equal direct greedy ones{span}"

    return _run("pair-warm-up", cluster, timeout_s, check)


def reset_prefix_caches(cluster: ClusterFile, timeout_s: float = DEFAULT_TIMEOUT_S) -> GateResult:
    """``POST /reset_prefix_cache`` on every engine; every one must answer 200 (run isolation)."""

    async def check(c: _Client) -> tuple[list[str], str]:
        async def one(e: ClusterEngine) -> str | None:
            await c.post(e, "/reset_prefix_cache", None, parse=False)  # the status is the answer
            return None

        results = await asyncio.gather(*(_attempt(one(e), e.id) for e in cluster.engines))
        return [p for p in results if p], f"{len(cluster.engines)} engines' prefix caches reset"

    return _run("prefix-cache-reset", cluster, timeout_s, check)


def run_gates(cluster: ClusterFile, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[GateResult]:
    """The three gates before measurement: token-count contract, greedy equivalence, pair warm-up."""
    return [
        check_token_counts(cluster, timeout_s=timeout_s),
        check_greedy_equivalence(cluster, timeout_s=timeout_s),
        warm_up_pairs(cluster, timeout_s=timeout_s),
    ]


def require_gates(cluster: ClusterFile, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[GateResult]:
    """``run_gates``, raising GateFailed (with every result) unless all passed."""
    results = run_gates(cluster, timeout_s)
    if not all(r.passed for r in results):
        raise GateFailed(results)
    return results
