"""Generation (proxy/generate.py) on in-memory fake engines (tests/proxy/fakes.py): the decision reaching the
chosen engines, the handoff bodies, retries and failover, engine 4xx answers, one record per admitted
request with its terminal status, usage stripped when not asked for. The fault matrix of docs/faults.md,
but for what only real processes can show (tests/faults/test_fault_matrix.py).

A whole proxy serves on loopback with the fakes behind it; its /metrics and /health polls stay off unless
a test needs them, so that only requests decide what is healthy."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from calroute.aio import run
from calroute.contract.handoff import PREFILL_KV_PARAMS
from calroute.proxy.config import AnswerLimits
from calroute.proxy.generate import ENGINE_REFUSED, ENGINES_FAILED, STREAM_BROKE
from calroute.proxy.http.client import Endpoint
from calroute.types import RequestStatus
from tests.proxy.conftest import CAL
from tests.proxy.fakes import (
    FAST,
    MODEL,
    Answer,
    FakeCluster,
    Faults,
    ProxyOnFakes,
    read_head,
    send,
    stream_events,
    token,
    until,
)

PROMPT = "fault tolerance " * 30
# What an answer to the client never names when engines failed it: an engine, an address, an exception.
LEAKS = (b"prefill-", b"decode-", b"127.0.0.1", b"Error:", b"Traceback", b"HTTP 5")
CHAT = [{"role": "user", "content": "hi there"}]
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def body(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "ignore_eos": True, **kw}


def chat(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": CHAT, "max_tokens": 8, **kw}


def text_of(answer: Answer, streamed: bool, is_chat: bool = False) -> str:
    if not streamed:
        choice = answer.json()["choices"][0]
        return str(choice["message"]["content"] if is_chat else choice["text"])
    events = answer.events()
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1, events
    assert not any("error" in e for e in events[:-1]), events
    key = "delta" if is_chat else None
    return "".join(
        str(c[key].get("content", "") if key else c["text"]) for e in events[:-1] for c in e["choices"]
    )


def full_text(n: int = 8) -> str:
    return "".join(token(i) for i in range(n))


def healthy(p: ProxyOnFakes) -> dict[str, bool]:
    return dict(p.proxy.signals.healthy)


def settled(p: ProxyOnFakes, n: int) -> list[Any]:
    """Every admitted request ended in exactly one record, and the ledger holds none of them."""
    recs = p.records()
    assert len(recs) == n and len({r.request_id for r in recs}) == n, recs
    assert p.proxy.ledger.in_flight_requests() == 0
    return recs


# ---- the decision reaches the chosen engines -----------------------------------------------------------


@pytest.mark.parametrize("policy", ["round_robin", "least_loaded", "marginal_cost", "random"])
def test_each_request_goes_to_the_pair_its_decision_chose(policy: str, tmp_path: Path) -> None:
    fakes = FakeCluster(2, 2)

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path, policy=policy) as p:
            for i in range(6):
                answer = await p.post(body(stream=bool(i % 2)))
                assert answer.status == 200 and text_of(answer, bool(i % 2)) == full_text()
        return p

    p = run(go())
    recs = settled(p, 6)
    decisions = [json.loads(line) for line in (tmp_path / "decisions.jsonl").read_text().splitlines()]
    assert [d["admission"]["request_id"] for d in decisions] == [r.request_id for r in recs]
    for rec, d in zip(recs, decisions, strict=True):
        assert rec.status is RequestStatus.OK
        assert (rec.prefill_id, rec.decode_id) == (d["decision"]["prefill_id"], d["decision"]["decode_id"])
        assert [e for e, _ in fakes.sent(rec.request_id)] == [rec.prefill_id, rec.decode_id]
    if policy == "round_robin":
        assert [r.prefill_id for r in recs] == ["prefill-0", "prefill-1"] * 3
        assert [r.decode_id for r in recs] == ["decode-0", "decode-1"] * 3


# ---- the handoff bodies -----------------------------------------------------------------------------------

HANDOFFS = [
    pytest.param(
        "/v1/completions",
        {"model": MODEL, "prompt": PROMPT, "max_tokens": 8},
        {"max_tokens": 1, "stream": False},
        {},
        id="completions",
    ),
    pytest.param(
        "/v1/completions",
        {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "min_tokens": 2, "stream": True},
        {"max_tokens": 1, "stream": False, "min_tokens": None},
        {"stream_options": {"include_usage": True}},
        id="completions-stream-min-tokens",
    ),
    pytest.param(
        "/v1/completions",
        {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 4, "stream": True, "stream_options": {"x": 1}},
        {"max_tokens": 1, "stream": False, "stream_options": None},
        {"stream_options": {"x": 1, "include_usage": True}},
        id="token-ids-stream-options-kept",
    ),
    pytest.param(
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": CHAT,
            "max_completion_tokens": 6,
            "stream": True,
            "kv_transfer_params": {"a": 1},
        },
        {"max_tokens": 1, "max_completion_tokens": 1, "stream": False},
        {"stream_options": {"include_usage": True}},
        id="chat-max-completion-tokens-client-kv-replaced",
    ),
    pytest.param(
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": CHAT,
            "max_tokens": 5,
            "stream": True,
            "stream_options": {"include_usage": False},
            "min_completion_tokens": 1,
        },
        {"max_tokens": 1, "stream": False, "stream_options": None, "min_completion_tokens": None},
        {"stream_options": {"include_usage": True}},
        id="chat-stream-no-usage-asked",
    ),
]


@pytest.mark.parametrize(("path", "client", "prefill_changes", "decode_changes"), HANDOFFS)
def test_each_engine_receives_its_handoff_body_and_the_same_request_id(
    path: str,
    client: dict[str, Any],
    prefill_changes: dict[str, Any],
    decode_changes: dict[str, Any],
    tmp_path: Path,
) -> None:
    """Prefill: the client's body with max_tokens 1, no stream, no stream_options / min_tokens, and
    do_remote_decode. Decode: the client's body with the prefill's kv_transfer_params, verbatim, and (on a
    stream) include_usage. One X-Request-Id on both hops, and on the client's answer; only trace headers and
    the engines' own key pass."""
    fakes = FakeCluster(1, 1)
    client_headers = {"traceparent": TRACEPARENT, "Authorization": "Bearer client-secret", "X-Other": "1"}
    ids = []

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path, engine_api_key="engine-key-123") as p:
            answer = await p.post(client, path, headers=client_headers)
            assert answer.status == 200, answer.body
            ids.append(answer.headers["x-request-id"])
        return p

    p = run(go())
    (rec,) = settled(p, 1)
    assert rec.status is RequestStatus.OK and ids == [rec.request_id]
    (_, pre), (_, dec) = fakes.sent(rec.request_id)
    assert pre.path == dec.path == path
    expected_prefill = {**client, **prefill_changes, "kv_transfer_params": PREFILL_KV_PARAMS}
    assert pre.body == {k: v for k, v in expected_prefill.items() if v is not None}
    handed = json.loads(fakes["prefill-0"].answers[0].payload or b"")["kv_transfer_params"]
    assert handed["remote_engine_id"] == "prefill-0"
    assert dec.body == {**client, **decode_changes, "kv_transfer_params": handed}
    for sent in (pre, dec):
        assert sent.headers == {
            "traceparent": TRACEPARENT,
            "Authorization": "Bearer engine-key-123",
            "X-Request-Id": rec.request_id,
        }
    assert p.cfg.log_path is not None
    assert "engine-key-123" not in p.cfg.log_path.read_text()


