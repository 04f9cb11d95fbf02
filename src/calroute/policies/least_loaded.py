"""least_loaded: join the shortest queue (JSQ) by in-flight requests, in each pool (Splitwise's rule)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from calroute.policies.base import argmin_rotating, healthy
from calroute.types import Admission, ClusterView, PicklesByConstructor, RouteDecision


@dataclass(frozen=True)
class Params(PicklesByConstructor):
    pass


class LeastLoaded:
    """Fewest in-flight requests (from the ledger); ties rotate with ``seq``."""

    name: ClassVar[str] = "least_loaded"
    reads_engine_samples: ClassVar[bool] = False

    def __init__(self, params: Params) -> None:
        self.params = params

    def route(self, adm: Admission, view: ClusterView) -> RouteDecision:
        pre = healthy(view.prefill, "prefill")
        dec = healthy(view.decode, "decode")
        p = argmin_rotating(tuple([float(s.in_flight) for s in pre]), view.seq)
        d = argmin_rotating(tuple([float(s.in_flight) for s in dec]), view.seq)
        return RouteDecision(pre[p].instance_id, dec[d].instance_id)
