"""Time one routing decision (policy.route on a prepared view) for 6 and 256 instances.

Baseline in the same process: least_loaded (JSQ) on the same views; the ratio shows what pricing costs.
Targets (issue 2): marginal_cost under 20 us at 6 instances (2P+4D) and under 200 us at 256.

With the prefix index (issue 25): hashing an 8k-token prompt (a list of ints, as a JSON body gives it) in
16-token blocks, matching its 512 hashes against an index where every engine holds a share of the prompt
and a full cache of other blocks, and marginal_cost's decision on the view with those hits. Targets: under
50 us at 6 engines, under 500 us at 256. Also the index's memory per million cached blocks.
Usage: python benchmarks/decision_speed.py [--json]
"""

from __future__ import annotations

import argparse
import json
import timeit
import tracemalloc

from calroute.costmodel.profiles import get_profile
from calroute.policies import make_policy
from calroute.routing.block_hash import block_hashes
from calroute.routing.ledger import Ledger
from calroute.routing.prefix_index import PrefixIndex
from calroute.types import Admission, ClusterView, InstanceSpec, InstanceState, Role, SloClass

PROMPT_TOKENS = 8192
BLOCK_TOKENS = 16


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


def prefix_decision_us(n_prefill: int, n_decode: int, number: int) -> dict[str, float]:
    """Hash + match + decide, and each part, per request, in microseconds."""
    v = view(n_prefill, n_decode)
    specs = [InstanceSpec(s.instance_id, s.role, 60_000) for s in (*v.prefill, *v.decode)]
    index = PrefixIndex(specs, BLOCK_TOKENS)
    prompt = [(7919 * i) % 150_000 for i in range(PROMPT_TOKENS)]
    hashes = block_hashes(prompt, BLOCK_TOKENS)
    for i, s in enumerate(specs):
        index.stored(s.instance_id, range(10**9 + i * 10**6, 10**9 + i * 10**6 + 3000))  # other prompts
        index.stored(s.instance_id, hashes[: (i * 37) % len(hashes)])  # a share of this one
    policy = make_policy("marginal_cost", {}, get_profile("a40-qwen2.5-3b").calibration)
    adm = Admission("r", PROMPT_TOKENS, 180, SloClass.TIGHT)
    cal = get_profile("a40-qwen2.5-3b").calibration
    ledger = Ledger(specs, cal)

    def decide() -> None:
        # what Router.admit does before committing: hash, match, the ledger's view with the hits, decide
        match = index.match(block_hashes(prompt, BLOCK_TOKENS))
        policy.route(adm, ledger.view(1.0, match))

    def decide_without_prefix() -> None:
        policy.route(adm, ledger.view(1.0))

    def best_us(fn: object) -> float:
        return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6  # type: ignore[arg-type]

    return {
        "total_us": best_us(decide),
        "without_prefix_us": best_us(decide_without_prefix),
        "hash_us": best_us(lambda: block_hashes(prompt, BLOCK_TOKENS)),
        "match_us": best_us(lambda: index.match(hashes)),
    }


def index_bytes_per_million_blocks() -> float:
    specs = [InstanceSpec(f"e{i}", Role.DECODE, 200_000 * BLOCK_TOKENS) for i in range(6)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    index = PrefixIndex(specs, BLOCK_TOKENS)
    for i, s in enumerate(specs):
        index.stored(s.instance_id, range(i * 10**7, i * 10**7 + 166_667))
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    blocks = sum(index.blocks_held(s.instance_id) for s in specs)
    return used / blocks * 1e6


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
        pfx = prefix_decision_us(p, d, max(20, number // 100))
        results[label].update(
            {f"prefix_{k}": x for k, x in pfx.items()}, prefix_ratio_vs_least_loaded=pfx["total_us"] / jsq
        )
    results["index_mib_per_million_blocks"] = {"value": index_bytes_per_million_blocks() / 2**20}
    if args.json:
        print(json.dumps(results))
        return
    for label, r in results.items():
        if label == "index_mib_per_million_blocks":
            print(f"prefix index: {r['value']:.1f} MiB per million cached blocks")
            continue
        print(
            f"{label:>4} instances: marginal_cost {r['marginal_cost_us']:7.2f} us, "
            f"least_loaded {r['least_loaded_us']:7.2f} us, ratio {r['ratio_vs_least_loaded']:.2f}; "
            f"with the prefix index, 8k-token prompt: {r['prefix_total_us']:7.1f} us "
            f"(hash {r['prefix_hash_us']:.1f}, match {r['prefix_match_us']:.1f}; "
            f"view and decision without them {r['prefix_without_prefix_us']:.1f}), "
            f"{r['prefix_ratio_vs_least_loaded']:.1f}x least_loaded"
        )


if __name__ == "__main__":
    main()
