"""pd_dynamo: NVIDIA Dynamo's conditional disaggregation (``--router-conditional-disagg``): the router peeks
at the decode worker it would pick and keeps the prefill there (local prefill and decode) when its policy says
so.

ai-dynamo/dynamo ``lib/kv-router/src/conditional_disagg.rs`` (stored versions @ 088ca50 and @ 48bbf30, the
same predicates) and the "Conditional Disaggregation" guide
(https://docs.nvidia.com/dynamo/dev/advanced-customizations/conditional-disaggregation, also v1.6.2). Modes
(``--router-conditional-disagg-config '{"policy": ...}'``, default ``isl_bounding``):

- ``isl_bounding`` (``IslBoundingPolicy``): local when ``eff_isl < eff_isl_threshold`` and
  ``eff_isl / max(prompt, 1) < eff_isl_ratio_threshold``, both strict, where ``eff_isl`` is the prompt's
  tokens less the chosen decode worker's cached tokens (never below 0). Defaults 2,048 tokens and 0.7
  (``DEFAULT_CONDITIONAL_DISAGG_EFF_ISL_THRESHOLD`` / ``..._RATIO_THRESHOLD``).
- ``prefill_load`` (``PrefillLoadPolicy``): local when the prefill worker the prefill router would pick is
  busy, ``active_tokens > threshold x max_num_batched_tokens`` (its doc comment: the predicate the router's
  queue parks requests on). The threshold is ``prefill_busy_threshold``, else ``--router-queue-threshold``;
  Dynamo leaves both unset by default (router queueing is off unless set), and then the signal is missing
  and prefill_load never keeps a request local. Here the default is 4.0, the default
  ``--router-queue-threshold`` had in earlier releases; ``prefill_busy_threshold=0`` is Dynamo's unset (never
  busy; Dynamo's own 0, busy at any pending token, is not expressible). ``max_num_batched_tokens`` is the
  engines' prefill budget per iteration: 8,192, the engine profiles' (costmodel/profiles.py,
  ``EngineLimits``); a policy is not shown the engines' limits.
- ``isl_or_load`` (``IslOrLoadPolicy``): either; the ISL condition is asked first.

The decode gate (``decode_busy_threshold``, unset by default): a local verdict is overruled, the request
disaggregated, when the chosen decode worker's projected active decode blocks, with the request's, exceed
that fraction of its KV capacity. Here: ``active_tokens + prompt > threshold x kv_capacity_tokens`` (the
disaggregated decode router's accounting, every sequence's blocks its own; kv_overlap_cost.decode_cost); 0
is unset.

Dynamo's older disaggregated router (``examples/llm/components/disagg_router.py`` @ 02e16f7,
``PyDisaggregatedRouter``) prefilled remotely only when the uncached prompt exceeded
``max_local_prefill_length`` = 1,000 tokens *and* the prefill queue held fewer than ``max_prefill_queue_size``
= 2 requests: it kept a prompt local when short *or* when the prefill queue was busy, as ``isl_or_load`` does.

Reason codes: ``isl_bounding`` and ``prefill_load`` (local, the condition that held), ``remote_prefill``
(disaggregated: the mode's condition did not hold), ``decode_busy`` (disaggregated: the decode gate overruled
a local verdict). Inputs, all the ledger's and the prefix index's (no engine samples): the decode engine's
``cached_tokens`` and ``active_tokens``, the chosen prefill engine's ``pending_prefill_tokens`` (its active
sequences' uncached prompt tokens, as Dynamo's ``active_prefill_tokens`` with ``router_prefill_load_model``
none). The inner policy defaults to ``kv_overlap_cost`` (Dynamo's KV router as it routes a disaggregated
deployment); its prefill pick is the worker whose load is asked. What the model cannot express: Dynamo's
newer "effective" ISL subtracts a *weighted* cache credit (48bbf30: host and disk tiers too, at lower
weights) where calroute's prefix index knows one tier, so ``eff_isl`` here is the device overlap's (088ca50);
Dynamo counts whole blocks; its AIC prefill load model and the router queue are left out. Our own code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from calroute.policies.base import check
from calroute.policies.decider import Decider, DeciderParams, member, uncached_tokens
from calroute.policies.search_space import tunable, tunable_int
from calroute.types import Admission, ClusterView, RouteDecision

MODES = ("isl_bounding", "prefill_load", "isl_or_load")

ISL_BOUNDING = "isl_bounding"
PREFILL_LOAD = "prefill_load"
REMOTE = "remote_prefill"
DECODE_BUSY = "decode_busy"


@dataclass(frozen=True)
class Params(DeciderParams):
    inner: str = "kv_overlap_cost"
    mode: str = "isl_bounding"
    eff_isl_threshold: int = field(default=2048, metadata=tunable_int(64, 32768, log=True))
    eff_isl_ratio_threshold: float = field(default=0.7, metadata=tunable(0.0, 1.0))
    # x max_num_batched_tokens; 0: unset (Dynamo's default: prefill_load never fires)
    prefill_busy_threshold: float = field(default=4.0, metadata=tunable(0.25, 16.0, log=True))
    max_num_batched_tokens: int = 8192
    # x the decode engine's KV capacity; 0: unset (Dynamo's default: no decode gate)
    decode_busy_threshold: float = 0.0

    def __post_init__(self) -> None:
        check(self.mode in MODES, f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        check(self.eff_isl_threshold >= 0, f"eff_isl_threshold must be >= 0, got {self.eff_isl_threshold}")
        check(
            0.0 <= self.eff_isl_ratio_threshold <= 1.0,
            f"eff_isl_ratio_threshold must be in [0, 1], got {self.eff_isl_ratio_threshold}",
        )
        for name in ("prefill_busy_threshold", "decode_busy_threshold"):
            value = getattr(self, name)
            check(value >= 0 and math.isfinite(value), f"{name} must be finite and >= 0, got {value}")
        check(
            self.max_num_batched_tokens >= 1,
            f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}",
        )
        super().__post_init__()


class PdDynamo(Decider):
    name: ClassVar[str] = "pd_dynamo"

    params: Params

    def decide(self, adm: Admission, view: ClusterView, d: RouteDecision) -> RouteDecision:
        pr = self.params
        prompt = adm.prompt_tokens
        dec = member(view.decode, d.decode_id)
        reason = ""
        if pr.mode != "prefill_load":
            eff_isl = uncached_tokens(prompt, dec.cached_tokens)
            if eff_isl < pr.eff_isl_threshold and eff_isl / max(prompt, 1) < pr.eff_isl_ratio_threshold:
                reason = ISL_BOUNDING
        if not reason and pr.mode != "isl_bounding" and pr.prefill_busy_threshold > 0:
            pending = member(view.prefill, d.prefill_id).pending_prefill_tokens
            if pending > pr.prefill_busy_threshold * pr.max_num_batched_tokens:
                reason = PREFILL_LOAD
        if not reason:
            return self.remote(d, REMOTE)
        gate = pr.decode_busy_threshold
        if gate > 0 and dec.active_tokens + prompt > gate * dec.kv_capacity_tokens:
            return self.remote(d, DECODE_BUSY)
        return self.local(d, reason)
