"""The proxy and the simulator make identical decisions on identical inputs.

Both record every decision with the admission and the cluster view it saw (routing/decisions.py); replaying
one's log through the other's policy object must reproduce every decision.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from calroute.cluster.file import ClusterFile
from calroute.costmodel.predictors import make_predictor
from calroute.costmodel.profiles import get_profile
from calroute.policies import make_policy
from calroute.routing.decisions import DecisionLog, decision_from_json
from calroute.routing.ledger import Ledger
from calroute.routing.router import Router
from calroute.sim.simulator import ClusterShape, ClusterSim
from calroute.types import RequestSpec, SloClass
from tests.emulator.http import request
from tests.proxy.harness import RunningProxy

PROFILE = get_profile("a40-qwen2.5-3b")


@pytest.mark.parametrize("policy", ["marginal_cost", "power_of_two", "length_heuristic", "queue_kv"])
def test_live_decisions_replay_identically(
    cluster: ClusterFile, proxy_for: Callable[..., RunningProxy], policy: str
) -> None:
    p = proxy_for(cluster, policy=policy)
    rng = random.Random(1)

    def client(i: int) -> None:
        for _ in range(6):
            n = rng.choice([2, 20, 120])
            request(
                f"{p.url}/v1/completions",
                {"prompt": "word " * rng.randint(10, 400), "max_tokens": n, "ignore_eos": True},
                timeout_s=60,
            )

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert p.proxy.cfg.decision_log_path is not None
    lines = p.proxy.cfg.decision_log_path.read_text().splitlines()
    assert len(lines) == 24
    views = [decision_from_json(line) for line in lines]
    assert any(s.backlog_s > 0 for _, v, _ in views for s in v.decode)  # the views carried live load
    simulator_side = make_policy(policy, {}, PROFILE.calibration)
    for adm, view, decided in views:
        d = simulator_side.route(adm, view)
        assert (d.prefill_id, d.decode_id, d.local) == decided


def test_simulated_decisions_replay_identically_through_the_proxy(
    cluster: ClusterFile, proxy_for: Callable[..., RunningProxy], tmp_path: Path
) -> None:
    shape = ClusterShape(2, 2)
    log = tmp_path / "sim-decisions.jsonl"
    rng = random.Random(3)
    t = 0.0
    reqs = []
    for i in range(400):
        t += rng.expovariate(15.0)
        reqs.append(
            RequestSpec(
                f"r{i}",
                t,
                rng.randint(10, 3000),
                rng.randint(1, 800),
                SloClass.TIGHT if i % 3 else SloClass.LOOSE,
            )
        )
    with log.open("w") as f:
        ledger = Ledger(shape.instances(PROFILE.limits.kv_capacity_tokens), PROFILE.calibration)
        router = Router(
            make_policy("marginal_cost", {}, PROFILE.calibration),
            make_predictor("bucket"),
            ledger,
            DecisionLog(f),
        )
        ClusterSim(PROFILE, shape, router, "marginal_cost").run(reqs, lambda rec: None)
    proxy_side = proxy_for(cluster, policy="marginal_cost").proxy.router.policy
    lines = log.read_text().splitlines()
    assert len(lines) == 400
    for line in lines:
        adm, view, decided = decision_from_json(line)
        d = proxy_side.route(adm, view)
        assert (d.prefill_id, d.decode_id, d.local) == decided
