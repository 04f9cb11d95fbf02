"""The proxy's own Prometheus metrics (a registry per proxy, so tests can run several in one process)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

_LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.175, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
_TPOT_BUCKETS_S = (0.005, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12, 0.2, 0.5, 1.0)
_DECISION_BUCKETS_S = (1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 5e-3)
_LOOP_LAG_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)


class _LiveCollector(Collector):
    """Engine health, signal age and the router's current prices, read at scrape time."""

    def __init__(
        self,
        read: Callable[[], list[tuple[str, bool, float | None]]],
        prices: Callable[[], tuple[float, float]],
    ) -> None:
        self._read = read
        self._prices = prices

    def collect(self) -> Iterator[Metric]:
        healthy = GaugeMetricFamily(
            "calroute_engine_healthy", "1 when the engine is in routing.", labels=["engine"]
        )
        age = GaugeMetricFamily(
            "calroute_signal_age_seconds", "Age of the engine's last /metrics sample.", labels=["engine"]
        )
        for engine, ok, age_s in self._read():
            healthy.add_metric([engine], 1.0 if ok else 0.0)
            if age_s is not None:
                age.add_metric([engine], age_s)
        yield healthy
        yield age
        tau_pre, tau_dec = self._prices()
        yield GaugeMetricFamily(
            "calroute_tau_pre_seconds", "The router's prefill price per prompt token.", tau_pre
        )
        yield GaugeMetricFamily(
            "calroute_tau_dec_seconds", "The router's decode price per output token.", tau_dec
        )


class _TokenizerCollector(Collector):
    """The tokenizer's own counters (contract.tokenizer: ``counters``), read at scrape time."""

    def __init__(self, read: Callable[[], Mapping[str, float]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        for name, value in sorted(self._read().items()):
            full = f"calroute_tokenizer_{name}"
            if name.endswith("_total"):
                yield CounterMetricFamily(full.removesuffix("_total"), "The tokenizer's count.", value)
            else:
                yield GaugeMetricFamily(full, "The tokenizer's reading.", value)


class ProxyMetrics:
    def __init__(
        self,
        live: Callable[[], list[tuple[str, bool, float | None]]],
        prices: Callable[[], tuple[float, float]],
        tokenizer_counters: Callable[[], Mapping[str, float]] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        if tokenizer_counters is not None:
            self.registry.register(_TokenizerCollector(tokenizer_counters))
        self.requests = Counter(
            "calroute_requests",
            "Requests by policy, chosen engines and terminal status.",
            ["policy", "prefill", "decode", "status"],
            registry=self.registry,
        )
        self.route_paths = Counter(
            "calroute_route_path",
            "Routing decisions (each attempt's) by policy, path and the policy's reason for it: remote (a "
            "prefill engine, then the KV handed to the decode engine) or local (the decode engine prefills "
            "the prompt itself: RouteDecision.local).",
            ["policy", "path", "reason"],
            registry=self.registry,
        )
        self.retries = Counter(
            "calroute_retries",
            "Retried hops by phase: prefill, decode (after a prefill), local (a decode engine prefilling "
            "the prompt itself).",
            ["phase"],
            registry=self.registry,
        )
        self.engine_errors = Counter(
            "calroute_engine_errors",
            "Failed engine requests (connection, 5xx, timeout).",
            ["engine"],
            registry=self.registry,
        )
        self.engine_protocol_errors = Counter(
            "calroute_engine_protocol_errors",
            "Engine answers the proxy would not read, by kind: framing (not HTTP/1.1), too_large (a whole "
            "answer over its cap), event_too_large (an SSE event over its cap), unreadable (a prefill "
            "answer that is not the JSON it must be), status (a 3xx: no redirect is followed or passed on).",
            ["engine", "kind"],
            registry=self.registry,
        )
        self.prompt_length_estimated = Counter(
            "calroute_prompt_length_estimated",
            "Text and chat prompts priced on a length estimated from their characters: no tokenizer is "
            "configured (the cluster file's tokenizer field), or it could not read a completions prompt.",
            registry=self.registry,
        )
        self.prompt_tokens_mismatch = Counter(
            "calroute_prompt_tokens_mismatch",
            "Prompts priced on the tokenizer's exact count whose prefill engine reported another "
            "usage.prompt_tokens: a tokenizer or chat template that drifted from the engine's.",
            ["engine"],
            registry=self.registry,
        )
        # The prefix-hit ratio per policy is cached / prompt: rate(cached) / rate(prompt) in PromQL.
        self.kv_releases = Counter(
            "calroute_kv_releases",
            "Release legs: a client left while a prefill engine held its KV for a decode engine that had not "
            "taken it, so the proxy sent that engine a one-token decode to free the blocks; by outcome (ok, "
            "refused: the engine answered 4xx or 5xx, failed: no answer).",
            ["outcome"],
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "calroute_prompt_tokens",
            "Prompt tokens of completed requests, by policy.",
            ["policy"],
            registry=self.registry,
        )
        self.cached_tokens = Counter(
            "calroute_prefix_cached_tokens",
            "Of those, the tokens the engines that prefilled them (a decode engine, on the local path) said "
            "they served from their prefix caches.",
            ["policy"],
            registry=self.registry,
        )
        self.predicted_cached_tokens = Counter(
            "calroute_prefix_predicted_cached_tokens",
            "Of those, the tokens the router's prefix index expected the engines chosen to prefill them "
            "to hold.",
            ["policy"],
            registry=self.registry,
        )
        self.ttft = Histogram(
            "calroute_ttft_seconds",
            "Time to first token through the proxy.",
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.tpot = Histogram(
            "calroute_tpot_seconds",
            "Time per output token after the first.",
            buckets=_TPOT_BUCKETS_S,
            registry=self.registry,
        )
        self.decision = Histogram(
            "calroute_decision_seconds",
            "Time to predict, build the view and run the policy.",
            buckets=_DECISION_BUCKETS_S,
            registry=self.registry,
        )
        self.loop_lag = Histogram(
            "calroute_event_loop_lag_seconds",
            "How late the event loop ran a timer due every 0.1 s: a stall delays every request in flight.",
            buckets=_LOOP_LAG_BUCKETS_S,
            registry=self.registry,
        )
        self.registry.register(_LiveCollector(live, prices))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
