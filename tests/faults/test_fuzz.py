"""Bad input, generated: whatever a client sends, the proxy answers with a status and a JSON body (a 4xx for
its own mistakes), never crashes, keeps serving, and logs every request it admitted exactly once."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calroute.cluster import launch
from calroute.cluster.file import ClusterFile
from calroute.proxy.config import ProxyConfig
from calroute.results.records import read_records
from calroute.types import RequestStatus
from tests.proxy.conftest import CAL
from tests.proxy.harness import RunningProxy

pytestmark = pytest.mark.faults

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=False), st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)

bodies = st.fixed_dictionaries(
    {"prompt": st.one_of(st.text(max_size=300), st.lists(st.integers(-5, 5000), max_size=50), json_values)},
    optional={
        "model": st.one_of(st.just("emulated"), json_scalars),
        "max_tokens": st.one_of(st.integers(-5, 3), st.integers(10**5, 10**7), json_scalars),
        "min_tokens": json_scalars,
        "stream": st.one_of(st.booleans(), json_scalars),
        "stream_options": json_values,
        "ignore_eos": json_scalars,
        "temperature": json_scalars,
        "kv_transfer_params": json_values,
        "n": st.integers(-1, 3),
        "extra": json_values,
    },
)
chat_bodies = st.fixed_dictionaries(
    {
        "messages": st.one_of(
            st.lists(
                st.fixed_dictionaries(
                    {"role": st.text(max_size=8), "content": st.one_of(st.text(max_size=100), json_values)}
                ),
                max_size=3,
            ),
            json_values,
        )
    },
    optional={"max_tokens": st.one_of(st.integers(1, 4), json_scalars), "stream": st.booleans()},
)
headers = st.dictionaries(
    st.sampled_from(
        ["x-calroute-slo", "x-llm-d-slo-ttft-ms", "x-llm-d-slo-tpot-ms", "authorization", "x-whatever"]
    ),
    st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=20),
    max_size=3,
)

# ---- hostile bodies: each class of bad input the proxy must refuse as the client's error ----------------

MODEL = "emulated"
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
huge_ints = st.one_of(
    st.integers(2**63 - 2, 2**63 + 2),
    st.integers(2**64 - 2, 2**64 + 2),
    st.integers(2**64, 2**200),
    st.integers(-(2**200), -(2**63) + 2),
)
nonfinite = st.sampled_from([float("nan"), float("inf"), float("-inf")])  # json.dumps writes NaN, Infinity
any_value = st.one_of(json_values, huge_ints, nonfinite)
not_none = any_value.filter(lambda v: v is not None)
# A token limit that is either refused or at most 4 tokens: a served request stays short (a chat request
# without a limit would decode the rest of the context).
limits = st.one_of(
    st.integers(-2, 4),
    st.integers(10**5, 10**7),
    huge_ints,
    not_none.filter(lambda v: not isinstance(v, int) or isinstance(v, bool)),
)
parts = st.lists(
    st.one_of(
        st.fixed_dictionaries({"type": st.just("text"), "text": st.one_of(st.text(max_size=20), any_value)}),
        st.fixed_dictionaries({"type": any_value}, optional={"text": any_value}),
        any_value,
    ),
    max_size=3,
)
messages = st.lists(
    st.one_of(
        st.fixed_dictionaries(
            {"role": st.one_of(st.sampled_from(["user", "system"]), any_value)},
            optional={"content": st.one_of(st.text(max_size=40), parts, any_value)},
        ),
        any_value,
    ),
    max_size=3,
)
# Every field the proxy reads, each with right and wrong types.
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "prompt": st.one_of(
        st.text(max_size=40),
        st.lists(st.integers(0, 5000), max_size=8),
        st.lists(st.text(max_size=8), max_size=2),
        st.lists(st.lists(st.integers(0, 5000), max_size=4), max_size=2),
        st.lists(st.one_of(st.booleans(), huge_ints, st.integers(0, 9)), max_size=3),
        any_value,
    ),
    "messages": st.one_of(messages, any_value),
    "max_tokens": limits,
    "max_completion_tokens": limits,
    "min_tokens": st.one_of(st.integers(-2, 2), not_none),
    "min_completion_tokens": st.one_of(st.integers(-2, 2), not_none),
    "n": st.one_of(st.integers(-1, 2), not_none),
    "stream": st.one_of(st.booleans(), any_value),
    "stream_options": st.one_of(
        st.fixed_dictionaries({}, optional={"include_usage": any_value, "continuous_usage_stats": any_value}),
        any_value,
    ),
    "ignore_eos": st.one_of(st.booleans(), any_value),
    "model": st.one_of(st.just(MODEL), any_value),
}


def encode(pairs: list[tuple[str, Any]]) -> bytes:
    """A JSON object written pair by pair: keys may repeat (the last one counts), NaN and Infinity are
    written as Python's json writes them (not JSON)."""
    return ("{" + ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in pairs) + "}").encode()


def base(chat: bool) -> list[tuple[str, Any]]:
    return [
        ("model", MODEL),
        ("messages" if chat else "prompt", [{"role": "user", "content": "hi"}] if chat else "hi"),
        ("max_tokens", 2),
    ]


@st.composite
def typed(draw: st.DrawFn) -> tuple[str, bytes]:
    """The read fields with wrong types (or right ones), huge integers, NaN and Infinity, in any order,
    some of them twice."""
    chat = draw(st.booleans())
    keys = draw(st.lists(st.sampled_from(sorted(FIELDS)), min_size=1, max_size=5))
    return (CHAT if chat else COMPLETIONS), encode(base(chat) + [(k, draw(FIELDS[k])) for k in keys])


