"""The proxy's shell (proxy/app.py) on in-memory fake engines (tests/proxy/fakes.py): bad input, admin, the
engine signals (/metrics polls and /health probes, against the fakes), health and metrics, predictors."""

from __future__ import annotations

import asyncio
import json
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


def nest(depth: int) -> Any:
    """Arrays nested ``depth`` deep."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def deep(depth: int, open_: str = '{"a":', close: str = "}") -> bytes:
    """A body whose ``extra`` nests ``depth`` objects (or arrays), written by hand: past about 990 levels
    json.dumps itself runs out of recursion."""
    inner = "1" if open_.startswith("{") else ""
    head = json.dumps(body())[:-1]
    return f'{head}, "extra": {open_ * depth}{inner}{close * depth}}}'.encode()


def chat(*messages: Any, **kw: Any) -> dict[str, Any]:
    return {"path": CHAT, "body": {"model": MODEL, "messages": list(messages), "max_tokens": 4, **kw}}


def part(**kw: Any) -> dict[str, Any]:
    return {"role": "user", "content": [kw]}


CHAT = "/v1/chat/completions"
BAD_INPUT = [
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
    # nesting: orjson reads 1024 levels but writes 254; the proxy writes the body back (prefill, decode)
    ({"raw": deep(1000)}, 400, "extra is nested more than 254 levels"),  # json.dumps cannot write it
    ({"raw": deep(1000, "[", "]")}, 400, "extra is nested more than 254 levels"),
    ({"body": body(extra=nest(254))}, 400, "extra is nested more than 254 levels"),
    ({"body": body(extra={"a": {"b": nest(300)}})}, 400, "extra is nested more than 254"),
    ({"raw": b'{"prompt": "x", "extra": ' + b"[" * 1100 + b"]" * 1100 + b"}"}, 400, "not valid JSON"),
    ({**chat({"role": "user", "content": "hi", "tool_calls": nest(400)})}, 400, "messages is nested"),
    # the prompt: str | list[int] | list[str] | list[list[int]]
    ({"body": body(prompt=5)}, 400, "prompt must be a string, a list of token ids"),
    ({"body": body(prompt=None)}, 400, "prompt must be"),
    ({"body": body(prompt={"text": "hi"})}, 400, "prompt must be"),
    ({"body": body(prompt=[1, "a"])}, 400, "prompt must be"),
    ({"body": body(prompt=[True, False])}, 400, "prompt must be"),
    ({"body": body(prompt=[1.5, 2])}, 400, "prompt must be"),
    ({"body": body(prompt=[[1, 2], "a"])}, 400, "prompt must be"),
    ({"body": body(prompt=[["a"]])}, 400, "prompt must be"),
    ({"body": body(prompt=nest(600))}, 400, "prompt must be"),
    # chat messages: objects with a string role, content a string or a list of typed parts
    ({"path": CHAT, "body": {"model": MODEL, "messages": "hi"}}, 400, "messages must be a list"),
    (chat("hi"), 400, "messages[0] must be an object"),
    (chat({"content": "hi"}), 400, "messages[0].role must be a string"),
    (chat({"role": 1, "content": "hi"}), 400, "messages[0].role must be a string"),
    (chat({"role": "user", "content": 5}), 400, "messages[0].content must be a string or a list"),
    (chat({"role": "user", "content": {"text": "hi"}}), 400, "messages[0].content must be"),
    (chat({"role": "user", "content": ["hi"]}), 400, "messages[0].content[0] must be an object"),
    (chat(part(text="hi")), 400, "messages[0].content[0].type must be a string"),
    (chat(part(type=1, text="hi")), 400, "messages[0].content[0].type must be a string"),
    (chat(part(type="text", text=5)), 400, "messages[0].content[0].text must be a string"),
    (chat(part(type="text", text=["a", "b"])), 400, "messages[0].content[0].text must be a string"),
    (chat(part(type="text", text={"a": 1})), 400, "messages[0].content[0].text must be a string"),
    (chat(part(type="text")), 400, "messages[0].content[0].text must be a string"),
    (
        chat({"role": "system", "content": "be brief"}, part(type="text", text=None)),
        400,
        "messages[1].content[0].text must be a string",
    ),
    # every other field the proxy reads, or relays with a type vLLM fixes
    ({"body": body(max_tokens=8.0)}, 400, "max_tokens must be an integer"),
    ({"body": body(max_tokens=2**70)}, 400, "max_tokens must be an integer"),  # orjson: a float
    ({"body": body(max_tokens=2**63)}, 400, "max_tokens must be in"),
    ({"body": body(max_tokens=-(2**63))}, 400, "max_tokens must be in"),
    ({"body": body(max_completion_tokens="8")}, 400, "max_completion_tokens must be an integer"),
    ({"body": body(max_completion_tokens=0)}, 400, "max_completion_tokens must be in"),
    ({"body": body(stream=1)}, 400, "stream must be a boolean"),
    ({"body": body(stream=True, stream_options=[1])}, 400, "stream_options must be an object"),
    ({"body": body(stream=True, stream_options="usage")}, 400, "stream_options must be an object"),
    (
        {"body": body(stream=True, stream_options={"include_usage": "no"})},
        400,
        "stream_options.include_usage must be a boolean",
    ),
    ({"body": body(model=5)}, 400, "model must be a string"),
    ({"body": body(model=["emulated"])}, 400, "model must be a string"),
    ({"body": body(n="2")}, 400, "n must be an integer"),
    ({"body": body(n=0)}, 400, "n must be at least 1, got 0"),
    ({"body": body(n=True)}, 400, "n must be an integer"),
    ({"body": body(min_tokens=-1)}, 400, "min_tokens must be at least 0"),
    ({"body": body(min_tokens="1")}, 400, "min_tokens must be an integer"),
    ({"body": body(min_completion_tokens=[1])}, 400, "min_completion_tokens must be an integer"),
    ({"body": body(ignore_eos="true")}, 400, "ignore_eos must be a boolean"),
    ({"body": body(ignore_eos=1)}, 400, "ignore_eos must be a boolean"),
    # not JSON: NaN, Infinity, numbers beyond a double, invalid UTF-8 in a string
    ({"raw": b'{"prompt": "x", "max_tokens": NaN}'}, 400, "not valid JSON"),
    ({"raw": b'{"prompt": "x", "temperature": Infinity}'}, 400, "not valid JSON"),
    ({"raw": b'{"prompt": "x", "temperature": -Infinity}'}, 400, "not valid JSON"),
    ({"raw": b'{"prompt": "x", "temperature": 1e400}'}, 400, "not valid JSON"),
    ({"raw": b'{"prompt": "\xc3\x28"}'}, 400, "not valid JSON"),
    ({"raw": b'{"prompt": "ok", "model": "\xed\xa0\x80"}'}, 400, "not valid JSON"),  # a surrogate
    # duplicate keys: the last one counts, as in Python's json (and vLLM's)
    ({"raw": b'{"prompt": "x", "max_tokens": 4, "max_tokens": "4"}'}, 400, "max_tokens must be an integer"),
    ({"raw": b'{"prompt": 1, "prompt": "x", "stream": true, "stream": []}'}, 400, "stream must be a boolean"),
]


@pytest.mark.parametrize(("send", "status", "message"), BAD_INPUT)
def test_bad_input_gets_a_4xx_json_error(
    send: dict[str, Any], status: int, message: str, tmp_path: Path
) -> None:
    fakes = FakeCluster(1, 1)

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path) as p:
            answer = await p.post(
                send.get("body"), send.get("path", "/v1/completions"), send.get("headers"), send.get("raw")
            )
            assert answer.status == status, answer.body[:300]
            assert message in answer.json()["error"]["message"]
            assert (await p.post(body(max_tokens=1))).status == 200  # still serving
        return p

    p = run(go())
    recs = p.records()
    if status == 413:  # refused by the server before the body was whole: never reached a route, no record
        assert [r.status for r in recs] == [RequestStatus.OK]
    else:  # the client's error, recorded as such: never "client disconnected", never routed
        assert [r.status for r in recs] == [RequestStatus.REJECTED, RequestStatus.OK]
        assert (recs[0].error or "").startswith("HTTP 400: ") and recs[0].prefill_id is None
    assert p.proxy.ledger.in_flight_requests() == 0
    assert fakes["prefill-0"].sent and len(fakes["prefill-0"].sent) == 1


def test_bad_input_names_the_field_as_vllm_does(tmp_path: Path) -> None:
    fakes = FakeCluster(1, 1)
    cases = [
        (body(max_tokens="1"), "/v1/completions", "max_tokens"),
        (body(prompt=[1, "a"]), "/v1/completions", "prompt"),
        (body(extra=nest(300)), "/v1/completions", "extra"),
        (body(stream_options=3), "/v1/completions", "stream_options"),
        (body(n=0), "/v1/completions", "n"),
        (body(model=1), "/v1/completions", "model"),
        (chat(part(type="text", text=1))["body"], CHAT, "messages"),
    ]

    async def go() -> None:
        async with ProxyOnFakes(fakes, tmp_path) as p:
            for sent, path, param in cases:
                error = (await p.post(sent, path)).json()["error"]
                assert (error["param"], error["type"], error["code"]) == (param, "BadRequestError", 400)

    run(go())


def test_bodies_at_the_limits_are_served(tmp_path: Path) -> None:
    """What the checks let through reaches the engines, written back whole: the deepest body the encoder
    writes, every prompt form, chat parts of other types, nulls for the optional fields."""
    fakes = FakeCluster(1, 1)
    served = [
        (body(extra=nest(253)), "/v1/completions"),  # 254 levels, the body counting as one
        (body(extra={"a": [{"b": nest(250)}]}), "/v1/completions"),
        (body(prompt=[5, 6, 7]), "/v1/completions"),
        (body(prompt=["one prompt"]), "/v1/completions"),
        (body(prompt=[[5, 6, 7]]), "/v1/completions"),
        (body(stream=None, n=1, min_tokens=0, stream_options=None, model=MODEL), "/v1/completions"),
        (body(stream=True, stream_options={"include_usage": None}), "/v1/completions"),
        (
            chat(
                {"role": "system", "content": None},
                {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url"}]},
            )["body"],
            CHAT,
        ),
    ]

    async def go() -> ProxyOnFakes:
        # no tokenizer: the proxy's own checks alone (a tokenizer refuses what its engine would, test_tokens)
        async with ProxyOnFakes(fakes, tmp_path, tokenizer=None) as p:
            for sent, path in served:
                answer = await p.post(sent, path)
                assert answer.status == 200, (sent, answer.body[:300])
        return p

    p = run(go())
    assert [r.status for r in p.records()] == [RequestStatus.OK] * len(served)
    assert fakes["decode-0"].sent[0].body["extra"] == nest(253)  # written back whole, to both engines
    assert fakes["prefill-0"].sent[0].body["extra"] == nest(253)


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
            for bad in ({}, {ORACLE_HEADER: "many"}, {ORACLE_HEADER: "0"}, {ORACLE_HEADER: "9" * 5000}):
                answer = await p.post(body(), headers=bad)
                assert answer.status == 400 and ORACLE_HEADER in answer.body.decode()
            assert (await p.post(body(), headers={ORACLE_HEADER: "37"})).status == 200
            # The load generator sends each request's own length: the proxy predicts exactly it.
            specs = [RequestSpec(f"r{i}", 0.01 * i, 32, n, SloClass.TIGHT) for i, n in enumerate((3, 9, 5))]
            result = await drive(f"http://127.0.0.1:{p.port}", specs, MODEL, oracle_header=True)
            assert all(r.status is RequestStatus.OK for r in result.records)
        return p

    p = run(go())
    recs = p.records()
    assert [r.status for r in recs[:4]] == [RequestStatus.REJECTED] * 4  # the bad headers: client errors
    assert sorted(r.predicted_output_tokens for r in recs[4:]) == [3, 5, 9, 37]


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
