"""The router: predictor + policy + ledger, driven by request events. The simulator and the proxy both
call exactly this, so a policy sees the same kind of information in both."""

from __future__ import annotations

from collections.abc import Callable

from calroute.costmodel.predictors import OutputLengthPredictor
from calroute.ledger import Ledger
from calroute.policies.base import RoutingPolicy
from calroute.types import Admission, ClusterView, RouteDecision, SloClass

DecisionHook = Callable[[Admission, ClusterView, RouteDecision], None]


class Router:
    def __init__(
        self,
        policy: RoutingPolicy,
        predictor: OutputLengthPredictor,
        ledger: Ledger,
        on_decision: DecisionHook | None = None,
    ) -> None:
        self.policy = policy
        self.predictor = predictor
        self.ledger = ledger
        self.on_decision = on_decision

    def admit(
        self,
        request_id: str,
        prompt_tokens: int,
        slo_class: SloClass,
        now_s: float,
        oracle_output_tokens: int | None = None,
    ) -> tuple[Admission, RouteDecision]:
        """Predict, decide on the current view, and commit the decision to the ledger."""
        predicted = self.predictor.predict(prompt_tokens, oracle_output_tokens)
        adm = Admission(request_id, prompt_tokens, predicted, slo_class)
        view = self.ledger.view(now_s)
        decision = self.policy.route(adm, view)
        if self.on_decision is not None:
            self.on_decision(adm, view, decision)
        self.ledger.admit(
            request_id, decision.prefill_id, decision.decode_id, prompt_tokens, predicted, now_s
        )
        return adm, decision

    def prefill_done(self, request_id: str, now_s: float) -> None:
        self.ledger.prefill_done(request_id, now_s)

    def first_token(self, request_id: str, now_s: float) -> None:
        self.ledger.first_token(request_id, now_s)

    def done(self, request_id: str, prompt_tokens: int, output_tokens: int, now_s: float, ok: bool) -> None:
        self.ledger.done(request_id, now_s, output_tokens, ok)
        if ok:
            self.predictor.observe(prompt_tokens, output_tokens)
