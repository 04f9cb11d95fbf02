"""random: a uniformly random healthy member of each pool, from a stateless seeded hash of ``seq``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from calroute.policies.base import healthy
from calroute.splitmix import hash64
from calroute.types import Admission, ClusterView, RouteDecision


@dataclass(frozen=True)
class Params:
    seed: int = 0


class RandomPick:
    name: ClassVar[str] = "random"
    reads_engine_samples: ClassVar[bool] = False

    def __init__(self, params: Params) -> None:
        self.params = params

    def route(self, adm: Admission, view: ClusterView) -> RouteDecision:
        pre = healthy(view.prefill, "prefill")
        dec = healthy(view.decode, "decode")
        seed = self.params.seed
        p = hash64(seed, view.seq, 1) % len(pre)
        d = hash64(seed, view.seq, 2) % len(dec)
        return RouteDecision(pre[p].instance_id, dec[d].instance_id)
