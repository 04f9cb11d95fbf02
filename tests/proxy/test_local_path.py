"""The local path (RouteDecision.local, generate.py): a decode engine that prefills the prompt itself.

The decode engine gets the client's body as the remote path's decode leg would, without kv_transfer_params:
no prefill engine hears of the request, the answer is relayed as any decode's, and the record says local,
with the policy's reason, the first token's time as the prefill's end, and the cached tokens the decode
engine reported against those the router predicted. On emulated engines (their prefix caches and KV events)
and on in-memory fakes (faults: a local attempt failed before its first byte is retried on either path, a
stream broken off mid-way ends in one failed record).

The policy is a tiny one of the tests' own, registered for the test (``keep_local``): local on decode-0 while
it is healthy, else disaggregated.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest

from calroute.aio import run
from calroute.cluster import launch
from calroute.cluster.file import ClusterFile
from calroute.contract.handoff import decode_body
from calroute.policies import POLICIES, Registered
from calroute.policies.base import healthy
from calroute.proxy.generate import REQUEST_ID_HEADER
from calroute.proxy.prefix import CACHED_TOKENS_HEADER
from calroute.results.records import RequestRecord
from calroute.types import Admission, ClusterView, RequestStatus, RouteDecision, local_decision
from tests.emulator.http import metric, request, stream
from tests.proxy.fakes import FAST, MODEL, FakeCluster, Faults, ProxyOnFakes, token
from tests.proxy.harness import RunningProxy
from tests.proxy.test_generate import CHAT, PROMPT, full_text, settled, text_of
from tests.proxy.test_proxy import records, wait_for

HOME = "home"  # the policy's reasons: local on its home engine, or away from it
AWAY = "away"


@dataclass(frozen=True)
class KeepLocalParams:
    home: str = "decode-0"


class KeepLocal:
    """Local on decode engine ``home`` while it is healthy (reason "home"); else disaggregated on the first
    healthy engine of each pool (reason "away")."""

    name: ClassVar[str] = "keep_local"
    reads_engine_samples: ClassVar[bool] = False

    def __init__(self, params: KeepLocalParams) -> None:
        self.params = params

    def route(self, adm: Admission, view: ClusterView) -> RouteDecision:
        dec = healthy(view.decode, "decode")
        if any(s.instance_id == self.params.home for s in dec):
            return local_decision(self.params.home, HOME)
        return RouteDecision(healthy(view.prefill, "prefill")[0].instance_id, dec[0].instance_id, reason=AWAY)


@pytest.fixture
def keep_local(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The test policy, registered for one test: its name."""
    monkeypatch.setitem(POLICIES, KeepLocal.name, Registered(KeepLocal, KeepLocalParams))
    yield KeepLocal.name


def is_local(rec: RequestRecord, engine: str = "decode-0") -> bool:
    """A request's record: decode engine ``engine`` prefilled it, the prefill ending at its first token."""
    return (
        rec.local_prefill
        and rec.path_reason == HOME
        and rec.prefill_id == rec.decode_id == engine
        and rec.prefill_done_s is not None
        and rec.prefill_done_s == rec.first_token_s
    )


# ---- on emulated engines ------------------------------------------------------------------------------


def completion(**kw: Any) -> dict[str, Any]:
    return {"model": "emulated", "prompt": PROMPT, "max_tokens": 10, "ignore_eos": True, **kw}


def chat_body(**kw: Any) -> dict[str, Any]:
    return {"model": "emulated", "messages": CHAT, "max_tokens": 6, "ignore_eos": True, **kw}


def texts(answer: Any, chat: bool) -> str:
    """The answer's text, whole (a dict) or streamed (its events, [DONE] last)."""
    if isinstance(answer, dict):
        choice = answer["choices"][0]
        return str(choice["message"]["content"] if chat else choice["text"])
    assert answer[-1] == "[DONE]"
    return "".join(
        str(c["delta"].get("content", "") if chat else c["text"]) for e in answer[:-1] for c in e["choices"]
    )


