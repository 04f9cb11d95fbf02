"""clairvoyant: marginal_cost fed the truth, a clairvoyant marginal_cost. Not a bound.

It prices exactly as marginal_cost does, with its parameters, but the simulator shows it the truth: each
request's true output length (the oracle predictor, costmodel/predictors.py) and each engine's state as it is
at that instant (queued prefill work in the hardware's seconds, KV in use and committed, the true prefix-cache
hits), where marginal_cost sees its ledger's estimates and metrics up to a sampling period old.

What it shows: what perfect inputs are worth to this cost function, with these weights, routing greedily one
request at a time. Its gap to marginal_cost is the cost of marginal_cost's estimates (predicted lengths, the
ledger's backlog, stale samples), for this way of pricing.

What it does not show: how much any router could gain. It is no bound: the same prices on better inputs can
route worse (it has scored below marginal_cost, docs/results/sim/headroom/), its weights were tuned for
estimates, and a greedy choice per request ignores the requests still to come. An upper bound that is one,
the idle perfect-cache ceiling, is experiments/kit/ceiling.py.

Simulator only: a proxy has neither the true lengths nor the engines' instantaneous state, so the proxy and
the live runs refuse it by name (policies.SIM_ONLY_POLICIES). It was called ``oracle`` before: the registry
answers that name with an error naming this one (policies.RENAMED).
"""

from __future__ import annotations

from typing import ClassVar

from calroute.costmodel.calibration import Calibration
from calroute.policies.marginal_cost import MarginalCost, Params
from calroute.types import Admission, ClusterView, RouteDecision


class Clairvoyant:
    name: ClassVar[str] = "clairvoyant"
    reads_engine_samples: ClassVar[bool] = True
    # The simulator builds this policy's view from its engines' true state (ClusterSim), not the ledger.
    needs_true_state: ClassVar[bool] = True

    def __init__(self, params: Params, calibration: Calibration) -> None:
        # By composition: the compiled build (setup.py) compiles MarginalCost, and compiled classes cannot
        # be subclassed from interpreted code.
        self._priced = MarginalCost(params, calibration)
        self.params = params

    def route(self, adm: Admission, view: ClusterView) -> RouteDecision:
        return self._priced.route(adm, view)