# ---- retries and failover ---------------------------------------------------------------------------------

PREFILL_FAULTS = {
    "500": Faults(status=500),
    "503": Faults(status=503),
    "connection refused": Faults(refuse=True),
    "stalled": Faults(stall=True),
    "slow first byte": Faults(first_byte_s=5.0),
    "unreadable answer": Faults(garbage=True),
}


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("fault", PREFILL_FAULTS.values(), ids=PREFILL_FAULTS.keys())
def test_a_failed_prefill_is_retried_on_another_prefill_engine(
    fault: Faults, streamed: bool, tmp_path: Path
) -> None:
    fakes = FakeCluster(2, 2)
    fakes["prefill-0"].faults = fault

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path, policy="round_robin", **FAST) as p:
            for _ in range(3):
                answer = await p.post(body(stream=streamed))
                assert answer.status == 200 and text_of(answer, streamed) == full_text()
        return p

    p = run(go())
    recs = settled(p, 3)
    assert all(r.status is RequestStatus.OK and r.prefill_id == "prefill-1" for r in recs)
    first = fakes.sent(recs[0].request_id)
    assert [e for e, _ in first][:2] == ["prefill-0", "prefill-1"] and first[-1][0] == recs[0].decode_id
    assert first[-1][1].body["kv_transfer_params"]["remote_engine_id"] == "prefill-1"
    assert len(fakes["prefill-0"].sent) == 1  # out of routing after its failure
    if fault.stall or fault.first_byte_s:
        assert fakes["prefill-0"].sent[0].read_timeout_s == FAST["prefill_timeout_s"]
    assert p.metric("calroute_retries_total", phase="prefill") == 1
    assert p.metric("calroute_engine_errors_total", engine="prefill-0") == 1
    assert healthy(p) == {"prefill-0": False, "prefill-1": True, "decode-0": True, "decode-1": True}


DECODE_FAULTS = [
    pytest.param({"decode-0": Faults(status=500)}, False, id="500"),
    pytest.param({"decode-0": Faults(status=503)}, True, id="503-stream"),
    pytest.param({"decode-0": Faults(status=500)}, True, id="500-stream"),
    pytest.param({"decode-0": Faults(refuse=True)}, False, id="refused"),
    pytest.param({"decode-0": Faults(refuse=True)}, True, id="refused-stream"),
    pytest.param({"decode-0": Faults(stall=True)}, False, id="stalled"),
    # a stalled stream has had its head sent (as vLLM's does): the retry goes on into the same response
    pytest.param({"decode-0": Faults(stall=True)}, True, id="stalled-stream"),
    pytest.param({"decode-0": Faults(first_byte_s=5.0)}, True, id="slow-first-byte-stream"),
    # a head, then the end of an empty body: nothing to relay
    pytest.param({"decode-0": Faults(empty=True)}, True, id="empty-stream"),
    # the prefill engine answered but its KV cannot be pulled (as if it died): the decode engine fails
    # the pull with a 500, and the retry gets a fresh prefill elsewhere
    pytest.param({"prefill-0": Faults(refuse_kv_pulls=True)}, False, id="kv-pull-refused"),
    pytest.param({"prefill-0": Faults(refuse_kv_pulls=True)}, True, id="kv-pull-refused-stream"),
]


