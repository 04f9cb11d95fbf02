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

from calroute.engines import launch
from calroute.engines.cluster import ClusterFile
from calroute.proxy.config import ProxyConfig
from calroute.results.records import read_records
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


def check(status: int, payload: bytes) -> bool:
    """True when the request was admitted (it then owes one record)."""
    assert status < 500, (status, payload[:300])
    if status >= 400:
        assert "error" in json.loads(payload)
        return status != 400 or b'"param": "body' in payload or b'"param":"body' in payload  # engine's 400
    return True


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
    status, payload = send(p.url + path, json.dumps(body).encode(), hdrs)
    check(status, payload)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=400))
def test_any_bytes(proxy: tuple[RunningProxy, ClusterFile], raw: bytes) -> None:
    p, _ = proxy
    status, payload = send(p.url + "/v1/completions", raw, {})
    assert status < 500 and "error" in json.loads(payload) or status == 200


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
