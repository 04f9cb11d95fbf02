"""power_of_two: two distinct random candidates per pool, keep the one with fewer in-flight requests.

Mitzenmacher's two choices: nearly JSQ's balance, but robust to stale load information (no herding).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from calroute.policies.base import healthy
from calroute.splitmix import hash64
from calroute.types import Admission, ClusterView, InstanceState, RouteDecision


@dataclass(frozen=True)
class Params:
    seed: int = 0


def two_choices(pool: list[InstanceState], seed: int, seq: int, stream: int) -> tuple[int, int]:
    """Two distinct indices of ``pool`` (the same index twice when the pool has one member)."""
    n = len(pool)
    a = hash64(seed, seq, stream) % n
    if n == 1:
        return a, a
    b = (a + 1 + hash64(seed, seq, stream + 100) % (n - 1)) % n
    return a, b


class PowerOfTwo:
    name: ClassVar[str] = "power_of_two"
    reads_engine_samples: ClassVar[bool] = False

    def __init__(self, params: Params) -> None:
        self.params = params

    def _pick(self, pool: list[InstanceState], seq: int, stream: int) -> str:
        a, b = two_choices(pool, self.params.seed, seq, stream)
        return (pool[b] if pool[b].in_flight < pool[a].in_flight else pool[a]).instance_id

    def route(self, adm: Admission, view: ClusterView) -> RouteDecision:
        pre = healthy(view.prefill, "prefill")
        dec = healthy(view.decode, "decode")
        return RouteDecision(self._pick(pre, view.seq, 1), self._pick(dec, view.seq, 2))