@pytest.mark.parametrize(("faults", "streamed"), DECODE_FAULTS)
def test_a_failed_decode_is_retried_elsewhere_after_a_fresh_prefill(
    faults: dict[str, Faults], streamed: bool, tmp_path: Path
) -> None:
    fakes = FakeCluster(2, 2)
    for engine_id, fault in faults.items():
        fakes[engine_id].faults = fault

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path, policy="round_robin", **FAST) as p:
            answer = await p.post(body(stream=streamed))
            assert answer.status == 200 and text_of(answer, streamed) == full_text(), answer.body
            assert answer.body.count(b"HTTP/1.1") == 0  # one response, whatever went before
        return p

    p = run(go())
    (rec,) = settled(p, 1)
    assert rec.status is RequestStatus.OK and rec.output_tokens == 8
    assert (rec.prefill_id, rec.decode_id) == ("prefill-1", "decode-1")
    sent = fakes.sent(rec.request_id)
    assert [e for e, _ in sent] == ["prefill-0", "decode-0", "prefill-1", "decode-1"]
    handed = [s.body["kv_transfer_params"] for e, s in sent if e.startswith("decode")]
    assert [kv["remote_engine_id"] for kv in handed] == ["prefill-0", "prefill-1"]
    assert handed[0]["remote_request_id"] != handed[1]["remote_request_id"]  # never reused
    assert p.metric("calroute_retries_total", phase="decode") == 1
    assert p.metric("calroute_retries_total", phase="prefill") == 0
    assert p.metric("calroute_engine_errors_total", engine="decode-0") == 1
    assert not healthy(p)["decode-0"] and healthy(p)["decode-1"]
    if streamed:
        assert sent[1][1].read_timeout_s == FAST["stall_timeout_s"]


def test_the_decode_silence_bound_grows_with_the_tokens_of_a_json_answer(tmp_path: Path) -> None:
    """A stream sends a token every step: its bound is the stall timeout between two pieces. A JSON answer
    says nothing until the last token: its bound adds 4 calibrated decode steps per token asked for, so a
    long answer is not a stall."""
    fakes = FakeCluster(1, 1)
    tokens = 100
    bound_s = FAST["stall_timeout_s"] + tokens * 4 * CAL.tau_dec_s
    fakes["decode-0"].faults = Faults(first_byte_s=FAST["stall_timeout_s"] * 2)  # past the stall timeout

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path, **FAST) as p:
            assert (await p.post(body(max_tokens=tokens))).status == 200
            fakes["decode-0"].faults = Faults(token_interval_s=0.01)  # 100 pieces: 1 s, 5 stall timeouts
            answer = await p.post(body(max_tokens=tokens, stream=True))
            assert answer.status == 200 and text_of(answer, True) == full_text(tokens)
        return p

    p = run(go())
    recs = settled(p, 2)
    assert all(r.status is RequestStatus.OK and r.output_tokens == tokens for r in recs)
    assert [s.read_timeout_s for s in fakes["decode-0"].sent] == [
        pytest.approx(bound_s),
        FAST["stall_timeout_s"],
    ]
    streamed = recs[1]
    assert streamed.last_token_s is not None and streamed.first_token_s is not None
    assert streamed.last_token_s - streamed.first_token_s > FAST["stall_timeout_s"]


# ---- engine 4xx answers -----------------------------------------------------------------------------------

CLIENT_ERRORS = [
    pytest.param("prefill-0", 400, {}, id="prefill-400"),
    pytest.param("decode-0", 400, {}, id="decode-400"),
    pytest.param("decode-0", 422, {"stream": True}, id="decode-422-stream"),
    pytest.param(None, 404, {"model": "no-such-model"}, id="unknown-model"),
    pytest.param(None, 404, {"model": "no-such-model", "stream": True}, id="unknown-model-stream"),
]


