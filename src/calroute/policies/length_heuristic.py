"""length_heuristic: a threshold on the predicted output length decides how to pick the decode instance.

Rule: a request predicted to produce at least ``threshold_tokens`` tokens is long and goes to the decode
instance with the fewest in-flight requests (long requests occupy a decode slot for long, so they should
not pile up); a short request takes the next decode instance in round-robin order. Prefill is round-robin.
The paper's heuristic baseline thresholds predicted output length; its exact rule is not published.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from calroute.policies.base import argmin_rotating, check, healthy
from calroute.policies.search_space import tunable_int
from calroute.types import Admission, ClusterView, RouteDecision


@dataclass(frozen=True)
class Params:
    threshold_tokens: int = field(default=256, metadata=tunable_int(16, 4096, log=True))

    def __post_init__(self) -> None:
        check(self.threshold_tokens >= 1, f"threshold_tokens must be >= 1, got {self.threshold_tokens}")


class LengthHeuristic:
    name: ClassVar[str] = "length_heuristic"
    reads_engine_samples: ClassVar[bool] = False

    def __init__(self, params: Params) -> None:
        self.params = params

    def route(self, adm: Admission, view: ClusterView) -> RouteDecision:
        pre = healthy(view.prefill, "prefill")
        dec = healthy(view.decode, "decode")
        if adm.predicted_output_tokens >= self.params.threshold_tokens:
            d = argmin_rotating(tuple([float(s.in_flight) for s in dec]), view.seq)
        else:
            d = view.seq % len(dec)
        return RouteDecision(pre[view.seq % len(pre)].instance_id, dec[d].instance_id)
