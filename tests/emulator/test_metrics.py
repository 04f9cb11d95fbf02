"""The emulator's hand-rendered /metrics must parse as Prometheus text and say what vLLM's would."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from calroute.costmodel.profiles import get_profile
from calroute.emulator.core import EngineCore
from calroute.emulator.metrics import EngineMetrics


def samples(m: EngineMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(m.exposition().decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def key(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return name, tuple(sorted({"engine": "0", "model_name": 'my "model"', **labels}.items()))


@pytest.fixture
def metrics() -> EngineMetrics:
    return EngineMetrics(EngineCore("d0", get_profile("a40-qwen2.5-3b")), 'my "model"')


@pytest.mark.parametrize(
    ("observed_s", "le", "expected"),
    [
        ([], "0.04", 0.0),
        ([0.04], "0.02", 0.0),
        ([0.04], "0.04", 1.0),  # a bound is inclusive
        ([0.03, 0.05, 7.0], "0.06", 2.0),
        ([0.03, 0.05, 7.0], "10.0", 3.0),
        ([30.0], "20.0", 0.0),
        ([30.0], "+Inf", 1.0),
    ],
)
def test_histogram_buckets_are_cumulative(
    metrics: EngineMetrics, observed_s: list[float], le: str, expected: float
) -> None:
    for v in observed_s:
        metrics.observe("ttft", v)
    got = samples(metrics)
    assert got[key("vllm:time_to_first_token_seconds_bucket", le=le)] == expected
    assert got[key("vllm:time_to_first_token_seconds_count")] == len(observed_s)
    assert got[key("vllm:time_to_first_token_seconds_sum")] == pytest.approx(sum(observed_s))
    assert got[key("vllm:inter_token_latency_seconds_count")] == 0


def test_gauges_and_counters_read_the_core_at_scrape_time(metrics: EngineMetrics) -> None:
    core = metrics._core
    core.stats.generation_tokens = 42
    core.stats.finished.update({"stop": 3, "length": 1, "error": 9})
    got = samples(metrics)
    assert got[key("vllm:num_requests_running")] == 0
    assert got[key("vllm:kv_cache_usage_perc")] == 0
    assert got[key("vllm:generation_tokens_total")] == 42
    assert got[key("vllm:request_success_total", finished_reason="stop")] == 3
    assert got[key("vllm:request_success_total", finished_reason="length")] == 1
    assert key("vllm:request_success_total", finished_reason="error") not in got  # not a success reason