@pytest.mark.parametrize(("engine", "status", "changes"), CLIENT_ERRORS)
def test_an_engine_4xx_goes_back_to_the_client_unchanged_and_never_counts_against_the_engine(
    engine: str | None, status: int, changes: dict[str, Any], tmp_path: Path
) -> None:
    fakes = FakeCluster(1, 1)
    if engine is not None:
        fakes[engine].faults = Faults(status=status)

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path) as p:
            answer = await p.post(body(**changes))
            refused_by = fakes[engine or "prefill-0"].answers[-1]
            assert answer.status == status and answer.body == refused_by.payload
            assert answer.headers["content-type"] == "application/json"
            assert (await p.post(body(max_tokens=2))).status == (200 if engine is None else status)
        return p

    p = run(go())
    rec = settled(p, 2)[0]
    assert rec.status is RequestStatus.REJECTED and (rec.error or "").startswith(f"HTTP {status}")
    assert all(healthy(p).values())
    assert p.metric("calroute_engine_errors_total") == 0 and p.metric("calroute_retries_total") == 0
    assert len(fakes.sent(rec.request_id)) == (1 if engine != "decode-0" else 2)  # no retry


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("engine", ["prefill-0", "decode-0"])
def test_an_engine_4xx_that_is_not_json_reaches_the_client_as_a_json_error(
    engine: str, streamed: bool, tmp_path: Path
) -> None:
    """A refusal whose body is an HTML page (a gateway in front of the engine): the client gets the status
    and a JSON error of the proxy's, never the page; still the client's error, not the engine's."""
    fakes = FakeCluster(1, 1)
    fakes[engine].faults = Faults(status=413, garbage=True)

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path) as p:
            answer = await p.post(body(stream=streamed))  # a stream's head goes out only with a 200
            assert answer.status == 413 and answer.headers["content-type"] == "application/json"
            assert answer.json()["error"]["message"] == f"{ENGINE_REFUSED} (HTTP 413)"
            assert b"html" not in answer.body
        return p

    p = run(go())
    (rec,) = settled(p, 1)
    assert rec.status is RequestStatus.REJECTED and (rec.error or "").startswith("HTTP 413: <html>")
    assert all(healthy(p).values()) and p.metric("calroute_engine_errors_total") == 0


# ---- one record per admitted request, with its terminal status -------------------------------------------


def test_a_stream_cut_off_after_its_first_tokens_ends_with_an_error_event(tmp_path: Path) -> None:
    """A stream under way cannot be replayed elsewhere: the tokens so far, an error event, [DONE]."""
    fakes = FakeCluster(1, 2)
    fakes["decode-0"].faults = Faults(cut_after=3, token_interval_s=0.01)

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path, policy="round_robin", **FAST) as p:
            answer = await p.post(body(max_tokens=2000, stream=True))
            assert answer.status == 200
            events = answer.events()
            assert [e["choices"][0]["text"] for e in events[:3]] == [token(0), token(1), token(2)]
            error = events[3]["error"]
            assert error["code"] == 502 and error["message"] == STREAM_BROKE  # which engine, how: not said
            assert events[4:] == ["[DONE]"]
            # and the next request goes to the survivor
            assert (await p.post(body())).status == 200
        return p

    p = run(go())
    cut, after = settled(p, 2)
    assert (
        cut.status is RequestStatus.FAILED and cut.decode_id == "decode-0" and cut.first_token_s is not None
    )
    assert "broke off the stream" in (cut.error or "")
    assert after.status is RequestStatus.OK and after.decode_id == "decode-1"
    assert not healthy(p)["decode-0"]
    assert p.metric("calroute_engine_errors_total", engine="decode-0") == 1
    assert p.metric("calroute_retries_total") == 0


def test_a_stream_whose_every_attempt_stalls_gets_its_head_at_once_then_an_error_event(
    tmp_path: Path,
) -> None:
    fakes = FakeCluster(1, 1)
    fakes["decode-0"].faults = Faults(
        stall=True
    )  # the only decode engine: its head, then silence, every time
    stall_s = 0.6

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path, prefill_timeout_s=stall_s, stall_timeout_s=stall_s) as p:
            started = time.monotonic()
            reader, writer = await send(p.port, "/v1/completions", json.dumps(body(stream=True)).encode())
            status, head = await read_head(reader)
            head_s = time.monotonic() - started
            rest = await reader.read()
            writer.close()
            # The head did not wait for a token (none ever came), nor for the engine's silence to run out.
            assert status == 200 and head["content-type"] == "text/event-stream"
            assert head_s < stall_s, head_s
            assert time.monotonic() - started > 3 * stall_s  # three attempts
            text = rest.decode()
            assert 'data: {"error"' in text and ENGINES_FAILED in text and "decode-0" not in text, text
            assert text.count("data: ") == 2 and "data: [DONE]" in text, text
        return p

    p = run(go())
    (rec,) = settled(p, 1)
    assert rec.status is RequestStatus.FAILED and rec.first_token_s is None
    assert "decode engine decode-0" in (rec.error or "")  # the details are the record's
    assert len(fakes["prefill-0"].sent) == len(fakes["decode-0"].sent) == 3  # a fresh prefill each time


TERMINAL = [
    # (faults, streamed, client status, record status, what the client reads, the record's error)
    pytest.param({}, False, 200, RequestStatus.OK, None, None, id="ok"),
    pytest.param({}, True, 200, RequestStatus.OK, None, None, id="ok-stream"),
    pytest.param(
        {"decode-0": Faults(status=400)},
        True,
        400,
        RequestStatus.REJECTED,
        "HTTP 400",
        "HTTP 400",
        id="rejected",
    ),
    pytest.param(
        {"decode-0": Faults(status=500)},
        False,
        502,
        RequestStatus.FAILED,
        ENGINES_FAILED,
        "decode engine decode-0: HTTP 500",
        id="5xx-every-attempt",
    ),
    pytest.param(
        {"prefill-0": Faults(refuse=True)},
        True,
        502,
        RequestStatus.FAILED,
        ENGINES_FAILED,
        "prefill engine prefill-0: UpstreamError: ConnectionRefusedError",
        id="prefill-gone",
    ),
    # no healthy decode engine: the router tries them anyway (panic mode), and says why it failed
    pytest.param(
        {"decode-0": Faults(down=True)},
        False,
        502,
        RequestStatus.FAILED,
        ENGINES_FAILED,
        "decode engine decode-0",
        id="dead-pool",
    ),
    pytest.param(
        {"decode-0": Faults(stall=True)},
        True,
        200,
        RequestStatus.FAILED,
        ENGINES_FAILED,
        "decode engine decode-0: TimeoutError",
        id="stall-every-attempt",
    ),
    pytest.param(
        {"decode-0": Faults(cut_after=2)},
        True,
        200,
        RequestStatus.FAILED,
        STREAM_BROKE,
        "decode engine decode-0 broke off the stream: UpstreamError",
        id="cut-mid-stream",
    ),
]