def test_a_local_request_is_served_by_its_decode_engine_alone(
    cluster: ClusterFile, proxy_for: Callable[..., RunningProxy], keep_local: str
) -> None:
    """Completions and chat, whole and streamed: the answers are the decode engine's own, the prefill
    engines receive nothing, the records say local and why, /metrics counts the decisions by path."""
    home = cluster.decode[0].url
    prefill_before = [metric(e.url, "vllm:generation_tokens_total") for e in cluster.prefill]
    p = proxy_for(cluster, policy=keep_local)
    cases = [
        ("/v1/completions", completion(), False),
        ("/v1/completions", completion(stream=True), False),
        ("/v1/chat/completions", chat_body(), True),
        ("/v1/chat/completions", chat_body(stream=True, stream_options={"include_usage": True}), True),
    ]
    for path, client, chat in cases:
        whole = {k: v for k, v in client.items() if k not in ("stream", "stream_options")}
        _, direct = request(f"{home}{path}", whole)
        if client.get("stream"):
            status, events = stream(f"{p.url}{path}", client)
            usage = [e for e in events[:-1] if "usage" in e]
            # the usage event only where the client asked for it (the proxy asked for it either way)
            assert len(usage) == bool(client.get("stream_options"))
            via: Any = events
        else:
            status, via = request(f"{p.url}{path}", client)
        assert status == 200 and texts(via, chat) == texts(direct, chat) != ""
    wait_for(lambda: len(records(p)) == 4)
    recs = records(p)
    assert all(r.status is RequestStatus.OK and is_local(r) for r in recs), recs
    assert [r.output_tokens for r in recs] == [10, 10, 6, 6]
    assert [metric(e.url, "vllm:generation_tokens_total") for e in cluster.prefill] == prefill_before
    assert metric(p.url, 'calroute_route_path_total{path="local",policy="keep_local",reason="home"}') == 4
    assert metric(p.url, "calroute_route_path_total") == 4
    decisions = p.proxy.cfg.decision_log_path
    assert decisions is not None and decisions.read_text().count('"local":true,"reason":"home"') == 4


@pytest.fixture
def event_cluster(tmp_path: Path) -> Iterator[ClusterFile]:
    launched = launch.up_emulated(1, 2, tmp_path / "engines", kv_events=True)
    try:
        yield launched.file
    finally:
        launched.stop()


def test_a_conversations_next_turn_hits_the_decode_engines_cache_as_the_router_predicted(
    event_cluster: ClusterFile, proxy_for: Callable[..., RunningProxy], keep_local: str
) -> None:
    """A first turn prefilled locally on decode-0; its KV events tell the router's index what decode-0 holds,
    the prompt and the answer alike; the second turn, the first's prompt and answer and a new question, goes
    there too, and decode-0 serves from its cache the blocks the router predicted, and says so in its usage
    (prompt_tokens_details.cached_tokens). Token-id prompts: the emulator's text of an answer does not
    tokenize back to the answer's ids."""
    c = event_cluster
    p = proxy_for(c, policy=keep_local, prefix_index=True)
    subscriber, index = p.proxy.kv_events, p.proxy.prefix
    assert subscriber is not None and index is not None
    wait_for(lambda: all(subscriber.is_live(e.id) for e in c.engines), timeout_s=10)
    time.sleep(0.3)  # PUB/SUB: the subscriptions reach the engines just after the connections
    question = [100 + (i * 37) % 3000 for i in range(200)]  # 12 full blocks and 8 tokens
    status, first = request(
        f"{p.url}/v1/completions",
        completion(prompt=question, max_tokens=40, return_token_ids=True),
    )
    assert status == 200
    wait_for(lambda: len(records(p)) == 1)
    one = records(p)[0]
    assert is_local(one) and one.cached_tokens == 0 and one.predicted_cached_tokens == 0
    # decode-0 computed 239 tokens (the last answer token is sampled, never fed back): 14 full blocks, the
    # prompt's 12 and 2 of prompt and answer, which its BlockStored events name (its placement by the
    # router does not count: a live engine's events do)
    wait_for(lambda: index.blocks_held("decode-0") >= 14, timeout_s=10)
    follow_up = question + first["choices"][0]["token_ids"] + [2000 + i for i in range(30)]
    status, events = stream(
        f"{p.url}/v1/completions",
        completion(prompt=follow_up, max_tokens=4, stream=True, stream_options={"include_usage": True}),
    )
    assert status == 200 and events[-1] == "[DONE]"
    wait_for(lambda: len(records(p)) == 2)
    two = records(p)[1]
    assert is_local(two) and two.status is RequestStatus.OK and two.prompt_tokens == 270
    assert two.predicted_cached_tokens == 14 * 16 == two.cached_tokens
    assert events[-2]["usage"]["prompt_tokens_details"] == {"cached_tokens": two.cached_tokens}
    assert metric(p.url, "calroute_prefix_cached_tokens_total") == two.cached_tokens
    assert metric(p.url, "calroute_prefix_predicted_cached_tokens_total") == two.cached_tokens
    assert metric(c.prefill[0].url, "vllm:generation_tokens_total") == 0


