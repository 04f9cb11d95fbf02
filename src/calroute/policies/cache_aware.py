"""cache_aware: vllm-router's and SGLang's cache-aware policy, prefix affinity unless the load is imbalanced.

vllm-project/router ``src/policies/cache_aware.rs`` @ 16917f4 (forked from SGLang's router; SGLang's model
gateway documents the same rule and defaults), applied to each pool on its own:

1. the pool is *imbalanced* when ``max_load - min_load > balance_abs_threshold`` and
   ``max_load > balance_rel_threshold * min_load``: route to the least-loaded worker;
2. otherwise, if the best match rate (the longest prefix any worker is expected to hold, over the prompt)
   is above ``cache_threshold`` (strictly): route to that worker;
3. otherwise: route to the least-loaded worker. The file's header comment says "the worker with the
   smallest tree (most available cache capacity)", but its code, like SMG's docs, takes the
   least-loaded worker; this module follows the code.

Defaults are the command line's (``src/main.rs`` @ 03e9af5: ``--cache-threshold 0.3``,
``--balance-abs-threshold 64``, ``--balance-rel-threshold 1.5``), which are SGLang's too; the policy's
in-code default config and ``docs/load_balancing`` use 0.5 / 32 / 1.1 (``--param
cache_aware.cache_threshold=0.5 --param cache_aware.balance_abs_threshold=32 --param
cache_aware.balance_rel_threshold=1.1``). In P/D mode the prefill and decode policies default to the same
policy, each with its own tree, so both pools follow this rule.

Inputs: a worker's load is the router's count of requests sent to it and not finished, ``in_flight``
(the ledger's, fresh; ``reads_engine_samples`` False). The match rate is ``cached_tokens /
prompt_tokens`` from the router's prefix index, in place of vllm-router's matched characters over the
request's characters in its approximate radix tree. Loads are taken over the healthy members (vllm-router
takes min and max over all workers of the model). Ties rotate with ``seq``; vllm-router takes the first
least-loaded worker and the tree's tenant. Left out: session keys, tree eviction, the stale-tenant and
random fallbacks. Our own code (docs/prefix.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from calroute.policies.base import argmin_rotating, check, healthy
from calroute.policies.search_space import tunable, tunable_int
from calroute.types import Admission, ClusterView, InstanceState, RouteDecision


@dataclass(frozen=True)
class Params:
    cache_threshold: float = field(default=0.3, metadata=tunable(0.0, 1.0))
    balance_abs_threshold: int = field(default=64, metadata=tunable_int(0, 512))
    balance_rel_threshold: float = field(default=1.5, metadata=tunable(1.0, 4.0))

    def __post_init__(self) -> None:
        check(
            0.0 <= self.cache_threshold <= 1.0,
            f"cache_threshold must be in [0, 1], got {self.cache_threshold}",
        )
        check(
            self.balance_abs_threshold >= 0,
            f"balance_abs_threshold must be >= 0, got {self.balance_abs_threshold}",
        )
        check(
            self.balance_rel_threshold >= 1.0 and math.isfinite(self.balance_rel_threshold),
            f"balance_rel_threshold must be finite and >= 1, got {self.balance_rel_threshold}",
        )


def imbalanced(pool: list[InstanceState], params: Params) -> bool:
    """Both thresholds exceeded, over the pool's in-flight counts."""
    loads = [s.in_flight for s in pool]
    lo, hi = min(loads), max(loads)
    return hi - lo > params.balance_abs_threshold and hi > params.balance_rel_threshold * lo


def pick(pool: list[InstanceState], prompt_tokens: int, seq: int, params: Params) -> int:
    """Index into ``pool`` of the chosen member."""
    least_loaded = tuple(float(s.in_flight) for s in pool)
    if imbalanced(pool, params):
        return argmin_rotating(least_loaded, seq)
    best = argmin_rotating(tuple(-float(s.cached_tokens) for s in pool), seq)
    cached = pool[best].cached_tokens
    rate = min(1.0, cached / prompt_tokens) if prompt_tokens > 0 and cached > 0 else 0.0
    if rate > params.cache_threshold:
        return best
    return argmin_rotating(least_loaded, seq)


class CacheAware:
    name: ClassVar[str] = "cache_aware"
    reads_engine_samples: ClassVar[bool] = False

    def __init__(self, params: Params) -> None:
        self.params = params

    def route(self, adm: Admission, view: ClusterView) -> RouteDecision:
        pre = healthy(view.prefill, "prefill")
        dec = healthy(view.decode, "decode")
        p = pick(pre, adm.prompt_tokens, view.seq, self.params)
        d = pick(dec, adm.prompt_tokens, view.seq, self.params)
        return RouteDecision(pre[p].instance_id, dec[d].instance_id)
