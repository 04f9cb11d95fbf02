"""The proxy end to end on real vLLM engines (1 prefill + 1 decode, NIXL KV transfer)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from calroute.cluster import ClusterFile
from calroute.engines import launch, vllm
from calroute.proxy.app import ProxyConfig
from calroute.records import read_records
from calroute.types import RequestStatus
from tests.engines.http import metric, request, stream
from tests.proxy.conftest import CAL
from tests.proxy.harness import RunningProxy

REPO = Path(__file__).resolve().parents[2]
PROMPT = "".join(f"def handler_{i}(request):\n    return respond(request, {i})\n" for i in range(12))


@pytest.fixture(scope="module")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterFile]:
    venv, model = vllm.default_vllm_paths(REPO)
    if not vllm.vllm_available(venv, model):
        pytest.fail("real vLLM is not installed: run `make vllm` (make test does it)")
    launched = launch.up_vllm(1, 1, tmp_path_factory.mktemp("vllm"), repo_root=REPO)
    try:
        yield launched.file
    finally:
        launched.stop()


def test_proxy_on_real_vllm(real_cluster: ClusterFile, tmp_path: Path) -> None:
    c = real_cluster
    body = {"model": c.model, "prompt": PROMPT, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    _, direct = request(f"{c.decode[0].url}/v1/completions", body)
    with RunningProxy(ProxyConfig(cluster=c, calibration=CAL, log_path=tmp_path / "log.jsonl")) as p:
        status, via = request(f"{p.url}/v1/completions", body)
        assert status == 200 and via["choices"][0]["text"] == direct["choices"][0]["text"]
        status, events = stream(
            f"{p.url}/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}}
        )
        assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] == 24
        assert "".join(e["choices"][0]["text"] for e in events[:-2]) == direct["choices"][0]["text"]
        # the decode engine really received the prompt's KV from the prefill engine over NIXL
        assert (
            metric(
                c.decode[0].url,
                'vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny",'
                'source="external_kv_transfer"}',
            )
            > 0
        )
        chat = {
            "model": c.model,
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 8,
            "temperature": 0,
            "ignore_eos": True,
        }
        _, direct_chat = request(f"{c.decode[0].url}/v1/chat/completions", chat)
        _, via_chat = request(f"{p.url}/v1/chat/completions", chat)
        assert via_chat["choices"][0]["message"]["content"] == direct_chat["choices"][0]["message"]["content"]
        assert request(f"{p.url}/v1/completions", {**body, "max_tokens": 10**6})[0] == 400
    recs = list(read_records(tmp_path / "log.jsonl"))
    assert [r.status for r in recs] == [RequestStatus.OK] * 3
    assert all(r.prefill_id == "prefill-0" and r.decode_id == "decode-0" for r in recs)
    assert all(r.first_token_s is not None and r.prefill_done_s is not None for r in recs)