@pytest.mark.parametrize(("faults", "streamed", "status", "recorded", "says", "error"), TERMINAL)
def test_every_admitted_request_ends_in_exactly_one_record_with_its_terminal_status(
    faults: dict[str, Faults],
    streamed: bool,
    status: int,
    recorded: RequestStatus,
    says: str | None,
    error: str | None,
    tmp_path: Path,
) -> None:
    fakes = FakeCluster(1, 1)
    for engine_id, fault in faults.items():
        fakes[engine_id].faults = fault

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path, **FAST) as p:
            answer = await p.post(body(stream=streamed))
            assert answer.status == status
            if says is not None:
                assert says in answer.body.decode()
            if recorded is RequestStatus.FAILED:  # an engine's failure: never which engine, nor how
                assert not any(word in answer.body for word in LEAKS), answer.body
        return p

    p = run(go())
    (rec,) = settled(p, 1)
    assert rec.status is recorded
    assert (rec.error is None) if error is None else (error in (rec.error or "")), rec.error
    assert (
        p.metric("calroute_requests_total", status=recorded.value) == p.metric("calroute_requests_total") == 1
    )


def test_a_client_that_disconnects_mid_stream_is_cancelled_and_the_engine_request_closed(
    tmp_path: Path,
) -> None:
    fakes = FakeCluster(1, 1)
    fakes["decode-0"].faults = Faults(token_interval_s=0.01)

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path) as p:
            reader, writer = await send(
                p.port, "/v1/completions", json.dumps(body(max_tokens=3000, stream=True)).encode()
            )
            await read_head(reader)
            await reader.readuntil(b"\n\n")  # a first event
            assert fakes["decode-0"].running == 1
            writer.close()
            await until(lambda: len(p.records()) == 1)
            await until(lambda: fakes["decode-0"].running == 0)
        return p

    p = run(go())
    (rec,) = settled(p, 1)
    assert rec.status is RequestStatus.CANCELLED and rec.error == "client disconnected"
    (answer,) = fakes["decode-0"].answers
    assert answer.closed and not answer.ended  # the engine request was closed before its end: it aborts
    # the client left; the engine did nothing wrong: no engine error counted, still in routing
    assert p.metric("calroute_engine_errors_total") == 0 and all(healthy(p).values())


def test_a_failure_of_the_proxy_itself_is_a_500_logged_as_failed_never_as_a_disconnect(
    tmp_path: Path,
) -> None:
    fakes = FakeCluster(1, 1)

    async def broken(*args: Any, **kw: Any) -> Any:
        raise RuntimeError("a bug")  # neither an engine's failure (UpstreamError) nor the client leaving

    fakes["prefill-0"].request = broken  # type: ignore[method-assign]

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path) as p:
            assert (await p.post(body())).status == 500
        return p

    p = run(go())
    (rec,) = settled(p, 1)
    assert rec.status is RequestStatus.FAILED and rec.error == "proxy error: RuntimeError: a bug"


def test_every_request_is_logged_once_in_the_shared_schema(tmp_path: Path) -> None:
    fakes = FakeCluster(2, 2)

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path) as p:
            for i in range(6):
                assert (await p.post(body(max_tokens=12, stream=bool(i % 2)))).status == 200
            assert (await p.post(body(max_tokens=-1))).status == 400  # refused before admission: logged too
        return p

    p = run(go())
    *recs, refused = settled(p, 7)
    assert refused.status is RequestStatus.REJECTED and refused.prefill_id is None
    assert (refused.error or "").startswith("HTTP 400: max_tokens must be in")
    assert all(re.fullmatch(r"[0-9a-f]{32}", r.request_id) for r in recs)  # as long as a uuid4's hex
    for r in recs:
        assert r.status is RequestStatus.OK and r.output_tokens == 12 and r.prompt_tokens == 60
        assert r.prefill_done_s is not None and r.first_token_s is not None and r.last_token_s is not None
        assert r.arrival_s <= r.prefill_done_s <= r.first_token_s <= r.last_token_s
        assert r.prefill_id in ("prefill-0", "prefill-1") and r.decode_id in ("decode-0", "decode-1")


# ---- usage ----------------------------------------------------------------------------------------------

