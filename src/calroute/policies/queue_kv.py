"""queue_kv: llm-d's default load scorers, a weighted sum of a queue score and a KV-cache score per pool.

llm-d's router (EPP) scores each candidate with plugins and takes the highest total (its max-score picker).
Two of its scorers need only what vLLM's /metrics gives, and so apply here:
- ``queue-scorer``: the waiting queue, min-max normalised over the pool, ``(max - q) / (max - min)``
  (1 for every candidate when all queues are equal);
- ``kv-cache-utilization-scorer``: ``1 - KV used / KV capacity``.
Its documented well-lit-path weights are prefix : queue : KV = 2 : 2 : 1 (llm-d/llm-d#1156). Without
shared prefixes the prefix scorer gives every candidate the same score, so ``w_queue = 2, w_kv = 1`` is
that configuration. Both signals come from the engines' polled metrics (up to one poll interval old), as
in llm-d; ties rotate with ``seq`` where llm-d breaks them at random. The scorers are our own code, from
the plugins' documented formulas (shared/reference/peer-routers.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from calroute.policies.base import argmin_rotating, check, healthy
from calroute.policies.search_space import tunable
from calroute.types import Admission, ClusterView, InstanceState, RouteDecision


@dataclass(frozen=True)
class Params:
    w_queue: float = field(default=2.0, metadata=tunable(0.0, 10.0))
    w_kv: float = field(default=1.0, metadata=tunable(0.0, 10.0))

    def __post_init__(self) -> None:
        check(self.w_queue >= 0, f"w_queue must be >= 0, got {self.w_queue}")
        check(self.w_kv >= 0, f"w_kv must be >= 0, got {self.w_kv}")
        check(self.w_queue + self.w_kv > 0, "w_queue and w_kv cannot both be 0")


def scores(pool: list[InstanceState], w_queue: float, w_kv: float) -> tuple[float, ...]:
    """Each candidate's weighted score, higher is better."""
    waiting = [s.waiting for s in pool]
    lo, hi = min(waiting), max(waiting)
    out = []
    for s in pool:
        queue = 1.0 if hi == lo else (hi - s.waiting) / (hi - lo)
        kv = 1.0 - min(1.0, s.kv_used_tokens / s.kv_capacity_tokens) if s.kv_capacity_tokens > 0 else 0.0
        out.append(w_queue * queue + w_kv * kv)
    return tuple(out)


class QueueKv:
    name: ClassVar[str] = "queue_kv"
    reads_engine_samples: ClassVar[bool] = True

    def __init__(self, params: Params) -> None:
        self.params = params

    def _pick(self, pool: list[InstanceState], seq: int) -> str:
        best = scores(pool, self.params.w_queue, self.params.w_kv)
        return pool[argmin_rotating(tuple(-x for x in best), seq)].instance_id

    def route(self, adm: Admission, view: ClusterView) -> RouteDecision:
        pre = healthy(view.prefill, "prefill")
        dec = healthy(view.decode, "decode")
        return RouteDecision(self._pick(pre, view.seq), self._pick(dec, view.seq))
