"""oracle: marginal_cost priced with what no live router can know, a bound on what routing can gain.

It prices exactly as marginal_cost does, with its parameters, but the simulator shows it the truth: each
request's true output length (the oracle predictor) and each engine's state as it is at that instant
(queued prefill work in the hardware's seconds, KV in use and committed, the true prefix-cache hits), where
marginal_cost sees its ledger's estimates and metrics up to a sampling period old. The gap between the two
is the headroom of better estimates; the gap from the best baseline to the oracle is the headroom of
routing on these prices at all (issue 26).

Simulator only: a proxy has neither the true lengths nor the engines' instantaneous state, so the proxy and
the live runs refuse it by name (policies.SIM_ONLY_POLICIES).
"""

from __future__ import annotations

from typing import ClassVar

from calroute.costmodel.calibration import Calibration
from calroute.policies.marginal_cost import MarginalCost, Params
from calroute.types import Admission, ClusterView, RouteDecision


class Oracle:
    name: ClassVar[str] = "oracle"
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