USAGE = [
    pytest.param("/v1/completions", None, False, id="not-asked"),
    pytest.param("/v1/completions", {"include_usage": True}, True, id="asked"),
    pytest.param("/v1/completions", {"include_usage": False}, False, id="declined"),
    pytest.param("/v1/completions", {}, True, id="options-default"),
    pytest.param("/v1/chat/completions", None, False, id="chat-not-asked"),
    pytest.param("/v1/chat/completions", {"include_usage": True}, True, id="chat-asked"),
]


@pytest.mark.parametrize(("path", "options", "kept"), USAGE)
def test_the_usage_chunk_reaches_the_client_only_when_asked_for(
    path: str, options: dict[str, Any] | None, kept: bool, tmp_path: Path
) -> None:
    fakes = FakeCluster(1, 1)
    is_chat = path.endswith("chat/completions")
    client = (chat if is_chat else body)(
        stream=True, **({} if options is None else {"stream_options": options})
    )

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path) as p:
            answer = await p.post(client, path)
            assert answer.status == 200 and text_of(answer, True, is_chat) == full_text()
            usage = [e for e in answer.events()[:-1] if "usage" in e]
            assert len(usage) == kept and all(u["usage"]["completion_tokens"] == 8 for u in usage)
        return p

    p = run(go())
    (rec,) = settled(p, 1)
    assert rec.status is RequestStatus.OK and rec.output_tokens == 8  # counted either way
    assert fakes["decode-0"].sent[0].body["stream_options"]["include_usage"] is True


# ---- hostile engines: answers over their caps, or unreadable ----------------------------------------------

CAP = 256 * 1024  # the caps these tests run with (an answer, an event), so that going over them is quick
CAPS: dict[str, Any] = {"answer_limits": AnswerLimits(max_answer_bytes=CAP, max_event_bytes=CAP)}
HUGE = 16 * CAP  # what a hostile engine sends: 4 MiB
NOT_SSE = b"<html>\n\n<body>502 Bad Gateway</body>\n\n</html>\n"
HOSTILE = [
    # (engine, its fault, streamed, the protocol error's kind)
    pytest.param("prefill-0", Faults(huge_body=HUGE), False, "too_large", id="prefill-too-large"),
    pytest.param("prefill-0", Faults(huge_body=HUGE), True, "too_large", id="prefill-too-large-stream"),
    pytest.param("decode-0", Faults(huge_body=HUGE), False, "too_large", id="json-too-large"),
    pytest.param("decode-0", Faults(endless_event=HUGE), True, "event_too_large", id="endless-event"),
    pytest.param("prefill-0", Faults(misframed=True), False, "framing", id="prefill-misframed"),
    pytest.param("decode-0", Faults(misframed=True), False, "framing", id="json-misframed"),
    pytest.param("decode-0", Faults(misframed=True), True, "framing", id="stream-misframed"),
    pytest.param("prefill-0", Faults(garbage=True), False, "unreadable", id="prefill-not-json"),
    # A 200 whose body is not what was asked for: not JSON, not SSE (an HTML page, as from a gateway in
    # front of the engine; the emulator's bad_answer not_json), or SSE-looking blocks that are no events.
    pytest.param("decode-0", Faults(garbage=True), False, "unreadable", id="json-not-json"),
    pytest.param("decode-0", Faults(garbage=True), True, "unreadable", id="stream-not-sse"),
    pytest.param("decode-0", Faults(not_sse=NOT_SSE), True, "unreadable", id="stream-bad-events"),
    pytest.param("decode-0", Faults(not_sse=b'data: {"id"'), True, "unreadable", id="stream-unended-event"),
    pytest.param("prefill-0", Faults(status=307), False, "status", id="prefill-redirects"),
    pytest.param("decode-0", Faults(status=302), True, "status", id="decode-redirects-stream"),
]


def peak_bytes_of(coro_fn: Any) -> Any:
    """Run an async callable under tracemalloc: (its result, the peak of what it allocated)."""
    import tracemalloc

    async def go() -> tuple[Any, int]:
        tracemalloc.start()
        try:
            result = await coro_fn()
            return result, tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    return go()


@pytest.mark.parametrize(("engine", "fault", "streamed", "kind"), HOSTILE)
def test_a_hostile_engine_is_an_engine_failure_retried_elsewhere_within_bounded_memory(
    engine: str, fault: Faults, streamed: bool, kind: str, tmp_path: Path
) -> None:
    """Before anything reached the client, an answer over its cap or unreadable is retried like a 5xx: the
    client gets its answer from another engine; the engine is out of routing, counted by kind. The proxy
    never holds much more than the cap, however much the engine sends."""
    fakes = FakeCluster(2, 2)
    fakes[engine].faults = fault

    async def go() -> tuple[ProxyOnFakes, int]:
        async with ProxyOnFakes(fakes, tmp_path, policy="round_robin", **FAST, **CAPS) as p:

            async def one() -> Answer:
                return await p.post(body(stream=streamed))

            answer, peak = await peak_bytes_of(one)
            assert answer.status == 200 and text_of(answer, streamed) == full_text(), answer.body[:300]
        return p, peak

    p, peak = run(go())
    (rec,) = settled(p, 1)
    assert rec.status is RequestStatus.OK and engine not in (rec.prefill_id, rec.decode_id)
    assert p.metric("calroute_engine_protocol_errors_total", engine=engine, kind=kind) == 1
    assert p.metric("calroute_engine_protocol_errors_total") == 1
    assert p.metric("calroute_engine_errors_total", engine=engine) == 1
    assert p.metric("calroute_retries_total", phase=engine.split("-")[0]) == 1
    assert not healthy(p)[engine]
    assert peak < 3 * CAP, peak


