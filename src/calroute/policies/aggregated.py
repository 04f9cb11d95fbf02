"""aggregated: never disaggregate. Every request is local on its inner policy's decode engine, which prefills
the prompt itself (RouteDecision.local, reason ``aggregated``); the prefill engines get no work.

The other end from the disaggregating policies, for comparing against: an aggregated deployment of the decode
engines alone, routed by the inner policy's decode rule (default ``cache_aware``, vllm-router's and SGLang's
cache-aware policy, a common aggregated router). It is also llm-d's P/D handler with ``nonCachedTokens: 0``
(``--param pd_llmd.non_cached_tokens=0``, on llm-d's own scorers).

It needs no prefill engine: on a cluster without one (an aggregated cluster, ``ClusterShape(prefill=0)``), or
with none healthy, the inner policy, which picks a prefill engine the decision then drops, is shown the decode
pool in the prefill pool's place. Every other policy fails there (NoCandidateError naming the prefill pool),
the deciders too, since they may disaggregate. Our own code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from calroute.policies.base import healthy
from calroute.policies.decider import Decider, DeciderParams
from calroute.types import Admission, ClusterView, RouteDecision

AGGREGATED = "aggregated"


@dataclass(frozen=True)
class Params(DeciderParams):
    inner: str = "cache_aware"


class Aggregated(Decider):
    name: ClassVar[str] = "aggregated"

    params: Params

    def route(self, adm: Admission, view: ClusterView) -> RouteDecision:
        if not any(s.healthy for s in view.prefill):
            healthy(view.decode, "decode")  # no decode engine either: the error names the decode pool
            view = view.replace(prefill=view.decode)
        return super().route(adm, view)

    def decide(self, adm: Admission, view: ClusterView, d: RouteDecision) -> RouteDecision:
        del adm, view  # unused: every request stays local
        return self.local(d, AGGREGATED)
