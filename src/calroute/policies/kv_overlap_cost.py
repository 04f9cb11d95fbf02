"""kv_overlap_cost: NVIDIA Dynamo's KV router, a cost in KV blocks per worker, lowest cost wins.

Dynamo's documented cost (ai-dynamo/dynamo ``docs/components/router/router-concepts.md`` @ 1d1a556, "Cost
Calculation"; the selector ``lib/kv-router/src/scheduling/selector.rs`` @ 01690d4)::

    cost(w) = overlap_score_weight * prefill_blocks(w) + decode_blocks(w)
    prefill_blocks(w) = (active prefill tokens on w + prompt tokens w does not hold) / block size
    decode_blocks(w)  = blocks of the sequences active on w + the request's own blocks

with ``--router-kv-overlap-score-weight`` 1.0 (newer releases call it the overlap credit, with the same
default and the same costs at the defaults) and ``--router-temperature`` 0.0: the lowest cost wins. With a
temperature T > 0 Dynamo samples a softmax of the costs min-max normalised:
``p(w) ~ exp(-(cost(w) - min) / ((max - min) * T))``, uniform when all costs are equal.

Disaggregated (``router-disaggregated-serving.md``): the prefill router uses that cost; the decode router
sets the overlap weight to 0 and does not track prefill tokens, so a decode worker costs its active blocks
plus the request's: the least-loaded decode worker by KV blocks.

Inputs, all from the router's own ledger (``reads_engine_samples`` False, as Dynamo tracks these itself):
``cached_tokens`` is the overlap; Dynamo's active prefill tokens and a prefill worker's active blocks are
both stood for by ``kv_committed_tokens`` (prompt tokens admitted to the prefill engine whose first token
has not come; it also counts their cached part, which Dynamo's prefill tokens do not); a decode worker's
active blocks by its ``kv_committed_tokens`` (prompt + predicted output of its requests in flight, where
Dynamo counts the blocks generated so far). Costs are kept in tokens: dividing both terms by one block size
changes neither the argmin nor the min-max-normalised softmax. The sample is drawn from ``hash64(seed, seq,
pool)``, ties at T = 0 rotate with ``seq``. Left out: host/disk tier credits, the credit decay, active-request
weights, output-block tracking, queueing and busy thresholds. Our own code (docs/prefix.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, Final

from calroute.policies.base import argmin_rotating, check, healthy
from calroute.policies.search_space import tunable
from calroute.splitmix import hash64
from calroute.types import Admission, ClusterView, RouteDecision

_PREFILL_STREAM: Final = 0x5052  # separate random draws for the two pools of one decision
_DECODE_STREAM: Final = 0x4445
_TWO64: Final = float(1 << 64)


@dataclass(frozen=True)
class Params:
    overlap_score_weight: float = field(default=1.0, metadata=tunable(0.0, 4.0))
    temperature: float = field(default=0.0, metadata=tunable(0.0, 2.0))
    seed: int = 0

    def __post_init__(self) -> None:
        check(
            self.overlap_score_weight >= 0 and math.isfinite(self.overlap_score_weight),
            f"overlap_score_weight must be finite and >= 0, got {self.overlap_score_weight}",
        )
        check(
            self.temperature >= 0 and math.isfinite(self.temperature),
            f"temperature must be finite and >= 0, got {self.temperature}",
        )


def softmax_pick(costs: tuple[float, ...], temperature: float, u: float) -> int:
    """Dynamo's sampling: softmax of the negated costs, min-max normalised and divided by the temperature;
    ``u`` in [0, 1) picks along the cumulative probabilities in candidate order."""
    lo, hi = min(costs), max(costs)
    if hi == lo:
        weights = [1.0] * len(costs)
    else:
        scale = 1.0 / ((hi - lo) * temperature)
        weights = [math.exp(-(c - lo) * scale) for c in costs]
    target = u * sum(weights)
    acc = 0.0
    for i, w in enumerate(weights):
        acc += w
        if target < acc:
            return i
    return len(costs) - 1


class KvOverlapCost:
    """Lowest block cost in each pool (softmax-sampled with a temperature); scores are the costs in tokens."""

    name: ClassVar[str] = "kv_overlap_cost"
    reads_engine_samples: ClassVar[bool] = False

    def __init__(self, params: Params) -> None:
        self.params = params

    def route(self, adm: Admission, view: ClusterView) -> RouteDecision:
        w = self.params.overlap_score_weight
        prompt = adm.prompt_tokens
        pre = healthy(view.prefill, "prefill")
        dec = healthy(view.decode, "decode")
        pre_costs: list[float] = []
        for s in pre:
            cached = s.cached_tokens if s.cached_tokens < prompt else prompt
            prefill_tokens = s.kv_committed_tokens + prompt - cached
            pre_costs.append(w * prefill_tokens + s.kv_committed_tokens + prompt)
        dec_costs = tuple(float(s.kv_committed_tokens + prompt) for s in dec)
        p = self._pick(tuple(pre_costs), view.seq, _PREFILL_STREAM)
        d = self._pick(dec_costs, view.seq, _DECODE_STREAM)
        return RouteDecision(pre[p].instance_id, dec[d].instance_id, tuple(pre_costs), dec_costs)

    def _pick(self, costs: tuple[float, ...], seq: int, stream: int) -> int:
        t = self.params.temperature
        if t == 0.0:
            return argmin_rotating(costs, seq)
        return softmax_pick(costs, t, hash64(self.params.seed, seq, stream) / _TWO64)
