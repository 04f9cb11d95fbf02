"""kv_overlap_cost: NVIDIA Dynamo's KV router as it routes a disaggregated deployment, a cost in KV blocks
per worker, lowest cost wins.

Dynamo's cost (ai-dynamo/dynamo ``lib/llm/src/kv_router/scheduler.rs`` @ db19bd2, ``DefaultWorkerSelector``,
fed by ``lib/llm/src/kv_router/queue.rs`` @ 3b61573, ``schedule``)::

    cost(w) = overlap_score_weight * prefill_blocks(w) + decode_blocks(w)
    prefill_blocks(w) = (active prefill tokens of w + the prompt's tokens w does not hold) / block size
    decode_blocks(w)  = active blocks of w + the request's blocks not among them

as the router's ``ActiveSequences`` project each worker's load (``lib/llm/src/kv_router/sequence.rs`` @
581ee33: ``potential_blocks_and_tokens`` = ``new_blocks + active_blocks`` and ``new_tokens(isl, overlap) +
active_tokens``). A worker's active blocks are the blocks of its active sequences counted once each
(``unique_blocks``, one reference count per block hash, so a prefix its sequences share counts once); the
request's new blocks are those past the leading run of its blocks among them (``query_len -
overlap_depth``, ``lib/kv-router/src/sequences/prompt_registry.rs`` @ 34e165b); its active prefill tokens
are the uncached prompt tokens of its requests whose prefill is not done (``mark_prefill_completed``
removes them); and the prompt tokens it holds are the KV-event overlap (``overlap_blocks x block size``).
Defaults: ``--router-kv-overlap-score-weight`` 1.0 (newer releases: overlap credit 1.0, the same costs) and
``--router-temperature`` 0.0, the lowest cost wins; with a temperature T > 0 Dynamo samples a softmax of the
costs min-max normalised, ``p(w) ~ exp(-(cost(w) - min) / ((max - min) * T))``, uniform when all are equal.

Disaggregated, Dynamo changes the two routers' configurations (``docs/components/router/
router-disaggregated-serving.md`` @ 8f295b3; ``lib/mocker/src/replay/offline/disagg.rs`` @ 84809e0,
``test_derive_stage_router_configs_force_required_overrides``):

- the prefill router turns active-block tracking off (``router_track_active_blocks = false``, "since
  prefill workers do not perform decode"): no sequence hashes are kept (``compute_seq_hashes_for_tracking``
  returns None, ``lib/kv-router/src/scheduling/config.rs`` @ c2f2e1a), so every prefill worker's decode
  blocks are 0 and its cost is ``overlap_score_weight x prefill_blocks``;
- the decode router sets the overlap weight to 0, stops tracking prefill tokens and sets
  ``assume_kv_reuse = false``, under which the request's blocks are tracked under random hashes (same
  ``config.rs``): no two sequences share a block, so a decode worker costs every active sequence's prompt
  blocks plus the request's, the fewest active blocks winning. ``assume_kv_reuse=true`` here is Dynamo's
  global default (and its aggregated router's decode term): the active blocks counted once and only the
  request's new blocks added.

Inputs, all from the router's ledger (``reads_engine_samples`` False, as Dynamo tracks these itself;
routing/ledger.py keeps the active sequences as ``ActiveSequences`` does: a prefill engine's until its
prefill is done, a decode engine's until the request is done): ``pending_prefill_tokens`` (the uncached
prompt tokens of the prefill engine's active sequences), ``cached_tokens`` (the overlap), ``active_tokens``
(a decode engine's active sequences' prompt tokens), and with ``assume_kv_reuse`` ``active_shared_tokens``
and ``active_overlap_tokens`` (the ledger tracks blocks only then: ``reads_active_blocks``). Costs are kept
in tokens: dividing both terms by one block size changes neither the argmin nor the min-max-normalised
softmax; Dynamo counts full blocks, so the costs differ from its by less than a block per sequence. The
sample is drawn from ``hash64(seed, seq, pool)``, ties at T = 0 rotate with ``seq``. Left out: Dynamo picks
the decode worker after the prefill is done, where calroute picks both at admission (so a decode engine's
active sequences include requests still in prefill there); host/disk tier credits, the credit decay, the
prefill load model, active-request weights, output-block tracking (off by default), queueing and busy
thresholds. Our own code (docs/prefix.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, Final

from calroute.policies.base import argmin_rotating, check, healthy
from calroute.policies.search_space import tunable
from calroute.splitmix import hash64
from calroute.types import Admission, ClusterView, InstanceState, RouteDecision

_PREFILL_STREAM: Final = 0x5052  # separate random draws for the two pools of one decision
_DECODE_STREAM: Final = 0x4445
_TWO64: Final = float(1 << 64)


@dataclass(frozen=True)
class Params:
    overlap_score_weight: float = field(default=1.0, metadata=tunable(0.0, 4.0))
    temperature: float = field(default=0.0, metadata=tunable(0.0, 2.0))
    seed: int = 0
    # the decode router's: False as Dynamo's disaggregated decode stage sets it (each sequence's blocks its
    # own); True, Dynamo's global default: shared blocks count once, the request adds only its new blocks
    assume_kv_reuse: bool = False

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


def prefill_cost(s: InstanceState, prompt: int, weight: float) -> float:
    """A prefill worker's cost in tokens: its prefill work with the request's added, weighted; no decode term
    (Dynamo's prefill router tracks no active blocks)."""
    cached = s.cached_tokens if s.cached_tokens < prompt else prompt
    return weight * (s.pending_prefill_tokens + prompt - cached)


def decode_cost(s: InstanceState, prompt: int, assume_kv_reuse: bool) -> float:
    """A decode worker's cost in tokens: its active sequences' blocks with the request's added; with
    ``assume_kv_reuse``, shared blocks once and only the request's blocks past its run among them."""
    if not assume_kv_reuse:
        return float(s.active_tokens + prompt)
    overlap = s.active_overlap_tokens if s.active_overlap_tokens < prompt else prompt
    return float(s.active_tokens - s.active_shared_tokens + prompt - overlap)


class KvOverlapCost:
    """Lowest block cost in each pool (softmax-sampled with a temperature); scores are the costs in tokens."""

    name: ClassVar[str] = "kv_overlap_cost"
    reads_engine_samples: ClassVar[bool] = False

    def __init__(self, params: Params) -> None:
        self.params = params
        # the ledger counts the active sequences' blocks only for the decode router that assumes reuse
        self.reads_active_blocks = params.assume_kv_reuse

    def route(self, adm: Admission, view: ClusterView) -> RouteDecision:
        w = self.params.overlap_score_weight
        reuse = self.params.assume_kv_reuse
        prompt = adm.prompt_tokens
        pre = healthy(view.prefill, "prefill")
        dec = healthy(view.decode, "decode")
        pre_costs = tuple(prefill_cost(s, prompt, w) for s in pre)
        dec_costs = tuple(decode_cost(s, prompt, reuse) for s in dec)
        p = self._pick(pre_costs, view.seq, _PREFILL_STREAM)
        d = self._pick(dec_costs, view.seq, _DECODE_STREAM)
        return RouteDecision(pre[p].instance_id, dec[d].instance_id, pre_costs, dec_costs)

    def _pick(self, costs: tuple[float, ...], seq: int, stream: int) -> int:
        t = self.params.temperature
        if t == 0.0:
            return argmin_rotating(costs, seq)
        return softmax_pick(costs, t, hash64(self.params.seed, seq, stream) / _TWO64)