# ---- on fakes: the body, the failures -----------------------------------------------------------------

BODIES = [
    pytest.param("/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 8}, id="completions"),
    pytest.param(
        "/v1/completions",
        {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 8, "min_tokens": 2, "stream": True},
        id="token-ids-stream",
    ),
    pytest.param(
        "/v1/chat/completions",
        {"model": MODEL, "messages": CHAT, "max_completion_tokens": 8, "kv_transfer_params": {"a": 1}},
        id="chat-client-kv-dropped",
    ),
    pytest.param(
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": CHAT,
            "max_tokens": 8,
            "stream": True,
            "stream_options": {"include_usage": False, "continuous_usage_stats": False},
        },
        id="chat-stream-options-kept",
    ),
]


@pytest.mark.parametrize(("path", "client"), BODIES)
def test_a_local_request_reaches_its_decode_engine_as_the_client_sent_it(
    path: str, client: dict[str, Any], tmp_path: Path, keep_local: str
) -> None:
    """The client's body, without kv_transfer_params (a client's are never passed on), and on a stream
    usage asked for (the proxy counts the tokens; the client gets the usage event only if it asked): no
    max_tokens=1 step, no prefill engine. The stream's head carries no cached-tokens header: the decode
    engine says what it served from its cache only at the end."""
    fakes = FakeCluster(2, 2)

    ids = []

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path, policy=keep_local) as p:
            answer = await p.post(client, path)
            assert answer.status == 200 and text_of(answer, bool(client.get("stream")), "chat" in path)
            assert CACHED_TOKENS_HEADER not in answer.headers
            ids.append(answer.headers[REQUEST_ID_HEADER.lower()])
        return p

    p = run(go())
    (rec,) = settled(p, 1)
    assert rec.status is RequestStatus.OK and is_local(rec) and rec.output_tokens == 8
    assert ids == [rec.request_id]  # the answer names the record it is filed under
    ((engine, sent),) = fakes.sent(rec.request_id)
    assert engine == "decode-0" and sent.path == path
    assert sent.body == decode_body(client, None) and "kv_transfer_params" not in sent.body
    if client.get("stream"):
        assert sent.body["stream_options"] == {**client.get("stream_options", {}), "include_usage": True}
    else:
        assert sent.body == {k: v for k, v in client.items() if k != "kv_transfer_params"}
    assert sent.headers == {"X-Request-Id": rec.request_id}
    assert p.metric("calroute_route_path_total", path="local", reason=HOME) == 1
    assert p.metric("calroute_route_path_total", path="remote") == 0


LOCAL_FAULTS = [
    pytest.param(Faults(status=500), False, id="500"),
    pytest.param(Faults(status=503), True, id="503-stream"),
    pytest.param(Faults(refuse=True), False, id="refused"),
    pytest.param(Faults(refuse=True), True, id="refused-stream"),
    pytest.param(Faults(stall=True), False, id="stalled"),
    pytest.param(Faults(stall=True), True, id="stalled-stream"),  # its head went out, as from vLLM
    pytest.param(Faults(empty=True), True, id="empty-stream"),
    pytest.param(Faults(garbage=True), False, id="not-json"),
    pytest.param(Faults(garbage=True), True, id="not-sse"),
]


