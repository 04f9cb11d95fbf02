"""Goodput and latency summaries over request records (the same for simulated and live runs).

A request is good when it completed and met both targets of its SLO class (TTFT and TPOT), its TTFT target
being that of its own prompt length when the targets have a per-token allowance (SloTargets). Goodput is
good requests over all requests offered (rejected and failed ones count against it), a fraction. The
prefix-hit ratio is the share of completed requests' prompt tokens that prefill engines served from cache.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from calroute.costmodel.calibration import SloTargets
from calroute.results.records import RecordWriter, RequestRecord
from calroute.types import PicklesByConstructor, RequestStatus


@dataclass(frozen=True)
class RunSummary(PicklesByConstructor):
    requests: int
    completed: int
    good: int
    goodput: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p99_s: float | None
    duration_s: float
    good_rps: float
    status_counts: dict[str, int]
    prefix_hit_ratio: float = 0.0
    local_share: float = 0.0  # of the requests, those their decode engine prefilled (RouteDecision.local)
    # of the completed requests, those whose mean TPOT missed their class's target (whatever their TTFT)
    tpot_miss_ratio: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def inadmissible(self) -> int:
        """Requests refused before any engine saw them (past the model length, malformed): no router's
        doing."""
        return self.status_counts.get(RequestStatus.REJECTED.value, 0)

    @property
    def admissible_goodput(self) -> float:
        """Good requests over those an engine could take: goodput with the inadmissible counted apart."""
        n = self.requests - self.inadmissible
        return self.good / n if n > 0 else 0.0


def is_good(rec: RequestRecord, slo: SloTargets) -> bool:
    ttft, tpot = rec.ttft_s, rec.tpot_s
    if rec.status is not RequestStatus.OK or ttft is None or tpot is None:
        return False
    cls = rec.slo_class
    # The whole prompt, cached tokens included: the target is the request's, whatever the cache saved it.
    return ttft <= slo.ttft_target_s(cls, rec.prompt_tokens) and tpot <= slo.tpot_s(cls)


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


class SummaryAccumulator:
    """Consumes records one at a time (memory: two floats per completed request)."""

    def __init__(self, slo: SloTargets) -> None:
        self.slo = slo
        self._ttft: list[float] = []
        self._tpot: list[float] = []
        self._good = 0
        self._requests = 0
        self._status: dict[str, int] = {}  # statuses other than OK
        self._ok = 0  # OK counted apart: the common case skips a str() and two dict operations
        self._first_arrival_s = float("inf")
        self._last_event_s = 0.0
        self._prompt_tokens = 0  # of completed requests
        self._cached_tokens = 0
        self._local = 0
        self._tpot_misses = 0

    def add(self, rec: RequestRecord) -> None:
        self._requests += 1
        if rec.local_prefill:
            self._local += 1
        if rec.status is RequestStatus.OK:
            self._ok += 1
        else:
            status = str(rec.status)  # the value; Enum's .value is a Python-level descriptor, hot here
            self._status[status] = self._status.get(status, 0) + 1
        # comparisons, not min()/max(): those are generic calls in the compiled build (setup.py)
        if rec.arrival_s < self._first_arrival_s:
            self._first_arrival_s = rec.arrival_s
        end = rec.last_token_s if rec.last_token_s is not None else rec.arrival_s
        if end > self._last_event_s:
            self._last_event_s = end
        ttft, tpot = rec.ttft_s, rec.tpot_s
        if rec.status is RequestStatus.OK and ttft is not None and tpot is not None:
            self._ttft.append(ttft)
            self._tpot.append(tpot)
            self._prompt_tokens += rec.prompt_tokens
            self._cached_tokens += rec.cached_tokens
            self._good += is_good(rec, self.slo)
            if tpot > self.slo.tpot_s(rec.slo_class):
                self._tpot_misses += 1

    def summary(self) -> RunSummary:
        n = self._requests
        duration = max(0.0, self._last_event_s - self._first_arrival_s) if n else 0.0
        counts = dict(self._status)
        if self._ok:
            counts[str(RequestStatus.OK)] = self._ok
        return RunSummary(
            requests=n,
            completed=len(self._ttft),
            good=self._good,
            goodput=self._good / n if n else 0.0,
            ttft_p50_s=_pct(self._ttft, 50),
            ttft_p99_s=_pct(self._ttft, 99),
            tpot_p50_s=_pct(self._tpot, 50),
            tpot_p99_s=_pct(self._tpot, 99),
            duration_s=duration,
            good_rps=self._good / duration if duration > 0 else 0.0,
            status_counts=dict(sorted(counts.items())),
            prefix_hit_ratio=self._cached_tokens / self._prompt_tokens if self._prompt_tokens else 0.0,
            local_share=self._local / n if n else 0.0,
            tpot_miss_ratio=self._tpot_misses / len(self._tpot) if self._tpot else 0.0,
        )


class RunSink:
    """Where a run's records go: into its summary and, when a writer is given, its JSONL file.

    A compiled class (setup.py) so that the simulator's one call per record reaches both natively, where a
    Python closure over the two cost an interpreted frame per record.
    """

    def __init__(self, acc: SummaryAccumulator, writer: RecordWriter | None = None) -> None:
        self.acc = acc
        self.writer = writer

    def __call__(self, rec: RequestRecord) -> None:
        self.acc.add(rec)
        if self.writer is not None:
            self.writer.write(rec)


def summarize(records: list[RequestRecord], slo: SloTargets) -> RunSummary:
    acc = SummaryAccumulator(slo)
    for r in records:
        acc.add(r)
    return acc.summary()
