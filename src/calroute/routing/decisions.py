"""The decision log: every routing decision with the admission and the cluster view it was made on.

The same JSONL format comes out of the simulator and the proxy, so decisions recorded in one can be
replayed through the other's policy (the decision-equivalence test), and a surprising live decision can be
reproduced offline.
"""

from __future__ import annotations

import json
from typing import IO, Any

from calroute.routing.router import Decision
from calroute.types import Admission, ClusterView, InstanceState, Role, RouteDecision, SloClass


def _state(s: InstanceState) -> dict[str, Any]:
    d = s.as_dict()
    d["role"] = s.role.value
    d["metrics_age_s"] = None if s.metrics_age_s == float("inf") else s.metrics_age_s
    return d


def decision_to_json(adm: Admission, view: ClusterView, decision: RouteDecision) -> str:
    return json.dumps(
        {
            "admission": {**adm.as_dict(), "slo_class": adm.slo_class.value},
            "view": {
                "now_s": view.now_s,
                "seq": view.seq,
                "prefill": [_state(s) for s in view.prefill],
                "decode": [_state(s) for s in view.decode],
            },
            "decision": {
                "prefill_id": decision.prefill_id,
                "decode_id": decision.decode_id,
                "local": decision.local,
                "reason": decision.reason,
            },
        },
        separators=(",", ":"),
    )


def _from_state(d: dict[str, Any]) -> InstanceState:
    age = d["metrics_age_s"]
    return InstanceState(
        **{**d, "role": Role(d["role"]), "metrics_age_s": float("inf") if age is None else age}
    )


def decision_from_json(line: str) -> tuple[Admission, ClusterView, tuple[str, str, bool]]:
    """The admission, the view, and the decision as (prefill id, decode id, local)."""
    d = json.loads(line)
    a = d["admission"]
    v = d["view"]
    adm = Admission(
        a["request_id"], a["prompt_tokens"], a["predicted_output_tokens"], SloClass(a["slo_class"])
    )
    view = ClusterView(
        v["now_s"],
        v["seq"],
        tuple(_from_state(s) for s in v["prefill"]),
        tuple(_from_state(s) for s in v["decode"]),
    )
    out = d["decision"]
    return adm, view, (out["prefill_id"], out["decode_id"], bool(out.get("local", False)))


class DecisionLog:
    """A Router on_decision hook that appends to a JSONL stream."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def __call__(self, d: Decision) -> None:
        self._stream.write(decision_to_json(d.admission, d.view, d.route) + "\n")