@pytest.mark.parametrize(("engine", "fault", "streamed", "kind"), HOSTILE)
def test_when_every_engine_is_hostile_the_client_gets_a_generic_502_and_the_record_the_details(
    engine: str, fault: Faults, streamed: bool, kind: str, tmp_path: Path
) -> None:
    fakes = FakeCluster(1, 1)
    fakes[engine].faults = fault

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path, **FAST, **CAPS) as p:
            answer = await p.post(body(stream=streamed))
            if streamed and engine.startswith("decode") and fault.status is None:
                # a stream whose head went out (with a 200 decode answer): an error event, then [DONE]
                assert answer.status == 200
                error, done = answer.events()
                assert done == "[DONE]"
            else:
                assert answer.status == 502
                error = answer.json()
            assert error["error"]["message"] == ENGINES_FAILED and error["error"]["code"] == 502
            assert not any(word in answer.body for word in LEAKS), answer.body
        return p

    p = run(go())
    (rec,) = settled(p, 1)
    assert rec.status is RequestStatus.FAILED and rec.error is not None
    assert rec.error.startswith(f"{engine.split('-')[0]} engine {engine}: ")
    assert p.metric("calroute_engine_protocol_errors_total", engine=engine, kind=kind) == 3  # every attempt


@pytest.mark.parametrize("bad", [NOT_SSE, b'data: {"id"'], ids=["not-sse", "unended-event"])
def test_a_stream_that_turns_unreadable_after_output_is_cut_off_cleanly(bad: bytes, tmp_path: Path) -> None:
    """Three tokens went out, then blocks that are no SSE events (or an event the stream never ends): the
    client gets the tokens, an error event and [DONE], never the bad bytes; the record says why."""
    fakes = FakeCluster(1, 2)
    fakes["decode-0"].faults = Faults(not_sse=bad, cut_after=3)

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path, policy="round_robin", **FAST) as p:
            answer = await p.post(body(max_tokens=20, stream=True))
            assert answer.status == 200
            events = answer.events()
            assert [e["choices"][0]["text"] for e in events[:3]] == [token(0), token(1), token(2)]
            assert events[3]["error"]["message"] == STREAM_BROKE and events[4:] == ["[DONE]"]
            assert answer.body.count(b"data: ") == 5 and b"html" not in answer.body  # nothing of ``bad``
        return p

    p = run(go())
    (rec,) = settled(p, 1)
    assert rec.status is RequestStatus.FAILED and rec.decode_id == "decode-0"
    assert "decode engine decode-0 broke off the stream: ProtocolError: " in (rec.error or "")
    assert p.metric("calroute_engine_protocol_errors_total", engine="decode-0", kind="unreadable") == 1
    assert p.metric("calroute_retries_total") == 0 and not healthy(p)["decode-0"]


def test_a_stream_over_its_event_cap_after_output_is_cut_off_cleanly(tmp_path: Path) -> None:
    """Three tokens went out, then an event without end: the client gets the tokens, an error event that
    names nothing, and [DONE]; the record says why; memory stays near the cap."""
    fakes = FakeCluster(1, 2)
    fakes["decode-0"].faults = Faults(endless_event=HUGE, cut_after=3)

    async def go() -> tuple[ProxyOnFakes, int]:
        async with ProxyOnFakes(fakes, tmp_path, policy="round_robin", **FAST, **CAPS) as p:

            async def one() -> Answer:
                return await p.post(body(max_tokens=20, stream=True))

            answer, peak = await peak_bytes_of(one)
            assert answer.status == 200
            events = answer.events()
            assert [e["choices"][0]["text"] for e in events[:3]] == [token(0), token(1), token(2)]
            assert events[3]["error"] == {
                "message": STREAM_BROKE,
                "type": "BadGateway",
                "param": None,
                "code": 502,
            }
            assert events[4:] == ["[DONE]"]
            assert b"xxxx" not in answer.body  # the event cut short is not sent on
        return p, peak

    p, peak = run(go())
    (rec,) = settled(p, 1)
    assert rec.status is RequestStatus.FAILED and rec.decode_id == "decode-0"
    assert "decode engine decode-0 broke off the stream: ProtocolError: an SSE event longer than" in (
        rec.error or ""
    )
    assert p.metric("calroute_engine_protocol_errors_total", engine="decode-0", kind="event_too_large") == 1
    assert p.metric("calroute_retries_total") == 0 and not healthy(p)["decode-0"]
    assert peak < 3 * CAP, peak


