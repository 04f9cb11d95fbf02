"""The compatibility suite: what routers and benchmarks rely on, checked on emulated and real vLLM engines.

Whatever differs between the two is a bug in the emulator.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from calroute.cluster.file import ClusterFile
from tests.emulator.http import metric, request, stream

PROMPT = (
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"
)
LONG_PROMPT = "".join(
    f"def handler_{i}(request, context):\n    return process(request, {i}, context)\n" for i in range(24)
)


def body(c: ClusterFile, **kw: Any) -> dict[str, Any]:
    return {"model": c.model, "prompt": PROMPT, "temperature": 0, "ignore_eos": True, "max_tokens": 16, **kw}


def test_health_and_models(cluster: ClusterFile) -> None:
    for e in cluster.engines:
        assert request(f"{e.url}/health")[0] == 200
        status, models = request(f"{e.url}/v1/models")
        assert status == 200
        (m,) = models["data"]
        assert m["id"] == cluster.model and m["object"] == "model"
        assert m["max_model_len"] == cluster.max_model_len


@pytest.mark.parametrize("n", [1, 7, 33])
def test_token_count_contract(cluster: ClusterFile, n: int) -> None:
    url = f"{cluster.decode[0].url}/v1/completions"
    status, out = request(url, body(cluster, max_tokens=n, return_token_ids=True))
    assert status == 200, out
    assert out["usage"]["completion_tokens"] == n
    assert len(out["choices"][0]["token_ids"]) == n
    assert out["choices"][0]["finish_reason"] == "length"
    status, events = stream(
        url, body(cluster, max_tokens=n, stream=True, stream_options={"include_usage": True})
    )
    assert events[-1] == "[DONE]"
    assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == n


def test_greedy_output_is_identical_on_every_engine(cluster: ClusterFile) -> None:
    outs = []
    for e in cluster.engines:
        status, out = request(f"{e.url}/v1/completions", body(cluster, max_tokens=24, return_token_ids=True))
        assert status == 200, out
        outs.append((out["choices"][0]["text"], out["choices"][0]["token_ids"]))
    assert len(outs) >= 2 and all(o == outs[0] for o in outs)


def test_prefill_decode_handoff(cluster: ClusterFile) -> None:
    p, d = cluster.prefill[0], cluster.decode[0]
    status, pre = request(
        f"{p.url}/v1/completions",
        body(cluster, prompt=LONG_PROMPT, max_tokens=1, kv_transfer_params={"do_remote_decode": True}),
    )
    assert status == 200, pre
    kv = pre["kv_transfer_params"]
    assert kv["do_remote_prefill"] is True and kv["do_remote_decode"] is False
    for key in ("remote_engine_id", "remote_request_id", "remote_block_ids", "remote_host", "remote_port"):
        assert kv.get(key) not in (None, "", []), key
    # the prefill engine holds the prompt's blocks until the decode engine pulls them
    assert metric(p.url, "vllm:kv_cache_usage_perc") > 0
    status, events = stream(
        f"{d.url}/v1/completions",
        body(
            cluster,
            prompt=LONG_PROMPT,
            max_tokens=20,
            stream=True,
            kv_transfer_params=kv,
            stream_options={"include_usage": True},
        ),
    )
    assert status == 200
    text = "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"])
    assert events[-2]["usage"]["completion_tokens"] == 20
    _, direct = request(f"{d.url}/v1/completions", body(cluster, prompt=LONG_PROMPT, max_tokens=20))
    assert text == direct["choices"][0]["text"]
    deadline = time.monotonic() + 10
    while metric(p.url, "vllm:kv_cache_usage_perc") > 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert metric(p.url, "vllm:kv_cache_usage_perc") == 0


def test_reused_transfer_params_still_answer(cluster: ClusterFile) -> None:
    """vLLM's decode side does not refuse stale or reused params (only the prefill side logs an error)."""
    p, d = cluster.prefill[0], cluster.decode[0]
    _, pre = request(
        f"{p.url}/v1/completions", body(cluster, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
    )
    kv = pre["kv_transfer_params"]
    first = request(f"{d.url}/v1/completions", body(cluster, kv_transfer_params=kv))
    second = request(f"{d.url}/v1/completions", body(cluster, kv_transfer_params=kv))
    assert first[0] == 200 and second[0] == 200
    assert second[1]["usage"]["completion_tokens"] == 16


def test_vllm_metric_names(cluster: ClusterFile) -> None:
    request(f"{cluster.decode[0].url}/v1/completions", body(cluster))
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:generation_tokens_total",
    ):
        metric(cluster.decode[0].url, name)


