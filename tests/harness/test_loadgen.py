"""The open-loop load generator: schedule accuracy, the request it sends, every outcome's record, validity,
and a real run through the proxy to emulated engines."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import typer
from aiohttp import web
from typer.testing import CliRunner

from calroute.cli.bench import EXIT_INVALID, bench, workload_requests
from calroute.cluster import launch
from calroute.cluster.file import ClusterFile
from calroute.costmodel.profiles import get_profile
from calroute.harness.loadgen import TOKEN_CONTRACT, LoadResult, drive
from calroute.proxy.config import ProxyConfig
from calroute.results.metrics import summarize
from calroute.results.records import read_records, record_from_json, record_to_json
from calroute.types import RequestSpec, RequestStatus, SloClass
from calroute.workload.families import generate_family
from calroute.workload.source import FamilyWorkload, TraceWorkload
from tests.proxy.harness import RunningProxy

CAL = get_profile("a40-qwen2.5-3b").calibration
MODEL = "fake"


def _sse(obj: dict[str, Any] | str) -> bytes:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, separators=(',', ':'))}\n\n".encode()


class FakeSse:
    """An OpenAI completions server answering at once with a valid SSE stream, except on request.

    Misbehaviour is chosen by ``max_tokens`` (see ``MISBEHAVIOUR``); every request's body, SLO header and
    wall-clock arrival are kept for the test to inspect.
    """

    MISBEHAVIOUR = {3: "short", 5: "no-usage", 7: "http-500", 9: "error-event", 11: "stall"}

    def __init__(self, misbehave: bool = False, ids: dict[int, str] | None = None) -> None:
        self.misbehave = misbehave
        self.ids = ids or {}  # max_tokens -> the X-Request-Id its answer names
        self.bodies: list[dict[str, Any]] = []
        self.slo: list[str | None] = []
        self.received_unix_s: list[float] = []

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self.received_unix_s.append(time.time())
        self.slo.append(request.headers.get("x-calroute-slo"))
        body = await request.json()
        self.bodies.append(body)
        n = int(body["max_tokens"])
        mode = self.MISBEHAVIOUR.get(n) if self.misbehave else None
        if mode == "http-500":
            return web.json_response({"error": {"message": "engine on fire", "code": 500}}, status=500)
        if mode == "stall":
            await asyncio.sleep(30)
        named = {"X-Request-Id": self.ids[n]} if n in self.ids else {}
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", **named})
        await resp.prepare(request)
        produced = n - 1 if mode == "short" else n
        chunk = {"id": "cmpl-1", "object": "text_completion", "model": MODEL}
        for i in range(produced):
            await resp.write(
                _sse({**chunk, "choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}]})
            )
            if mode == "error-event" and i == 1:
                await resp.write(_sse({"error": {"message": "decode engine broke off", "code": 502}}))
                break
        if mode != "no-usage":
            usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": produced}
            await resp.write(_sse({**chunk, "choices": [], "usage": usage}))
        await resp.write(_sse("[DONE]"))
        await resp.write_eof()
        return resp


@asynccontextmanager
async def serving(fake: FakeSse) -> AsyncIterator[str]:
    """Serve ``fake`` on the running event loop (the generator's loop: answers cost it little)."""
    app = web.Application()
    app.router.add_post("/v1/completions", fake.completions)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def specs(arrivals_s: list[float], output_tokens: list[int], prompt_tokens: int = 64) -> list[RequestSpec]:
    return [
        RequestSpec(f"r{i}", a, prompt_tokens + i % 7, o, SloClass.TIGHT if i % 2 else SloClass.LOOSE)
        for i, (a, o) in enumerate(zip(arrivals_s, output_tokens, strict=True))
    ]


def _schedule_missed(result: LoadResult, fake: FakeSse, arrivals: list[float]) -> str | None:
    """Why a run did not keep its schedule, seen from both sides; None when it did."""
    # p50 is the event loop's timer granularity (epoll rounds timeouts up to whole ms): about 1 ms. The p99
    # is 3-4 ms on a quiet machine; the bound is the validity bound.
    client = (
        f"lateness p50 {result.lateness_p50_s * 1e3:.2f} ms, p99 {result.lateness_p99_s * 1e3:.2f} ms, "
        f"max {result.lateness_max_s * 1e3:.2f} ms"
    )
    if not (result.valid and result.lateness_p50_s < 0.002 and result.lateness_p99_s < 0.010):
        return client
    # Seen from the server: arrivals keep the schedule too (connection and write included).
    arrived = np.sort(np.array(fake.received_unix_s)) - result.started_unix_s
    server_lag = arrived - np.sort(np.array(arrivals))
    lag_p50_s, lag_p99_s = (float(x) for x in np.percentile(server_lag, [50, 99]))
    server = f"server-side lag p50 {lag_p50_s * 1e3:.2f} ms, p99 {lag_p99_s * 1e3:.2f} ms"
    if not (lag_p50_s < 0.004 and lag_p99_s < 0.020):
        return server
    if float(server_lag.min()) <= -0.002:  # never early (the clocks of the two sides agree to ~1 ms)
        return f"a request arrived {-float(server_lag.min()) * 1e3:.2f} ms early"
    return None


def test_schedule_is_kept_and_every_request_is_exactly_what_the_spec_says() -> None:
    rng = np.random.default_rng(7)
    arrivals = np.cumsum(rng.exponential(1 / 100, 300)).tolist()  # Poisson, 100 req/s, 3 s
    reqs = specs(arrivals, [int(x) for x in rng.integers(1, 9, 300)])

    async def go(fake: FakeSse) -> LoadResult:
        async with serving(fake) as url:
            return await drive(url, reqs, MODEL, policy="round_robin")

    # On this shared 2-core VM another process taking both cores at a send time delays that send, whatever
    # the generator does: a run so disturbed is run again, up to 3 in all. A generator that cannot keep the
    # schedule misses it in every one.
    missed: list[str] = []
    for _ in range(3):
        fake = FakeSse()
        result = asyncio.run(go(fake))
        why = _schedule_missed(result, fake, arrivals)
        if why is None:
            break
        missed.append(why)
    assert why is None, missed
    assert [r.request_id for r in result.records] == [s.request_id for s in reqs]  # one each, in order
    assert all(r.status is RequestStatus.OK for r in result.records), result.records[:3]
    # The requests are exactly the specs: token-id prompts of the right length, distinct, in [10, 1000).
    assert len({tuple(b["prompt"]) for b in fake.bodies}) == 300
    for b in fake.bodies:
        assert b["model"] == MODEL and b["ignore_eos"] is True and b["temperature"] == 0
        assert b["stream"] is True and b["stream_options"] == {"include_usage": True}
        assert all(10 <= t < 1000 for t in b["prompt"])
    sent = sorted((len(b["prompt"]), b["max_tokens"]) for b in fake.bodies)
    assert sent == sorted((s.prompt_tokens, s.output_tokens) for s in reqs)
    assert sorted(fake.slo, key=str) == sorted((s.slo_class.value for s in reqs), key=str)
    for rec, spec in zip(result.records, reqs, strict=True):
        assert rec.policy == "round_robin" and rec.arrival_s == spec.arrival_s
        assert rec.output_tokens == rec.target_output_tokens == spec.output_tokens
        assert rec.prefill_id is None and rec.decode_id is None and rec.prefill_done_s is None
        assert rec.first_token_s is not None and rec.last_token_s is not None
        assert spec.arrival_s <= rec.first_token_s <= rec.last_token_s


def test_every_failure_ends_in_one_record_with_its_reason() -> None:
    outputs = [2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    reqs = specs([0.01 * i for i in range(len(outputs))], outputs)
    fake = FakeSse(misbehave=True)
    seen: list[str] = []

    async def go() -> LoadResult:
        async with serving(fake) as url:
            return await drive(
                url,
                reqs,
                MODEL,
                slo_header=False,
                timeout_s=0.5,
                on_record=lambda r: seen.append(r.request_id),
            )

    result = asyncio.run(go())
    by_tokens = {r.target_output_tokens: r for r in result.records}
    assert sorted(seen) == sorted(s.request_id for s in reqs)
    for n in (2, 4, 6, 8, 10):
        assert by_tokens[n].status is RequestStatus.OK and by_tokens[n].output_tokens == n
    short, no_usage = by_tokens[3], by_tokens[5]
    assert short.status is RequestStatus.FAILED and short.error is not None
    assert short.error.startswith(TOKEN_CONTRACT) and "got 2 completion tokens" in short.error
    assert short.output_tokens == 2
    assert (
        no_usage.status is RequestStatus.FAILED
        and no_usage.error == f"{TOKEN_CONTRACT}: max_tokens 5, got no usage chunk"
    )
    http = by_tokens[7]
    assert http.status is RequestStatus.FAILED and http.error is not None
    assert http.error.startswith("HTTP 500: ") and "engine on fire" in http.error
    assert http.first_token_s is None
    event = by_tokens[9]
    assert event.status is RequestStatus.FAILED and event.error is not None and "broke off" in event.error
    assert event.first_token_s is not None  # tokens came before the error
    stall = by_tokens[11]
    assert stall.status is RequestStatus.CANCELLED and stall.error == "no complete answer within 0.5 s"
    assert set(fake.slo) == {None}  # slo_header=False sends no SLO header


def test_the_proxys_id_of_each_answer_is_kept_and_a_hostile_one_dropped() -> None:
    # a proxy names its record of a request in X-Request-Id (what the live harness joins by); an engine or
    # a proxy answering garbage there must not reach the result
    ids = {2: "c0ffee01", 3: "a b", 4: "x" * 129, 5: "pfx-0000000000000005"}
    reqs = specs([0.01 * i for i in range(5)], [2, 3, 4, 5, 6])

    async def go() -> LoadResult:
        async with serving(FakeSse(ids=ids)) as url:
            return await drive(url, reqs, MODEL)

    result = asyncio.run(go())
    assert result.proxy_ids == {"r0": "c0ffee01", "r3": "pfx-0000000000000005"}


def test_an_impossible_schedule_is_invalid() -> None:
    reqs = specs([0.0] * 1500, [1] * 1500, prompt_tokens=16)

    async def go() -> LoadResult:
        async with serving(FakeSse()) as url:
            return await drive(url, reqs, MODEL, max_lateness_s=0.002)

    result = asyncio.run(go())
    assert not result.valid
    assert result.lateness_p99_s > 0.002 and result.lateness_max_s >= result.lateness_p99_s
    assert len(result.records) == 1500 and all(r.status is RequestStatus.OK for r in result.records)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterFile]:
    launched = launch.up_emulated(1, 1, tmp_path_factory.mktemp("engines"))
    try:
        yield launched.file
    finally:
        launched.stop()


def test_a_short_mixed_run_through_the_proxy(cluster: ClusterFile, tmp_path: Path) -> None:
    family = generate_family("mixed-bursty", 10.0, 40, seed=3, tight_fraction=0.5)
    # Outputs capped so the run is short; prompts as the family draws them (up to 4k tokens).
    reqs = [r._replace(output_tokens=min(r.output_tokens, 40)) for r in family]
    reqs[0] = reqs[0]._replace(output_tokens=1)  # one-token outputs have no gap: TPOT 0
    # The proxy runs in a thread of this process, so its work sits between the load generator's sends (the
    # GIL switches every 5 ms): the schedule is held to 50 ms here, not the 10 ms default that a load
    # generator in its own process keeps (the bound itself is tested above). A run that other processes on
    # this shared VM pushed past it is run again, with a fresh proxy, up to 3 in all, and with other prompts:
    # the engines keep the first run's prefixes cached, and a cached prompt's TTFT is under its prefill time.
    late: list[dict[str, Any]] = []
    for attempt in range(3):
        cfg = ProxyConfig(cluster=cluster, calibration=CAL, log_path=tmp_path / f"proxy-{attempt}.jsonl")
        with RunningProxy(cfg) as proxy:
            result = asyncio.run(
                drive(
                    proxy.url,
                    reqs,
                    cluster.model,
                    policy="marginal_cost",
                    prompt_seed=3 + attempt,
                    max_lateness_s=0.05,
                )
            )
        if result.valid:
            break
        late.append(result.lateness_dict())
    assert result.valid, late
    recs = result.records
    assert all(r.status is RequestStatus.OK for r in recs), [r.error for r in recs if r.error]
    assert [r.output_tokens for r in recs] == [r.output_tokens for r in reqs]
    for rec in recs:
        ttft, tpot = rec.ttft_s, rec.tpot_s
        assert ttft is not None and tpot is not None
        # At least the modelled prefill of the prompt (the emulator keeps the profile's timing), at most 5 s.
        assert 0.9 * CAL.prefill.single_s(rec.prompt_tokens) <= ttft < 5.0
        if rec.output_tokens >= 2:
            assert 0.8 * CAL.decode.base_s <= tpot < 0.2, rec
    assert recs[0].tpot_s == 0.0
    summary = summarize(recs, CAL.slo)
    assert summary.requests == summary.completed == 40 and summary.status_counts == {"ok": 40}
    assert summary.ttft_p50_s is not None and summary.tpot_p50_s is not None and summary.good > 0
    assert all(record_to_json(record_from_json(record_to_json(r))) == record_to_json(r) for r in recs)
    # The proxy saw the same requests, with the same token counts.
    logged = list(read_records(tmp_path / f"proxy-{attempt}.jsonl"))
    assert sorted(r.output_tokens for r in logged) == sorted(r.output_tokens for r in recs)
    assert sorted(r.slo_class.value for r in logged) == sorted(r.slo_class.value for r in recs)
    assert sorted(r.prompt_tokens for r in logged) == sorted(r.prompt_tokens for r in recs)


def test_bench_command_writes_records_and_a_simulate_shaped_summary(
    cluster: ClusterFile, tmp_path: Path
) -> None:
    app = typer.Typer()
    app.command()(bench)
    cluster_file = tmp_path / "cluster.yaml"
    cluster.save(cluster_file)
    trace = tmp_path / "short.csv"  # short outputs keep the run short
    trace.write_text(
        "num_prefill_tokens,num_decode_tokens\n" + "".join(f"{40 + 7 * i},{4 + i % 9}\n" for i in range(60))
    )
    cfg = ProxyConfig(cluster=cluster, calibration=CAL)
    args = ["--trace", str(trace), "--rate", "10", "--duration", "1.5", "--seed", "4", "--policy-label", "rr"]
    with RunningProxy(cfg) as proxy:
        ok = CliRunner().invoke(
            app, ["--target", proxy.url, *args, "--out", str(tmp_path / "a"), "--cluster", str(cluster_file)]
        )
        invalid = CliRunner().invoke(
            app,
            ["--target", proxy.url, *args, "--out", str(tmp_path / "b"), "--requests", "3"]
            + ["--max-lateness-ms", "0.001", "--model", "emulated", "--profile", "a40-qwen2.5-3b"]
            + ["--slo", "long-context"],
        )
    assert ok.exit_code == 0, ok.output
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    (run,) = summary["runs"]
    records = list(read_records(tmp_path / "a" / "records.jsonl"))
    expected = [r for r in TraceWorkload(trace, None).requests(10.0, seed=4) if r.arrival_s < 1.5]
    assert sorted(r.request_id for r in records) == [r.request_id for r in expected]
    assert run["policy"] == "rr" and run["seed"] == 4 and run["requests"] == len(expected)
    assert run["status_counts"] == {"ok": len(expected)} and 0 <= run["goodput"] <= 1
    for key in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s"):
        assert run[key] > 0
    assert summary["rate_rps"] == 10 and summary["valid"] is True and summary["model"] == "emulated"
    assert summary["slo"]["tight_ttft_s"] == CAL.slo.tight_ttft_s and summary["profile"] == "a40-qwen2.5-3b"
    assert summary["lateness"]["p99_s"] <= summary["lateness"]["bound_p99_s"] == 0.010
    assert [g["name"] for g in summary["gates"]] == [
        "token-count",
        "greedy-equivalence",
        "pair-warm-up",
        "prefix-cache-reset",
    ]
    assert "rr @ 10 req/s" in ok.stdout and "(valid)" in ok.stdout
    # An unkeepable bound: the files are written, the exit code says the run is invalid.
    assert invalid.exit_code == EXIT_INVALID, invalid.output
    invalid_summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert invalid_summary["valid"] is False
    # --slo judges the records: the summary names the spec and gives its per-token allowance
    assert (
        invalid_summary["slo"]["spec"] == "long-context"
        and invalid_summary["slo"]["tight_ttft_s_per_token"] > 0
    )
    assert summary["slo"]["spec"] == "paper" and "tight_ttft_s_per_token" not in summary["slo"]
    assert len(list(read_records(tmp_path / "b" / "records.jsonl"))) == 3


def test_bench_refuses_bad_arguments(tmp_path: Path) -> None:
    app = typer.Typer()
    app.command()(bench)
    base = ["--target", "http://127.0.0.1:9", "--rate", "10", "--duration", "1", "--out", str(tmp_path)]
    both = CliRunner().invoke(app, [*base, "--workload", "chat", "--trace", str(tmp_path)])
    assert both.exit_code == 2 and "exactly one of --workload and --trace" in both.output
    bad_slo = CliRunner().invoke(app, [*base, "--workload", "chat", "--slo", "tighter"])
    assert bad_slo.exit_code == 2 and "--slo" in bad_slo.output and "not a preset" in bad_slo.output
    unreachable = CliRunner().invoke(app, [*base, "--workload", "chat"])
    assert unreachable.exit_code == 2 and "/v1/models" in unreachable.output
    assert not (tmp_path / "records.jsonl").exists()


def test_bench_requests_cover_the_duration_and_respect_the_cap() -> None:
    for family in ("chat", "mixed-bursty"):
        source = FamilyWorkload(family, 1)
        reqs = workload_requests(source, 20.0, 30.0, seed=2, max_requests=None)
        assert reqs == workload_requests(source, 20.0, 30.0, seed=2, max_requests=None)  # deterministic
        assert all(r.arrival_s < 30.0 for r in reqs) and reqs[-1].arrival_s > 29.0  # the whole duration
        assert 400 < len(reqs) < 800
        assert workload_requests(source, 20.0, 30.0, seed=2, max_requests=50) == reqs[:50]


def test_requests_naming_the_same_blocks_send_the_same_leading_tokens() -> None:
    from calroute.harness.loadgen import request_body
    from calroute.types import PREFIX_BLOCK_TOKENS

    shared = (101, 102)
    a = RequestSpec("a", 0.0, 2 * PREFIX_BLOCK_TOKENS + 40, 8, SloClass.LOOSE, shared)
    b = RequestSpec("b", 0.1, 3 * PREFIX_BLOCK_TOKENS, 8, SloClass.LOOSE, (*shared, 103))
    c = RequestSpec("c", 0.2, 2 * PREFIX_BLOCK_TOKENS + 40, 8, SloClass.LOOSE)
    prompts = [json.loads(request_body("m", s, i, 0))["prompt"] for i, s in enumerate((a, b, c))]
    assert [len(p) for p in prompts] == [s.prompt_tokens for s in (a, b, c)]
    n = 2 * PREFIX_BLOCK_TOKENS
    assert prompts[0][:n] == prompts[1][:n] and prompts[0][n:] != prompts[1][n : n + 40]
    assert prompts[2][:16] != prompts[0][:16]  # no blocks named: its own prompt from the first token
