"""The emulator's /metrics: vLLM's metric names and labels, read from the engine core at scrape time.

Rendered by hand in the Prometheus text format (0.0.4) rather than through prometheus_client: a router
scrapes every engine 20 times a second, all emulated engines share one process, and a prometheus_client
render of this family set costs about 0.57 ms of that process's CPU per scrape (measured with
``generate_latest``), which the engines' own timing then pays for. Real vLLM serves /metrics from its API
server process, off the engine core's path; rendering in tens of microseconds keeps the emulator close
to that.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from calroute.contract import metrics as names
from calroute.emulator.core import EngineCore

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
_HISTOGRAMS = {
    "ttft": ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds."),
    "itl": ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds."),
    "e2e": ("vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds."),
}
_FINISHED_REASONS = ("abort", "length", "stop")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@dataclass
class _Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * (len(_LATENCY_BUCKETS_S) + 1))
    sum_s: float = 0.0

    def observe(self, value_s: float) -> None:
        # le is inclusive: a value equal to a bound belongs to that bucket
        self.counts[bisect.bisect_left(_LATENCY_BUCKETS_S, value_s)] += 1
        self.sum_s += value_s


class EngineMetrics:
    """One engine's metrics (several engines may share a process)."""

    def __init__(self, core: EngineCore, model_name: str) -> None:
        self._core = core
        self._labels = f'engine="0",model_name="{_escape(model_name)}"'
        self._histograms = {name: _Histogram() for name in _HISTOGRAMS}

    def observe(self, name: str, value_s: float) -> None:
        self._histograms[name].observe(value_s)

    def exposition(self) -> bytes:
        core, st, labels = self._core, self._core.stats, self._labels
        out: list[str] = []

        def family(name: str, kind: str, doc: str, values: list[tuple[str, float]]) -> None:
            out.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")
            out.extend(f"{name}{{{labels}{extra}}} {float(v)!r}\n" for extra, v in values)

        family(
            names.NUM_REQUESTS_RUNNING,
            "gauge",
            "Requests in the model execution batch.",
            [("", core.num_running)],
        )
        family(
            names.NUM_REQUESTS_WAITING,
            "gauge",
            "Requests waiting to be processed.",
            [("", core.num_waiting)],
        )
        family(
            names.KV_CACHE_USAGE,
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            [("", core.kv.usage())],
        )
        counters = (
            ("vllm:prefix_cache_queries", "Prefix cache queries, in tokens.", st.prefix_queries),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.", st.prefix_hits),
            ("vllm:num_preemptions", "Cumulative number of preemptions.", st.preemptions),
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", st.prompt_tokens),
            ("vllm:generation_tokens", "Number of generation tokens processed.", st.generation_tokens),
            ("vllm:nixl_num_kv_expired_reqs", "Requests whose held KV expired before a pull.", st.kv_expired),
            (
                "vllm:nixl_num_failed_transfers",
                "KV transfers that failed on this engine.",
                st.kv_failed_pulls,
            ),
        )
        for name, doc, value in counters:
            family(f"{name}_total", "counter", doc, [("", value)])
        family(
            "vllm:request_success_total",
            "counter",
            "Count of successfully processed requests.",
            [
                (f',finished_reason="{reason}"', st.finished[reason])
                for reason in _FINISHED_REASONS
                if reason in st.finished
            ],
        )
        for key, (name, doc) in _HISTOGRAMS.items():
            h = self._histograms[key]
            out.append(f"# HELP {name} {doc}\n# TYPE {name} histogram\n")
            cumulative = 0
            for bound, count in zip((*_LATENCY_BUCKETS_S, float("inf")), h.counts, strict=True):
                cumulative += count
                le = "+Inf" if bound == float("inf") else repr(bound)
                out.append(f'{name}_bucket{{{labels},le="{le}"}} {float(cumulative)!r}\n')
            out.append(f"{name}_count{{{labels}}} {float(cumulative)!r}\n")
            out.append(f"{name}_sum{{{labels}}} {h.sum_s!r}\n")
        return "".join(out).encode()
