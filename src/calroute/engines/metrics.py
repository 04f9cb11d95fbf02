"""The emulator's /metrics: vLLM's metric names and labels, read from the engine core at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from calroute.engines.core import EngineCore

_LATENCY_BUCKETS_S = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
)


class _CoreCollector(Collector):
    def __init__(self, core: EngineCore, model_name: str) -> None:
        self._core = core
        self._labels = {"engine": "0", "model_name": model_name}

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=list(self._labels))
        g.add_metric(list(self._labels.values()), value)
        return g

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=list(self._labels))
        c.add_metric(list(self._labels.values()), value)
        return c

    def collect(self) -> Iterator[Metric]:
        core = self._core
        st = core.stats
        yield self._gauge(
            "vllm:num_requests_running", "Requests in the model execution batch.", core.num_running
        )
        yield self._gauge("vllm:num_requests_waiting", "Requests waiting to be processed.", core.num_waiting)
        yield self._gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", core.kv.usage()
        )
        yield self._counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in tokens.", st.prefix_queries
        )
        yield self._counter("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.", st.prefix_hits)
        yield self._counter("vllm:num_preemptions", "Cumulative number of preemptions.", st.preemptions)
        yield self._counter("vllm:prompt_tokens", "Number of prefill tokens processed.", st.prompt_tokens)
        yield self._counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", st.generation_tokens
        )
        yield self._counter(
            "vllm:nixl_num_kv_expired_reqs", "Requests whose held KV expired before a pull.", st.kv_expired
        )
        yield self._counter(
            "vllm:nixl_num_failed_transfers", "KV transfers that failed on this engine.", st.kv_failed_pulls
        )
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*self._labels, "finished_reason"],
        )
        for reason, count in sorted(st.finished.items()):
            if reason in ("stop", "length", "abort"):
                success.add_metric([*self._labels.values(), reason], count)
        yield success


class EngineMetrics:
    """A registry per engine (several engines may share a process)."""

    def __init__(self, core: EngineCore, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_CoreCollector(core, model_name))
        labels = ("engine", "model_name")
        self._values = ("0", model_name)
        self._ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labels,
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        ).labels(*self._values)
        self._itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            labels,
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        ).labels(*self._values)
        self._e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds.",
            labels,
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        ).labels(*self._values)

    def observe(self, name: str, value_s: float) -> None:
        {"ttft": self._ttft, "itl": self._itl, "e2e": self._e2e}[name].observe(value_s)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