@pytest.mark.parametrize(("fault", "streamed"), LOCAL_FAULTS)
def test_a_local_attempt_that_fails_before_its_first_byte_is_retried_on_the_other_path(
    fault: Faults, streamed: bool, tmp_path: Path, keep_local: str
) -> None:
    """decode-0 fails the local attempt before any output: out of routing, and the router decides again,
    now disaggregated (prefill-0, then decode-1). One record, ok, saying the path that served it."""
    fakes = FakeCluster(2, 2)
    fakes["decode-0"].faults = fault

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path, policy=keep_local, **FAST) as p:
            answer = await p.post(completion(max_tokens=8, stream=streamed))
            assert answer.status == 200 and text_of(answer, streamed) == full_text(), answer.body
            assert answer.body.count(b"HTTP/1.1") == 0  # one response, whatever went before
        return p

    p = run(go())
    (rec,) = settled(p, 1)
    assert rec.status is RequestStatus.OK and rec.output_tokens == 8
    assert not rec.local_prefill and rec.path_reason == AWAY
    assert (rec.prefill_id, rec.decode_id) == ("prefill-0", "decode-1")
    sent = fakes.sent(rec.request_id)
    assert [e for e, _ in sent] == ["decode-0", "prefill-0", "decode-1"]
    assert "kv_transfer_params" not in sent[0][1].body
    # its silence bound holds the prefill too (a JSON answer's grows with the tokens asked for besides)
    bound = FAST["stall_timeout_s"] + FAST["prefill_timeout_s"]
    timeout_s = sent[0][1].read_timeout_s
    assert timeout_s == pytest.approx(bound) if streamed else timeout_s > bound
    assert p.metric("calroute_retries_total", phase="local") == 1
    assert p.metric("calroute_retries_total") == 1
    assert p.metric("calroute_engine_errors_total", engine="decode-0") == 1
    assert p.metric("calroute_route_path_total", path="local", reason=HOME) == 1
    assert p.metric("calroute_route_path_total", path="remote", reason=AWAY) == 1
    assert not p.proxy.signals.healthy["decode-0"]


def test_a_local_attempt_failing_everywhere_ends_in_one_failed_record(
    tmp_path: Path, keep_local: str
) -> None:
    fakes = FakeCluster(1, 1)
    fakes["decode-0"].faults = Faults(status=500)

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path, policy=keep_local, max_attempts=2, **FAST) as p:
            assert (await p.post(completion())).status == 502
        return p

    p = run(go())
    (rec,) = settled(p, 1)
    # decode-0 is the only decode engine: out of routing, yet tried again (panic mode), local again
    assert rec.status is RequestStatus.FAILED and rec.local_prefill
    assert rec.error == "decode engine decode-0 (local prefill): HTTP 500"
    assert [e for e, _ in fakes.sent(rec.request_id)] == ["decode-0", "decode-0"]
    assert p.metric("calroute_retries_total", phase="local") == 2


def test_a_local_stream_broken_off_mid_way_ends_in_one_failed_record(tmp_path: Path, keep_local: str) -> None:
    """Tokens went out: no retry. The tokens so far, an error event, [DONE]; one record, failed, local,
    whose prefill ended with its first token."""
    fakes = FakeCluster(1, 2)
    fakes["decode-0"].faults = Faults(cut_after=3, token_interval_s=0.01)

    async def go() -> ProxyOnFakes:
        async with ProxyOnFakes(fakes, tmp_path, policy=keep_local, **FAST) as p:
            answer = await p.post(completion(max_tokens=2000, stream=True))
            assert answer.status == 200
            events = answer.events()
            assert [e["choices"][0]["text"] for e in events[:3]] == [token(0), token(1), token(2)]
            assert events[3]["error"]["code"] == 502 and events[4:] == ["[DONE]"]
        return p

    p = run(go())
    (rec,) = settled(p, 1)
    assert rec.status is RequestStatus.FAILED and rec.local_prefill and rec.path_reason == HOME
    assert rec.prefill_id == rec.decode_id == "decode-0"
    assert rec.first_token_s is not None and rec.prefill_done_s == rec.first_token_s
    assert "broke off the stream" in (rec.error or "")
    assert p.metric("calroute_retries_total") == 0
    assert p.metric("calroute_engine_errors_total", engine="decode-0") == 1
    assert [e for e, _ in fakes.sent(rec.request_id)] == ["decode-0"]
