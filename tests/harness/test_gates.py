"""The correctness gates: each passes on a healthy emulated cluster and fails on a deliberately broken engine.

Broken engines are a small fake (an aiohttp app in a thread) placed next to real emulated engines in an
"external" cluster file. The fake computes the emulator's greedy tokens, so apart from its one defect it is
indistinguishable from an emulated engine to the gates.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import pytest
from aiohttp import web

from calroute.cluster import launch
from calroute.cluster.file import ClusterEngine, ClusterFile
from calroute.cluster.procs import free_port
from calroute.emulator import tokens
from calroute.errors import CalrouteError
from calroute.harness import gates
from calroute.types import Role

KV_TOKENS = 60_000


class FakeEngines:
    """Engines with one defect each, served under a path prefix: ``{url}/{defect}/v1/completions``.

    defects: ``ok`` (none), ``short`` (one token fewer than asked), ``divergent`` (different greedy
    tokens), ``ignores-kv`` (a decode given transfer params answers as for another prompt), ``no-kv`` (a
    prefill that returns no transfer params), ``no-reset`` (/reset_prefix_cache answers 404), ``garbage``
    (200 with a body that is not JSON).
    """

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._runner: web.AppRunner | None = None
        self.url = ""
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fake engines did not start")

    def engine(self, defect: str, role: Role = Role.DECODE) -> ClusterEngine:
        return ClusterEngine(f"fake-{defect}", role, f"{self.url}/{defect}", KV_TOKENS)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/{defect}/v1/completions", self._completions)
        app.router.add_post("/{defect}/reset_prefix_cache", self._reset)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def _reset(self, request: web.Request) -> web.Response:
        if request.match_info["defect"] == "no-reset":
            return web.json_response({"detail": "Not Found"}, status=404)
        return web.json_response({"success": True})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        defect = request.match_info["defect"]
        if defect == "garbage":
            return web.Response(text="<html>surprise</html>", content_type="text/html")
        body = await request.json()
        prompt: list[int] = body["prompt"]
        n = int(body["max_tokens"])
        kv = body.get("kv_transfer_params") or {}
        if defect == "ignores-kv" and kv.get("do_remote_prefill"):
            prompt = prompt[::-1]  # as if it computed some other prompt instead of pulling the KV
        seed = tokens.prompt_seed(prompt)
        out = [tokens.next_token(seed, i) for i in range(n)]
        if defect == "short":
            out = out[:-1]
        if defect == "divergent":
            out = [3 + (t + 1) % (tokens.VOCAB_SIZE - 3) for t in out]
        params = None
        if kv.get("do_remote_decode") and defect != "no-kv":
            params = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "fake"}
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(out),
            "total_tokens": len(prompt) + len(out),
        }
        if not body.get("stream"):
            choice = {"index": 0, "text": tokens.decode(out), "token_ids": out, "finish_reason": "length"}
            return web.json_response({"choices": [choice], "usage": usage, "kv_transfer_params": params})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for t in out:
            chunk = {"choices": [{"index": 0, "text": tokens.decode([t]), "token_ids": [t]}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
        await resp.write_eof()
        return resp

    def stop(self) -> None:
        async def shutdown() -> None:
            if self._runner is not None:
                await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=15)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterFile]:
    """1 prefill + 2 decode emulated engines (one process)."""
    launched = launch.up_emulated(1, 2, tmp_path_factory.mktemp("engines"))
    try:
        yield launched.file
    finally:
        launched.stop()


@pytest.fixture(scope="module")
def fakes() -> Iterator[FakeEngines]:
    f = FakeEngines()
    try:
        yield f
    finally:
        f.stop()


def with_engines(cluster: ClusterFile, *extra: ClusterEngine) -> ClusterFile:
    return ClusterFile("external", cluster.model, cluster.max_model_len, (*cluster.engines, *extra))


def test_every_gate_passes_on_a_healthy_cluster(emulated: ClusterFile, fakes: FakeEngines) -> None:
    results = gates.require_gates(emulated)
    assert [r.name for r in results] == ["token-count", "greedy-equivalence", "pair-warm-up"]
    assert all(r.passed for r in results), results
    assert "2 prefill x decode pairs" in results[2].detail
    reset = gates.reset_prefix_caches(emulated)
    assert reset.passed and reset.detail == "3 engines' prefix caches reset"
    # The fake without a defect is a faithful engine: a cluster including it passes too.
    mixed = with_engines(emulated, fakes.engine("ok"))
    assert all(r.passed for r in gates.run_gates(mixed)), gates.run_gates(mixed)


def test_token_count_gate_fails_on_an_engine_that_stops_short(
    emulated: ClusterFile, fakes: FakeEngines
) -> None:
    cluster = with_engines(emulated, fakes.engine("short"))
    result = gates.check_token_counts(cluster)
    assert not result.passed
    assert "fake-short: max_tokens 7 gave 6 token ids" in result.detail
    assert "prefill-0" not in result.detail and "decode-0" not in result.detail
    with pytest.raises(gates.GateFailed, match="token-count") as info:
        gates.require_gates(cluster)
    # Stopping short also breaks the other gates' expectations (shorter outputs differ): all three say so.
    assert [r.name for r in info.value.results if not r.passed] == [
        "token-count",
        "greedy-equivalence",
        "pair-warm-up",
    ]


def test_greedy_gate_fails_on_an_engine_with_other_greedy_tokens(
    emulated: ClusterFile, fakes: FakeEngines
) -> None:
    result = gates.check_greedy_equivalence(with_engines(emulated, fakes.engine("divergent")))
    assert not result.passed
    assert "fake-divergent differs from decode-0 on a 17-token prompt from output token 0" in result.detail
    assert "decode-1" not in result.detail and "prefill-0" not in result.detail


def test_warm_up_fails_on_a_decode_that_ignores_the_transferred_kv(
    emulated: ClusterFile, fakes: FakeEngines
) -> None:
    result = gates.warm_up_pairs(with_engines(emulated, fakes.engine("ignores-kv")))
    assert not result.passed
    assert result.detail == (
        "1 problem(s): prefill-0 -> fake-ignores-kv: the handoff's output differs from "
        "fake-ignores-kv's direct completion"
    )


def test_warm_up_fails_on_a_prefill_that_hands_over_nothing(
    emulated: ClusterFile, fakes: FakeEngines
) -> None:
    result = gates.warm_up_pairs(with_engines(emulated, fakes.engine("no-kv", Role.PREFILL)))
    assert not result.passed
    assert "fake-no-kv -> decode-0: the prefill answer has no kv_transfer_params" in result.detail
    assert "fake-no-kv -> decode-1" in result.detail and "prefill-0 ->" not in result.detail


def test_reset_fails_when_an_engine_refuses(emulated: ClusterFile, fakes: FakeEngines) -> None:
    result = gates.reset_prefix_caches(with_engines(emulated, fakes.engine("no-reset")))
    assert not result.passed
    assert "fake-no-reset: HTTP 404 on /reset_prefix_cache" in result.detail
    assert result.detail.startswith("1 problem(s)")


def test_gates_never_raise_on_unreachable_or_garbled_engines(fakes: FakeEngines) -> None:
    dead = ClusterEngine("dead", Role.DECODE, f"http://127.0.0.1:{free_port()}", KV_TOKENS)
    cluster = ClusterFile(
        "external", "m", 4096, (fakes.engine("ok", Role.PREFILL), fakes.engine("garbage"), dead)
    )
    results = [*gates.run_gates(cluster, timeout_s=5), gates.reset_prefix_caches(cluster, timeout_s=5)]
    for r in results[:3]:
        assert not r.passed and "ClientConnectorError" in r.detail and "dead" in r.detail, r
        assert "fake-garbage" in r.detail and "JSONDecodeError" in r.detail
    assert not results[3].passed and "dead" in results[3].detail and "fake-garbage" not in results[3].detail
    with pytest.raises(gates.GateFailed) as info:
        gates.require_gates(cluster, timeout_s=5)
    assert len(info.value.results) == 3


def test_gate_failed_is_a_calroute_error() -> None:
    failed = gates.GateFailed([gates.GateResult("a", True, "fine"), gates.GateResult("b", False, "broken")])
    assert isinstance(failed, CalrouteError)
    assert str(failed) == "correctness gates failed: b: broken"
