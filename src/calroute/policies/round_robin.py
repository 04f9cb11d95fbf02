"""round_robin: each pool in turn, independently (what vLLM's toy proxy and most P/D proxies do)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from calroute.policies.base import healthy
from calroute.types import Admission, ClusterView, PicklesByConstructor, RouteDecision


@dataclass(frozen=True)
class Params(PicklesByConstructor):
    pass


class RoundRobin:
    """Decision ``seq`` goes to healthy member ``seq mod n`` of each pool."""

    name: ClassVar[str] = "round_robin"
    reads_engine_samples: ClassVar[bool] = False

    def __init__(self, params: Params) -> None:
        self.params = params

    def route(self, adm: Admission, view: ClusterView) -> RouteDecision:
        pre = healthy(view.prefill, "prefill")
        dec = healthy(view.decode, "decode")
        return RouteDecision(pre[view.seq % len(pre)].instance_id, dec[view.seq % len(dec)].instance_id)