def test_prefix_cache_reset(cluster: ClusterFile) -> None:
    url = cluster.decode[-1].url
    req = body(cluster, prompt=LONG_PROMPT + "# reset test\n", max_tokens=2)
    request(f"{url}/v1/completions", req)
    before = metric(url, "vllm:prefix_cache_hits_total")
    request(f"{url}/v1/completions", req)
    assert metric(url, "vllm:prefix_cache_hits_total") > before  # the repeated prompt hits the cache
    status, _ = request(f"{url}/reset_prefix_cache", {})
    assert status == 200
    after_reset = metric(url, "vllm:prefix_cache_hits_total")
    request(f"{url}/v1/completions", req)
    assert metric(url, "vllm:prefix_cache_hits_total") == after_reset


def test_chat_streaming_with_usage(cluster: ClusterFile) -> None:
    url = f"{cluster.decode[0].url}/v1/chat/completions"
    req = {
        "model": cluster.model,
        "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": 9,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    status, events = stream(url, req)
    assert status == 200 and events[-1] == "[DONE]"
    assert events[0]["object"] == "chat.completion.chunk"
    assert events[0]["choices"][0]["delta"].get("role") == "assistant"
    usage = events[-2]["usage"]
    assert usage["completion_tokens"] == 9 and usage["prompt_tokens"] > 0
    streamed = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-2] if e["choices"])
    _, full = request(url, {**req, "stream": False, "stream_options": None})
    assert full["choices"][0]["message"]["content"] == streamed


def test_tokenize_counts_match_usage(cluster: ClusterFile) -> None:
    e = cluster.decode[0]
    status, tok = request(f"{e.url}/tokenize", {"model": cluster.model, "prompt": PROMPT})
    assert status == 200 and tok["count"] == len(tok["tokens"])
    _, out = request(f"{e.url}/v1/completions", body(cluster, max_tokens=1))
    assert out["usage"]["prompt_tokens"] == tok["count"]
    # a prompt given as token ids is taken as is
    _, ids_out = request(f"{e.url}/v1/completions", body(cluster, prompt=tok["tokens"], max_tokens=5))
    _, text_out = request(f"{e.url}/v1/completions", body(cluster, max_tokens=5))
    assert ids_out["choices"][0]["text"] == text_out["choices"][0]["text"]


@pytest.mark.parametrize(
    ("change", "status"),
    [
        ({"max_tokens": 10**6}, 400),
        ({"max_tokens": 0}, 400),
        ({"max_tokens": "ten"}, 400),
        ({"model": "no-such-model"}, 404),
    ],
)
def test_bad_requests_get_a_json_error(cluster: ClusterFile, change: dict[str, Any], status: int) -> None:
    got, out = request(f"{cluster.decode[0].url}/v1/completions", body(cluster, **change))
    assert got == status, out
    assert isinstance(out, dict) and "error" in out and out["error"]["message"]


@pytest.mark.parametrize(
    "part", [{"type": "text", "text": 5}, {"type": "text", "text": ["a"]}, {"type": "text"}]
)
def test_a_text_part_whose_text_is_not_a_string_is_a_400(cluster: ClusterFile, part: dict[str, Any]) -> None:
    chat = {"model": cluster.model, "messages": [{"role": "user", "content": [part]}], "max_tokens": 2}
    got, out = request(f"{cluster.decode[0].url}/v1/chat/completions", chat)
    assert got == 400, out
    assert isinstance(out, dict) and out["error"]["message"]


