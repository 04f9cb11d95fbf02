"""prefix_scorer_mix: llm-d's default scheduling profile, a weighted sum of a prefix-cache score, a queue
score and a KV-cache score per candidate, the highest total wins, in each pool.

llm-d's router (EPP) filters, scores and picks: each scorer gives every candidate a value in [0, 1], the
profile multiplies each by its weight, and the max-score picker takes the highest sum. The default profile
that the InferencePool Helm chart writes when the user gives none (``default-plugins.yaml``,
kubernetes-sigs/gateway-api-inference-extension ``config/charts/inferencepool/templates/epp-config.yaml``
@ 139eec8; Red Hat's llm-d docs describe the same default, queue 2 and prefix cache 3) is:

- ``prefix-cache-scorer``, weight 3: the prompt's blocks the router's index expects the candidate to hold,
  over the prompt's blocks (the longest leading run; approximate index, fed by the router's own placements);
- ``queue-scorer``, weight 2: the waiting queue, min-max normalised over the pool, ``(max - q) / (max - min)``
  (1 for every candidate when the queues are equal);
- ``kv-cache-utilization-scorer``, weight 2: ``1 - KV used / KV capacity``.

Inputs: the prefix score is ``cached_tokens / prompt_tokens`` (clipped to [0, 1]; in tokens, where llm-d
counts its own hash blocks, which differ only by the partial last block); the queue is the engine's sampled
``waiting`` and the utilisation its sampled ``kv_used_tokens / kv_capacity_tokens``, up to one poll old, as
in llm-d. Ties rotate with ``seq`` where llm-d's picker breaks them at random.

P/D: llm-d runs a decode profile first and then, if its decider approves, a prefill profile; each profile
has its own filters and weights. Its P/D sample config (llm-d-inference-scheduler
``deploy/config/pd-epp-config.yaml``) weighs the prefix scorer 2 in both profiles, beside one scorer at 1
(queue in the revision shared/reference/peer-routers.md read; proximity @ 78b19f3). What is modelled
here: both pools scored with the same (default) profile, always disaggregated; ``--param
prefix_scorer_mix.w_prefix=2 --param prefix_scorer_mix.w_queue=1 --param prefix_scorer_mix.w_kv=0`` is
the P/D sample's prefix and queue weights. Left out: the P/D decider (skip the
prefill pod when the uncached part is short), the prefix-cache-affinity filter, and every other plugin.
Our own code, from the documented formulas (docs/prefix.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from calroute.policies.base import argmin_rotating, check, healthy
from calroute.policies.queue_kv import scores as load_scores
from calroute.policies.search_space import tunable
from calroute.types import Admission, ClusterView, InstanceState, RouteDecision


@dataclass(frozen=True)
class Params:
    w_prefix: float = field(default=3.0, metadata=tunable(0.0, 10.0))
    w_queue: float = field(default=2.0, metadata=tunable(0.0, 10.0))
    w_kv: float = field(default=2.0, metadata=tunable(0.0, 10.0))

    def __post_init__(self) -> None:
        check(self.w_prefix >= 0, f"w_prefix must be >= 0, got {self.w_prefix}")
        check(self.w_queue >= 0, f"w_queue must be >= 0, got {self.w_queue}")
        check(self.w_kv >= 0, f"w_kv must be >= 0, got {self.w_kv}")
        check(self.w_prefix + self.w_queue + self.w_kv > 0, "w_prefix, w_queue and w_kv cannot all be 0")


def prefix_score(s: InstanceState, prompt_tokens: int) -> float:
    """The share of the prompt the candidate is expected to hold, in [0, 1]."""
    if prompt_tokens <= 0 or s.cached_tokens <= 0:
        return 0.0
    return min(1.0, s.cached_tokens / prompt_tokens)


def scores(pool: list[InstanceState], prompt_tokens: int, params: Params) -> tuple[float, ...]:
    """Each candidate's weighted score, higher is better."""
    load = load_scores(pool, params.w_queue, params.w_kv)
    return tuple(
        params.w_prefix * prefix_score(s, prompt_tokens) + x for s, x in zip(pool, load, strict=True)
    )


class PrefixScorerMix:
    """Highest weighted score in each pool; the decision's scores are the negated totals (lower is better)."""

    name: ClassVar[str] = "prefix_scorer_mix"
    reads_engine_samples: ClassVar[bool] = True

    def __init__(self, params: Params) -> None:
        self.params = params

    def route(self, adm: Admission, view: ClusterView) -> RouteDecision:
        pre = healthy(view.prefill, "prefill")
        dec = healthy(view.decode, "decode")
        pre_keys = tuple(-x for x in scores(pre, adm.prompt_tokens, self.params))
        dec_keys = tuple(-x for x in scores(dec, adm.prompt_tokens, self.params))
        p = argmin_rotating(pre_keys, view.seq)
        d = argmin_rotating(dec_keys, view.seq)
        return RouteDecision(pre[p].instance_id, dec[d].instance_id, pre_keys, dec_keys)
