"""Reading vLLM's /metrics for the live signals."""

from __future__ import annotations

from calroute.proxy.signals import parse_vllm_metrics

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