def test_a_request_that_would_carry_a_line_break_to_an_engine_is_never_sent(tmp_path: Path) -> None:
    """A header to engines with a line break in it (ProxyConfig refuses such an API key; here the proxy's
    engine headers are changed behind its back): the request cannot be sent to any engine. The proxy's own
    failure, a 500 that names nothing; no engine is blamed, none retried."""
    fakes = FakeCluster(1, 1)

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path, engine_api_key="key", **FAST) as p:
            p.proxy.generation._engine_headers = {"Authorization": "Bearer key\r\nX-Injected: 1"}
            answer = await p.post(body())
            assert answer.status == 500
            assert answer.json()["error"]["message"] == "the proxy could not send this request to an engine"
            assert b"X-Injected" not in answer.body and b"key" not in answer.body
        return p

    p = run(go())
    (rec,) = settled(p, 1)
    assert rec.status is RequestStatus.FAILED and (rec.error or "").startswith("not sent: ")
    assert not fakes.log  # no engine received anything
    assert p.metric("calroute_engine_errors_total") == 0 and all(healthy(p).values())


def test_only_a_valid_trace_context_reaches_the_engines(tmp_path: Path) -> None:
    fakes = FakeCluster(1, 1)
    good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

    async def go() -> None:
        async with ProxyOnFakes(fakes, tmp_path) as p:
            for headers in (
                {"traceparent": good, "tracestate": "congo=t61rcWkgMzE", "authorization": "Bearer c"},
                {"traceparent": good.upper(), "tracestate": "congo=t61rcWkgMzE"},
                {"traceparent": good, "tracestate": "no-equals-sign"},
            ):
                assert (await p.post(body(), headers=headers)).status == 200

    run(go())
    seen = [{k: v for k, v in s.headers.items() if k.startswith("trace")} for _, s in fakes.log]
    assert seen == [
        {"traceparent": good, "tracestate": "congo=t61rcWkgMzE"},
        {"traceparent": good, "tracestate": "congo=t61rcWkgMzE"},
        {},  # an invalid traceparent: neither goes on
        {},
        {"traceparent": good},  # an invalid tracestate alone is dropped
        {"traceparent": good},
    ]


# ---- hostile engines over a real socket, behind the proxy's own HTTP client ------------------------------


async def _request_of(r: asyncio.StreamReader) -> None:
    head = await r.readuntil(b"\r\n\r\n")
    await r.readexactly(int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0]))


async def flooding_prefill(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    """A prefill answer without end: 64 MiB of chunks, if it were read to the end."""
    flood = b"x" * (64 * 1024)
    await _request_of(r)
    w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    for _ in range(1024):
        w.write(b"%x\r\n%s\r\n" % (len(flood), flood))
        await w.drain()


async def misframing_decode(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    await _request_of(r)
    w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
    w.write(b"zz\r\n")  # not a chunk size
    await w.drain()
    await asyncio.sleep(1)


async def continuing_decode(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    """A 100 Continue, then the answer: an interim answer is skipped."""
    await _request_of(r)
    w.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    await w.drain()
    events = b"".join(stream_events(False, 8, 60, False))
    w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(events))
    w.write(events)
    await w.drain()


# Over a socket (uvloop: one loop turn can bring up to 32 reads of 64 KiB, and the hostile server runs in this
# process too), the proxy holds the cap plus about 1 MiB whatever the engine sends (64 MiB here).
SOCKET_CAP = 1024 * 1024
SOCKET_ENGINES = [
    # (engine, its server, streamed, client status, the protocol error's kind or None)
    pytest.param("prefill-0", flooding_prefill, False, 502, "too_large", id="prefill-without-end"),
    pytest.param("decode-0", misframing_decode, True, 200, "framing", id="decode-misframed"),
    pytest.param("decode-0", continuing_decode, True, 200, None, id="decode-100-continue"),
]


@pytest.mark.parametrize(("engine", "serve", "streamed", "status", "kind"), SOCKET_ENGINES)
def test_a_hostile_engine_over_a_socket(
    engine: str, serve: Any, streamed: bool, status: int, kind: str | None, tmp_path: Path
) -> None:
    fakes = FakeCluster(1, 1)

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            await serve(r, w)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            w.close()

    async def go() -> tuple[ProxyOnFakes, int]:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        real = {engine: Endpoint(url, 4.0)}
        try:
            caps = AnswerLimits(max_answer_bytes=SOCKET_CAP, max_event_bytes=SOCKET_CAP)
            async with ProxyOnFakes(fakes, tmp_path, engines=real, answer_limits=caps, **FAST) as p:

                async def one() -> Answer:
                    return await p.post(body(stream=streamed))

                answer, peak = await peak_bytes_of(one)
                assert answer.status == status
                if kind is None:
                    assert text_of(answer, streamed) == full_text()
                else:
                    error = answer.events()[0] if streamed else answer.json()
                    assert error["error"]["message"] == ENGINES_FAILED
                    assert not any(word in answer.body for word in LEAKS) and url.encode() not in answer.body
        finally:
            server.close()
        return p, peak

    p, peak = run(go())
    (rec,) = settled(p, 1)
    if kind is None:
        assert rec.status is RequestStatus.OK and rec.output_tokens == 0  # no usage asked of this engine
        return
    assert (
        rec.status is RequestStatus.FAILED
        and f"{engine.split('-')[0]} engine {engine}: ProtocolError" in (rec.error or "")
    )
    assert p.metric("calroute_engine_protocol_errors_total", engine=engine, kind=kind) == 3
    assert peak < 3 * SOCKET_CAP, peak
