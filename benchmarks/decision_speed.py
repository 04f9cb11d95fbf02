"""Time one routing decision (policy.route on a prepared view) for 6 and 256 instances.

Baseline in the same process: least_loaded (JSQ) on the same views; the ratio shows what pricing costs.
Targets (issue 2): marginal_cost under 20 us at 6 instances (2P+4D) and under 200 us at 256.
Usage: python benchmarks/decision_speed.py [--json]
"""

from __future__ import annotations

import argparse
import json
import timeit

from calroute.costmodel.profiles import get_profile
from calroute.policies import make_policy
from calroute.types import Admission, ClusterView, InstanceState, Role, SloClass


def view(n_prefill: int, n_decode: int) -> ClusterView:
    def state(i: int, role: Role) -> InstanceState:
        return InstanceState(
            f"{role.value}-{i}",
            role,
            True,
            i % 7,
            0.05 * (i % 11),
            1000 * (i % 13),
            900 * (i % 17),
            60_000,
            i % 5,
            i % 3,
            0.02,
        )

    return ClusterView(
        1.0,
        12345,
        tuple(state(i, Role.PREFILL) for i in range(n_prefill)),
        tuple(state(i, Role.DECODE) for i in range(n_decode)),
    )


def per_call_us(policy_name: str, v: ClusterView, number: int) -> float:
    policy = make_policy(policy_name, {}, get_profile("a40-qwen2.5-3b").calibration)
    adm = Admission("r", 700, 180, SloClass.TIGHT)
    best = min(timeit.repeat(lambda: policy.route(adm, v), number=number, repeat=5))
    return best / number * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results = {}
    for label, (p, d), number in (("6", (2, 4), 20_000), ("256", (64, 192), 500)):
        v = view(p, d)
        mc = per_call_us("marginal_cost", v, number)
        jsq = per_call_us("least_loaded", v, number)
        results[label] = {"marginal_cost_us": mc, "least_loaded_us": jsq, "ratio_vs_least_loaded": mc / jsq}
    if args.json:
        print(json.dumps(results))
        return
    for label, r in results.items():
        print(
            f"{label:>4} instances: marginal_cost {r['marginal_cost_us']:7.2f} us, "
            f"least_loaded {r['least_loaded_us']:7.2f} us, ratio {r['ratio_vs_least_loaded']:.2f}"
        )


if __name__ == "__main__":
    main()