@st.composite
def deep(draw: st.DrawFn) -> tuple[str, bytes]:
    """Arrays or objects nested up to past orjson's reading limit (1024), in any field."""
    chat = draw(st.booleans())
    depth = draw(st.one_of(st.integers(1, 1100), st.integers(250, 258)))
    key = draw(st.sampled_from(["extra", "prompt", "messages", "stream_options", "model", "max_tokens"]))
    if draw(st.booleans()):
        nested = "[" * depth + "]" * depth
    else:
        nested = '{"a":' * depth + "1" + "}" * depth
    head = encode(base(chat))[:-1]
    return (CHAT if chat else COMPLETIONS), head + f',"{key}":{nested}}}'.encode()


def _utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


@st.composite
def not_utf8(draw: st.DrawFn) -> tuple[str, bytes]:
    """Bytes that are not UTF-8 in a string, a key, or between two values."""
    bad = draw(st.binary(min_size=1, max_size=4).filter(lambda b: not _utf8(b)))
    where = draw(
        st.sampled_from(
            [
                b'{"prompt": "a%s", "max_tokens": 2}',
                b'{"%s": 1, "prompt": "a"}',
                b'{"prompt": "a",%s "max_tokens": 2}',
            ]
        )
    )
    return COMPLETIONS, where.replace(b"%s", bad)


hostile = st.one_of(typed(), deep(), not_utf8())


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningProxy, ClusterFile]]:
    tmp = tmp_path_factory.mktemp("fuzz")
    launched = launch.up_emulated(1, 1, tmp / "engines")
    p = RunningProxy(ProxyConfig(cluster=launched.file, calibration=CAL, log_path=tmp / "log.jsonl"))
    try:
        yield p, launched.file
    finally:
        p.stop()
        launched.stop()


def send(url: str, data: bytes, hdrs: dict[str, str]) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **hdrs})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def check(p: RunningProxy, path: str, data: bytes, hdrs: dict[str, str]) -> int:
    """Send one body: the answer is below 500 (a JSON error when it is one), and the request ends in
    exactly one record, the client's error (``rejected``) for a 4xx, never "client disconnected"."""
    writer = p.proxy.generation.writer
    assert writer is not None
    before = writer.count
    status, payload = send(p.url + path, data, hdrs)
    assert status < 500, (status, payload[:300], data[:300])
    if status >= 400:
        assert "error" in json.loads(payload)
    if status == 413:  # refused by the server before the body was whole: never reached a route
        assert writer.count == before
        return status
    assert writer.count == before + 1, (status, data[:300])
    assert p.proxy.cfg.log_path is not None
    *_, rec = read_records(p.proxy.cfg.log_path)
    expected = RequestStatus.OK if status == 200 else RequestStatus.REJECTED
    assert rec.status is expected and rec.error != "client disconnected", (status, rec, data[:300])
    return status


def count_records(path: Path | None) -> int:
    assert path is not None
    return sum(1 for _ in read_records(path)) if path.exists() else 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.one_of(bodies, chat_bodies), hdrs=headers)
def test_any_json_body(
    proxy: tuple[RunningProxy, ClusterFile], body: dict[str, Any], hdrs: dict[str, str]
) -> None:
    p, _ = proxy
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    if isinstance(body.get("max_tokens"), int) and 1 <= body["max_tokens"] <= 3 and "messages" in body:
        body = {**body, "ignore_eos": True}
    if "messages" in body and body.get("max_tokens") is None:
        # vLLM's chat default is the rest of the context (32k tokens here): minutes of decode, not a fuzz case
        body = {**body, "max_tokens": 4}
    check(p, path, json.dumps(body).encode(), hdrs)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sent=hostile)
def test_hostile_bodies(proxy: tuple[RunningProxy, ClusterFile], sent: tuple[str, bytes]) -> None:
    """Deep nesting, wrong types in chat parts and in every field read, huge integers, NaN and Infinity,
    duplicate keys, bytes that are not UTF-8."""
    p, _ = proxy
    check(p, *sent, {})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=400))
def test_any_bytes(proxy: tuple[RunningProxy, ClusterFile], raw: bytes) -> None:
    p, _ = proxy
    check(p, "/v1/completions", raw, {})


def test_invalid_utf8_huge_prompts_and_oversized_bodies(proxy: tuple[RunningProxy, ClusterFile]) -> None:
    p, c = proxy
    assert send(p.url + "/v1/completions", b'{"prompt": "\xff\xfe\xfd"}', {})[0] == 400
    huge = json.dumps({"prompt": "word " * 200_000, "max_tokens": 1}).encode()  # ~1 MB, over max_model_len
    status, payload = send(p.url + "/v1/completions", huge, {})
    assert status == 400 and b"maximum context length" in payload
    assert send(p.url + "/v1/completions", b'{"prompt": "' + b"a" * (9 << 20) + b'"}', {})[0] == 413
    assert (
        send(p.url + "/v1/completions", json.dumps({"prompt": "ok", "max_tokens": 2}).encode(), {})[0] == 200
    )


def test_every_admitted_request_is_logged_exactly_once(proxy: tuple[RunningProxy, ClusterFile]) -> None:
    """Runs after the fuzzing above: each record in the log has a distinct id, and a terminal status."""
    p, _ = proxy
    recs = list(read_records(p.proxy.cfg.log_path)) if p.proxy.cfg.log_path else []
    assert recs and len({r.request_id for r in recs}) == len(recs)
    assert p.proxy.ledger.in_flight_requests() == 0
