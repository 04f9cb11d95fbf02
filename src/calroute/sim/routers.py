"""The routers of a simulated run: one Router, or a RouterGroup of several (sim/replicas.py), each built from
the run's recipe with a ledger, a prefix index and seeds of its own."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from calroute.costmodel.calibration import Calibration
from calroute.routing.build import PolicyWrapper, build_router, replica_seeds
from calroute.routing.ledger import Ledger
from calroute.routing.prefix_index import PrefixIndex
from calroute.routing.router import Router
from calroute.routing.seeds import derive_seed
from calroute.sim.herd import near_best
from calroute.sim.replicas import HERD_WINDOW_S, RouterGroup
from calroute.types import PREFIX_BLOCK_TOKENS, InstanceSpec


@dataclass(frozen=True)
class RouterRecipe:
    """How each router of a run is built: build_router's arguments, and the herd's mitigation (sim/herd.py:
    NearBest's tolerance; None: off)."""

    policy: str
    params: Mapping[str, Any]
    calibration: Calibration
    predictor: str = "bucket"
    predictor_noise: float = 0.0
    online_calibration: bool = False
    near_best: float | None = None

    def build(
        self, instances: Sequence[InstanceSpec], seed: int, replica: int, indexed: bool, precise: bool
    ) -> Router:
        """Router ``replica`` (0: the only one of a run with one, seeded as the run); ``indexed``: a prefix
        index of its own, fed by its placements unless ``precise`` (then by the engines' KV events)."""
        wrap: PolicyWrapper | None = None
        if self.near_best is not None:
            wrap = _near_best(self.near_best, derive_seed(seed, f"near_best/{replica}"))
        return build_router(
            self.policy,
            self.params,
            self.calibration,
            Ledger(instances, self.calibration),
            seeds=replica_seeds(seed, replica),
            predictor=self.predictor,
            predictor_noise=self.predictor_noise,
            online_calibration=self.online_calibration,
            prefix=PrefixIndex(instances, PREFIX_BLOCK_TOKENS) if indexed else None,
            record_placements=not precise,
            wrap=wrap,
        )


def run_routers(
    recipe: RouterRecipe,
    instances: Sequence[InstanceSpec],
    seed: int,
    indexed: bool,
    precise: bool,
    routers: int = 1,
    balancer: str = "round_robin",
    share_delay_s: float | None = None,
) -> Router | RouterGroup:
    """What a run's ClusterSim talks to: one plain Router (one router without the mitigation, the run as it
    always was), else a group, whose herd is counted within one share delay (without sharing, or at delay
    0, within HERD_WINDOW_S)."""
    if routers == 1 and recipe.near_best is None:
        return recipe.build(instances, seed, 0, indexed, precise)
    return RouterGroup(
        [recipe.build(instances, seed, i, indexed, precise) for i in range(routers)],
        balancer,
        seed,
        share_delay_s,
        share_delay_s or HERD_WINDOW_S,
    )


def _near_best(tolerance: float, seed: int) -> PolicyWrapper:
    return lambda policy: near_best(policy, tolerance, seed)
