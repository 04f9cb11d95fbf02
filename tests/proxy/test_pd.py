"""The handoff bodies, SLO headers, prompt length and metrics parsing: pure functions, table-driven."""

from __future__ import annotations

from typing import Any

import pytest

from calroute.costmodel.calibration import SloTargets
from calroute.proxy import pd
from calroute.proxy.prompt_length import PromptLength
from calroute.proxy.signals import parse_vllm_metrics
from calroute.proxy.slo import slo_class
from calroute.types import SloClass


def test_prefill_body_is_the_nixl_handoff_request() -> None:
    client = {
        "model": "m",
        "prompt": "p",
        "max_tokens": 50,
        "min_tokens": 50,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "temperature": 0,
        "user": "u",
    }
    body = pd.prefill_body(client)
    assert body["max_tokens"] == 1 and body["stream"] is False
    assert "stream_options" not in body and "min_tokens" not in body
    assert body["kv_transfer_params"] == {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    assert body["ignore_eos"] is True and body["user"] == "u"  # the client's other fields are preserved
    assert client["max_tokens"] == 50 and "kv_transfer_params" not in client  # not mutated


def test_prefill_caps_max_completion_tokens_only_when_sent() -> None:
    assert pd.prefill_body({"messages": [], "max_completion_tokens": 9})["max_completion_tokens"] == 1
    assert "max_completion_tokens" not in pd.prefill_body({"messages": []})


@pytest.mark.parametrize(
    ("client", "kv", "want_options"),
    [
        ({"prompt": "p", "stream": True}, {"x": 1}, {"include_usage": True}),
        (
            {"prompt": "p", "stream": True, "stream_options": {"continuous_usage_stats": True}},
            {"x": 1},
            {"continuous_usage_stats": True, "include_usage": True},
        ),
        ({"prompt": "p"}, {"x": 1}, None),
    ],
)
def test_decode_body(client: dict[str, Any], kv: dict[str, Any], want_options: dict[str, Any] | None) -> None:
    body = pd.decode_body(client, kv)
    assert body["kv_transfer_params"] == kv
    assert body.get("stream_options") == want_options
    assert body["prompt"] == "p"


def test_decode_without_params_computes_locally() -> None:
    assert "kv_transfer_params" not in pd.decode_body({"prompt": "p", "kv_transfer_params": {"a": 1}}, None)


SLO = SloTargets(tight_ttft_s=0.2, tight_tpot_s=0.04, loose_factor=3.0)


@pytest.mark.parametrize(
    ("headers", "want"),
    [
        ({}, SloClass.LOOSE),
        ({"x-calroute-slo": "tight"}, SloClass.TIGHT),
        ({"x-calroute-slo": " LOOSE "}, SloClass.LOOSE),
        ({"x-llm-d-slo-ttft-ms": "200"}, SloClass.TIGHT),
        ({"x-llm-d-slo-ttft-ms": "600"}, SloClass.LOOSE),
        ({"x-llm-d-slo-ttft-ms": "600", "x-llm-d-slo-tpot-ms": "30"}, SloClass.TIGHT),
        ({"x-llm-d-slo-tpot-ms": "120"}, SloClass.LOOSE),
    ],
)
def test_slo_class_from_headers(headers: dict[str, str], want: SloClass) -> None:
    assert slo_class(headers, SLO, SloClass.LOOSE) is want


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"x-calroute-slo": "medium"}, "x-calroute-slo"),
        ({"x-llm-d-slo-ttft-ms": "fast"}, "x-llm-d-slo-ttft-ms"),
        ({"x-llm-d-slo-tpot-ms": "-3"}, "positive"),
        ({"x-llm-d-slo-tpot-ms": "nan"}, "positive"),
    ],
)
def test_bad_slo_headers(headers: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        slo_class(headers, SLO, SloClass.LOOSE)


def test_prompt_length_counts_ids_exactly_and_learns_the_text_ratio() -> None:
    pl = PromptLength(chars_per_token=4.0, decay=0.5)
    assert pl.estimate({"prompt": [5, 6, 7]}) == (3, None)
    assert pl.estimate({"prompt": "x" * 400}) == (100, 400)
    for _ in range(20):
        pl.learn(400, 200)  # the engine says 2 characters per token
    assert pl.estimate({"prompt": "x" * 400})[0] == 200
    tokens, chars = pl.estimate({"messages": [{"role": "user", "content": "hello"}]})
    assert tokens >= 1 and chars is not None and chars > 5


VLLM_METRICS = b"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
vllm:num_requests_running{engine="1",model_name="tiny"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
vllm:num_requests_waiting{engine="0",model_name="tiny"} 2.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="capacity"} 7.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
"""


def test_parse_vllm_metrics_sums_engines_and_ignores_lookalikes() -> None:
    assert parse_vllm_metrics(VLLM_METRICS) == (0.25, 4.0, 2.0)
    legacy = VLLM_METRICS.replace(b"vllm:kv_cache_usage_perc", b"vllm:gpu_cache_usage_perc")
    assert parse_vllm_metrics(legacy) == (0.25, 4.0, 2.0)
    assert parse_vllm_metrics(b"nothing here\n") is None


def test_only_trace_context_is_forwarded_from_clients() -> None:
    client = {
        "traceparent": "00-abc-def-01",
        "Authorization": "Bearer client-secret",
        "Cookie": "x=1",
        "x-calroute-slo": "tight",
        "tracestate": "k=v",
    }
    assert pd.forwarded(client) == {"traceparent": "00-abc-def-01", "tracestate": "k=v"}
