"""What marginal_cost's eviction price does on a many-prefix workload (docs/prefix.md, "Pricing").

64 system prompts of 4-16 blocks of 512 tokens, chosen with Zipf(1.1) popularity, each request a unique
suffix of 32-1,024 tokens and 16-512 output tokens, Poisson arrivals, half tight; the paper's SLO targets;
2P+4D on the default profile, 1,500 requests a run. Many distinct prefixes compete for two prefill engines'
caches, which is where copying a prefix onto a second engine costs a later request its hit. Prints
marginal_cost's goodput against itself without the eviction price (w_evict=0) and against llm-d's mix,
paired over the seeds.

Usage: python scripts/prefix_eviction_probe.py [--rate 4] [--seeds 10]
"""

from __future__ import annotations

import argparse
import random

from calroute.costmodel.profiles import DEFAULT_PROFILE, get_profile
from calroute.experiments.kit.sim_backend import SimSetup, simulate_run
from calroute.results.stats import paired_difference
from calroute.sim.simulator import ClusterShape
from calroute.types import PREFIX_BLOCK_TOKENS, RequestSpec, SloClass

N_SYSTEM, N_REQUESTS = 64, 1500


def workload(rate_rps: float, seed: int) -> list[RequestSpec]:
    rng = random.Random(seed)
    sizes = [rng.randint(4, 16) for _ in range(N_SYSTEM)]  # blocks per system prompt
    weights = [1.0 / (k + 1) ** 1.1 for k in range(N_SYSTEM)]
    t_s = 0.0
    out = []
    for i in range(N_REQUESTS):
        t_s += rng.expovariate(rate_rps)
        k = rng.choices(range(N_SYSTEM), weights)[0]
        blocks = tuple(k * 100 + j for j in range(sizes[k]))  # an id stands for its block and all before it
        prompt = len(blocks) * PREFIX_BLOCK_TOKENS + rng.randint(32, 1024)
        output = max(16, min(512, int(rng.lognormvariate(4.8, 0.8))))
        slo = SloClass.TIGHT if rng.random() < 0.5 else SloClass.LOOSE
        out.append(RequestSpec(f"r{i}", t_s, prompt, output, slo, blocks))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=4.0, help="requests per second")
    ap.add_argument("--seeds", type=int, default=10)
    args = ap.parse_args()
    profile = get_profile(DEFAULT_PROFILE)
    variants = {
        "marginal_cost": ("marginal_cost", {}),
        "marginal_cost w_evict=0": ("marginal_cost", {"w_evict": 0.0}),
        "prefix_scorer_mix": ("prefix_scorer_mix", {}),
    }
    points: dict[str, list[float]] = {}
    for label, (policy, params) in variants.items():
        setup = SimSetup(profile, ClusterShape(2, 4), profile.calibration, policy_params={policy: params})
        points[label] = [
            100 * simulate_run(setup, policy, workload(args.rate, s), s, args.rate).summary.goodput
            for s in range(args.seeds)
        ]
        print(f"{label}: mean goodput {sum(points[label]) / args.seeds:.1f} %", flush=True)
    ours = points["marginal_cost"]
    for label in list(variants)[1:]:
        print(f"marginal_cost - {label}: {paired_difference(ours, points[label]).describe(1)} (points)")


if __name__ == "__main__":
    main()