def test_malformed_json_is_a_400(cluster: ClusterFile) -> None:
    got, out = request(f"{cluster.decode[0].url}/v1/completions", raw=b"{not json")
    assert got == 400


# The JSON shapes vLLM 0.32 answers with (keys in order): observed on the real tier, required of the emulator.
COMPLETION_KEYS = [
    "id",
    "object",
    "created",
    "model",
    "choices",
    "service_tier",
    "system_fingerprint",
    "usage",
    "kv_transfer_params",
    "ec_transfer_params",
    "metrics",
]
COMPLETION_CHOICE_KEYS = [
    "index",
    "text",
    "logprobs",
    "finish_reason",
    "stop_reason",
    "token_ids",
    "prompt_logprobs",
    "prompt_token_ids",
    "routed_experts",
]
CHAT_KEYS = [
    "id",
    "object",
    "created",
    "model",
    "choices",
    "service_tier",
    "system_fingerprint",
    "usage",
    "prompt_logprobs",
    "prompt_token_ids",
    "prompt_text",
    "kv_transfer_params",
    "ec_transfer_params",
    "metrics",
]
CHAT_MESSAGE_KEYS = ["role", "content", "refusal", "annotations", "audio", "function_call", "reasoning"]
STREAM_CHOICE_KEYS = [
    "index",
    "text",
    "logprobs",
    "finish_reason",
    "stop_reason",
    "prompt_token_ids",
    "token_ids",
]
USAGE_KEYS = [
    "prompt_tokens",
    "total_tokens",
    "completion_tokens",
    "prompt_tokens_details",
    "completion_tokens_details",
]
KV_PARAM_KEYS = [
    "do_remote_prefill",
    "do_remote_decode",
    "remote_block_ids",
    "remote_engine_id",
    "remote_request_id",
    "remote_host",
    "remote_port",
    "tp_size",
    "dcp_size",
    "pp_size",
    "remote_num_tokens",
    "remote_blocks_expiry_time",
    "transfer_mode",
    "remote_prefill_cached_tokens",
]


def test_response_shapes_match_vllm(cluster: ClusterFile) -> None:
    p, d = cluster.prefill[0], cluster.decode[0]
    _, out = request(f"{d.url}/v1/completions", body(cluster, max_tokens=3))
    assert list(out) == COMPLETION_KEYS
    assert list(out["choices"][0]) == COMPLETION_CHOICE_KEYS
    assert list(out["usage"]) == USAGE_KEYS
    _, pre = request(
        f"{p.url}/v1/completions", body(cluster, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
    )
    assert list(pre["kv_transfer_params"]) == KV_PARAM_KEYS
    assert pre["kv_transfer_params"]["transfer_mode"] == "pull"
    _, events = stream(
        f"{d.url}/v1/completions",
        body(cluster, max_tokens=3, stream=True, stream_options={"include_usage": True}),
    )
    assert all(list(e["choices"][0]) == STREAM_CHOICE_KEYS for e in events[:-2])
    assert list(events[-2]) == ["id", "object", "created", "model", "choices", "usage", "system_fingerprint"]
    chat = {"model": cluster.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    _, c = request(f"{d.url}/v1/chat/completions", chat)
    assert list(c) == CHAT_KEYS
    assert list(c["choices"][0]["message"]) == CHAT_MESSAGE_KEYS
    status, err = request(f"{d.url}/v1/completions", body(cluster, max_tokens="x"))
    assert (
        status == 400 and err["error"]["type"] == "Bad Request" and err["error"]["param"] == "body.max_tokens"
    )
    status, err = request(f"{d.url}/v1/completions", body(cluster, max_tokens=10**7))
    assert status == 400 and err["error"]["message"].startswith("max_tokens=10000000 cannot be greater than")
    status, err = request(f"{d.url}/v1/completions", body(cluster, min_tokens=99))
    assert status == 400 and "min_tokens must be less than or equal to max_tokens" in err["error"]["message"]
