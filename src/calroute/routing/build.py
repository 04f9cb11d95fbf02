"""The router as the simulator's runs and the proxy both assemble it: the policy by name, the predictor,
their seeds, and online recalibration if asked for."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from calroute.costmodel.calibration import Calibration
from calroute.costmodel.online import OnlineCalibrator
from calroute.costmodel.predictors import make_predictor
from calroute.policies import RoutingPolicy, make_policy, registered
from calroute.routing.ledger import Ledger
from calroute.routing.prefix_index import PrefixIndex
from calroute.routing.router import DecisionHook, OnlineRecalibration, PolicyFactory, Router
from calroute.routing.seeds import RouterSeeds, derive_seed

PolicyWrapper = Callable[[RoutingPolicy], RoutingPolicy]


def replica_seeds(seed: int, replica: int) -> RouterSeeds:
    """The seeds of replica ``replica`` of a run's routers: the first has the run's own (one router is the
    run as it always was), the others streams of their own, as separate processes would draw."""
    if replica == 0:
        return RouterSeeds.of_run(seed)
    return RouterSeeds(
        policy=derive_seed(seed, f"policy/{replica}"), predictor=derive_seed(seed, f"predictor/{replica}")
    )


def build_router(
    policy: str,
    params: Mapping[str, Any],
    calibration: Calibration,
    ledger: Ledger,
    *,
    seeds: RouterSeeds,
    predictor: str = "bucket",
    predictor_noise: float = 0.0,
    online_calibration: bool = False,
    policy_factory: PolicyFactory | None = None,
    prefix: PrefixIndex | None = None,
    record_placements: bool = True,
    on_decision: DecisionHook | None = None,
    wrap: PolicyWrapper | None = None,
) -> Router:
    """A router pricing with ``calibration``; a ConfigError names a bad policy, parameter or predictor.

    A seeded policy without a "seed" in ``params`` gets ``seeds.policy`` (if not None). With
    ``online_calibration``, refits rebuild the policy with ``policy_factory`` (default: this policy with
    these parameters; the proxy's follows a policy switched at run time). ``prefix``,
    ``record_placements`` and ``on_decision``: as Router takes them. ``wrap``: a decorator around the
    policy (and around each one online recalibration rebuilds), e.g. the herd's mitigation (sim/herd.py).
    """
    params = dict(params)
    if seeds.policy is not None and registered(policy).seeded and "seed" not in params:
        params["seed"] = seeds.policy
    pol = make_policy(policy, params, calibration)
    if wrap is not None:
        pol = wrap(pol)
    if getattr(pol, "needs_true_state", False):
        predictor, predictor_noise = "oracle", 0.0  # the clairvoyant knows the true lengths too
    pred = make_predictor(predictor, noise=predictor_noise, seed=seeds.predictor)
    online = None
    if online_calibration:
        factory = policy_factory or (lambda cal: make_policy(policy, params, cal))
        if wrap is not None:
            factory = _wrapped(factory, wrap)
        online = OnlineRecalibration(OnlineCalibrator(calibration), factory)
    return Router(
        pol,
        pred,
        ledger,
        on_decision=on_decision,
        online=online,
        prefix=prefix,
        record_placements=record_placements,
    )


def _wrapped(factory: PolicyFactory, wrap: PolicyWrapper) -> PolicyFactory:
    return lambda cal: wrap(factory(cal))
