"""The proxy's shell (proxy/app.py) on in-memory fake engines (tests/proxy/fakes.py): bad input, admin, the
engine signals (/metrics polls and /health probes, against the fakes), health and metrics, predictors."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from calroute.aio import run
from calroute.harness.loadgen import drive
from calroute.proxy.generate import ENGINES_FAILED
from calroute.proxy.oracle import ORACLE_HEADER
from calroute.types import RequestSpec, RequestStatus, SloClass
from tests.proxy.fakes import FAST, MODEL, FakeCluster, Faults, ProxyOnFakes, until

PROMPT = "The quick brown fox jumps over the lazy dog. " * 20


def body(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": PROMPT, "max_tokens": 12, "ignore_eos": True, **kw}


@pytest.mark.parametrize(
    ("send", "status", "message"),
    [
        ({"raw": b"{not json"}, 400, "not valid JSON"),
        ({"body": [1, 2]}, 400, "JSON object"),
        ({"body": {"max_tokens": 5}}, 400, "prompt is required"),
        ({"body": body(max_tokens=-5)}, 400, "max_tokens must be in"),
        ({"body": body(max_tokens=0)}, 400, "max_tokens must be in"),
        ({"body": body(max_tokens=10**9)}, 400, "max_tokens must be in"),
        ({"body": body(max_tokens="12")}, 400, "must be an integer"),
        ({"body": body(max_tokens=True)}, 400, "must be an integer"),
        ({"body": body(stream="yes")}, 400, "stream must be a boolean"),
        ({"raw": b'{"prompt": "' + b"x" * (9 * 1024 * 1024) + b'"}'}, 413, "larger than"),
        ({"raw": b"\xff\xfe{}"}, 400, "not valid JSON"),
        ({"body": body(), "headers": {"x-calroute-slo": "platinum"}}, 400, "x-calroute-slo"),
    ],
)
def test_bad_input_gets_a_4xx_json_error(
    send: dict[str, Any], status: int, message: str, tmp_path: Path
) -> None:
    fakes = FakeCluster(1, 1)

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path) as p:
            answer = await p.post(send.get("body"), raw=send.get("raw"), headers=send.get("headers"))
            assert answer.status == status and message in answer.json()["error"]["message"]
            assert (await p.post(body(max_tokens=1))).status == 200  # still serving
        return p

    p = run(go())
    assert [r.status for r in p.records()] == [RequestStatus.OK]  # the refused one was never admitted
    assert fakes["prefill-0"].sent and len(fakes["prefill-0"].sent) == 1


def test_admin_endpoints_need_the_token(tmp_path: Path) -> None:
    fakes = FakeCluster(2, 2)

    async def go() -> None:
        async with ProxyOnFakes(fakes, tmp_path / "closed") as closed:
            assert (await closed.get("/state")).status == 403
        async with ProxyOnFakes(fakes, tmp_path, admin_token="s3cret") as p:
            assert (await p.get("/state")).status == 401

            async def admin(path: str, payload: Any = None, token: str = "s3cret") -> tuple[int, Any]:
                auth = {"Authorization": f"Bearer {token}"}
                answer = await (p.get(path, auth) if payload is None else p.post(payload, path, auth))
                return answer.status, answer.json()

            assert (await admin("/state", token="wrong"))[0] == 401
            status, state = await admin("/state")
            assert status == 200 and state["policy"] == "marginal_cost" and len(state["engines"]) == 4
            assert await admin("/admin/policy", {"policy": "round_robin"}) == (
                200,
                {"policy": "round_robin", "params": {}},
            )
            assert (await admin("/admin/policy", {"policy": "nope"}))[0] == 400
            assert (await admin("/admin/policy", {"policy": "marginal_cost", "params": {"rho": -1}}))[
                0
            ] == 400
            assert (await admin("/state"))[1]["policy"] == "round_robin"

    run(go())


def test_engines_are_scraped_only_while_something_reads_the_samples(tmp_path: Path) -> None:
    fakes = FakeCluster(2, 2)

    def samples(p: ProxyOnFakes) -> dict[str, float | None]:
        return dict(p.proxy.signals.last_sample_s)

    async def switch(p: ProxyOnFakes, policy: str) -> None:
        answer = await p.post({"policy": policy}, "/admin/policy", {"Authorization": "Bearer t"})
        assert answer.status == 200

    async def go() -> None:
        async with ProxyOnFakes(fakes, tmp_path, signals=True, policy="round_robin", admin_token="t") as p:
            await asyncio.sleep(0.5)  # ten poll intervals
            assert set(samples(p).values()) == {None}
            assert sum(e.scrapes for e in fakes.engines.values()) == 0
            await switch(p, "marginal_cost")  # reads kv_used_tokens: the polls start
            await until(lambda: None not in samples(p).values())
            await switch(p, "least_loaded")  # reads none: the polls stop (a cancelled poll records nothing)
            before, scrapes = samples(p), [e.scrapes for e in fakes.engines.values()]
            await asyncio.sleep(0.3)
            assert samples(p) == before and [e.scrapes for e in fakes.engines.values()] == scrapes
        # online recalibration fits on sampled batches: it reads them too
        async with ProxyOnFakes(
            fakes, tmp_path / "online", signals=True, policy="round_robin", online_calibration=True
        ) as online:
            await until(lambda: None not in samples(online).values())

    run(go())


def test_queue_kv_routes_on_the_polled_samples(tmp_path: Path) -> None:
    # llm-d's scorers read only the engines' metrics: the proxy polls them, and requests spread over
    # both pools (ties rotate; an engine seen busy scores lower).
    fakes = FakeCluster(2, 2)

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path, signals=True, policy="queue_kv") as p:
            await until(lambda: None not in p.proxy.signals.last_sample_s.values())
            for _ in range(6):
                assert (await p.post(body(max_tokens=2))).status == 200
        return p

    recs = run(go()).records()
    assert [r.status for r in recs] == [RequestStatus.OK] * 6
    assert {r.prefill_id for r in recs} == {"prefill-0", "prefill-1"}
    assert {r.decode_id for r in recs} == {"decode-0", "decode-1"}


def test_proxy_metrics_and_health(tmp_path: Path) -> None:
    fakes = FakeCluster(2, 2)

    async def go() -> None:
        async with ProxyOnFakes(fakes, tmp_path, signals=True) as p:
            assert (await p.post(body(max_tokens=3))).status == 200
            exposition = (await p.get("/metrics")).body.decode()
            assert "calroute_requests_total{" in exposition
            assert p.metric("calroute_requests_total") == 1
            assert p.metric("calroute_decision_seconds_count") == 1
            await until(lambda: p.metric("calroute_event_loop_lag_seconds_count") >= 1)  # every 0.1 s
            assert p.metric("calroute_engine_healthy") == 4
            await until(lambda: 0 < p.metric("calroute_signal_age_seconds") < 4 * 0.5)
            health = await p.get("/health")
            assert (health.status, health.json()) == (
                200,
                {"status": "ok", "prefill_instances": 2, "decode_instances": 2},
            )
            assert (await p.get("/v1/models")).json()["data"][0]["id"] == "emulated"

    run(go())


def test_a_dead_pool_fails_its_probes_is_still_tried_then_answered_with_a_clear_502(tmp_path: Path) -> None:
    fakes = FakeCluster(1, 1)
    fakes["decode-0"].faults = Faults(down=True)  # the only decode engine is gone

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path, signals=True, **FAST) as p:
            await until(lambda: not p.proxy.signals.healthy["decode-0"])  # three failed probes
            assert (await p.get("/health")).status == 503
            # no healthy decode engine: the router tries them anyway (panic mode), and reports why it failed
            answer = await p.post(body(max_tokens=3))
            assert answer.status == 502 and answer.json()["error"]["message"] == ENGINES_FAILED
        return p

    p = run(go())
    (rec,) = p.records()
    assert rec.status is RequestStatus.FAILED and "decode-0" in (rec.error or "")
    assert len(fakes["decode-0"].sent) == 3  # every attempt, each after a fresh prefill
    assert len(fakes["prefill-0"].sent) == 3


def test_metrics_going_away_leaves_the_engine_in_routing(tmp_path: Path) -> None:
    fakes = FakeCluster(1, 1)

    async def go() -> None:
        async with ProxyOnFakes(fakes, tmp_path, signals=True, **FAST) as p:
            signals = p.proxy.signals
            await until(lambda: signals.last_sample_s["decode-0"] is not None)  # a sample came first
            fakes["decode-0"].faults = Faults(metrics_down=True)
            await until(lambda: signals.metrics_failures["decode-0"] > 5)
            await until(lambda: p.proxy.now() - (signals.last_sample_s["decode-0"] or 0) > 0.5)
            assert signals.healthy["decode-0"]
            assert (await p.post(body())).status == 200
            assert p.records()[-1].decode_id == "decode-0"

    run(go())


def test_an_engine_that_comes_back_is_routed_to_again(tmp_path: Path) -> None:
    fakes = FakeCluster(1, 2)
    fakes["decode-0"].faults = Faults(status=500)

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(
            fakes, tmp_path, signals=True, policy="round_robin", health_interval_s=0.3, **FAST
        ) as p:
            assert (await p.post(body())).status == 200  # retried on decode-1
            assert not p.proxy.signals.healthy["decode-0"]
            fakes["decode-0"].faults = Faults()
            await until(lambda: p.proxy.signals.healthy["decode-0"])  # the health probe brings it back
            for _ in range(4):
                assert (await p.post(body())).status == 200
        return p

    p = run(go())
    assert "decode-0" in {r.decode_id for r in p.records()[-4:]}


def test_a_crashed_decode_engine_is_taken_out_and_requests_complete(tmp_path: Path) -> None:
    fakes = FakeCluster(2, 2)
    fakes["decode-0"].faults = Faults(down=True)

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path) as p:
            for _ in range(4):
                answer = await p.post(body(max_tokens=3))
                assert answer.status == 200, answer.body
        return p

    p = run(go())
    assert not p.proxy.signals.healthy["decode-0"]
    assert {r.decode_id for r in p.records()} == {"decode-1"}
    assert len(fakes["decode-0"].sent) == 1


def test_the_oracle_predictor_reads_the_true_length_from_its_header(tmp_path: Path) -> None:
    fakes = FakeCluster(2, 2)

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path, predictor="oracle") as p:
            for bad in ({}, {ORACLE_HEADER: "many"}, {ORACLE_HEADER: "0"}):
                answer = await p.post(body(), headers=bad)
                assert answer.status == 400 and ORACLE_HEADER in answer.body.decode()
            assert (await p.post(body(), headers={ORACLE_HEADER: "37"})).status == 200
            # The load generator sends each request's own length: the proxy predicts exactly it.
            specs = [RequestSpec(f"r{i}", 0.01 * i, 32, n, SloClass.TIGHT) for i, n in enumerate((3, 9, 5))]
            result = await drive(f"http://127.0.0.1:{p.port}", specs, MODEL, oracle_header=True)
            assert all(r.status is RequestStatus.OK for r in result.records)
        return p

    p = run(go())
    assert sorted(r.predicted_output_tokens for r in p.records()) == [3, 5, 9, 37]


def test_injected_predictor_error_is_seeded(tmp_path: Path) -> None:
    def predictions(seed: int) -> list[int]:
        fakes = FakeCluster(2, 2)
        where = tmp_path / f"run{len(list(tmp_path.iterdir()))}"

        async def go() -> ProxyOnFakes:
            async with ProxyOnFakes(
                fakes, where, predictor="oracle", predictor_noise=0.5, predictor_seed=seed
            ) as p:
                for _ in range(6):
                    assert (await p.post(body(), headers={ORACLE_HEADER: "100"})).status == 200
            return p

        return [r.predicted_output_tokens for r in run(go()).records()]

    first = predictions(1)
    assert any(n != 100 for n in first) and all(n >= 1 for n in first)
    assert predictions(1) == first and predictions(2) != first
