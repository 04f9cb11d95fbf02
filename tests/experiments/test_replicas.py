"""The replicas experiment: its cells (every workload and policy at its own one-router saturation, N routers
alone and sharing, both prefix sources where prompts have blocks, the mitigation beside each) and a quick
run's report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calroute.costmodel.profiles import get_profile
from calroute.experiments import EXPERIMENTS, PAPER_EXPERIMENTS
from calroute.experiments.kit.runner import Scale, run_experiment
from calroute.experiments.kit.sim_backend import ReplicaVariant, SimBackend, sim_setup
from calroute.experiments.replicas import (
    NEAR_BEST,
    POLICIES,
    ROUTERS,
    SHARE_DELAY_S,
    WORKLOADS,
    Replicas,
    label,
    sources_of,
    variants,
)


def test_it_runs_by_name_and_not_with_the_papers() -> None:
    assert "replicas" in EXPERIMENTS and "replicas" not in PAPER_EXPERIMENTS


def test_each_workload_and_policy_is_a_cell_at_its_own_one_router_saturation() -> None:
    cells = Replicas().cells(False)
    assert {(c.tags["workload"], c.tags["policy"]) for c in cells} == {
        (w, p) for w in WORKLOADS for p in POLICIES
    }
    for c in cells:
        assert (c.prefill, c.decode) == (2, 4) and c.rate_rps is None
        assert c.saturate_on == (c.tags["policy"],) and c.saturate_on_run_seeds
        labels = [v.label for v in c.variants]
        assert len(labels) == len(set(labels))
        assert all(isinstance(v, ReplicaVariant) and v.policy == c.tags["policy"] for v in c.variants)


@pytest.mark.parametrize(
    ("workload", "sources"),
    [("mixed-bursty", {"approximate"}), ("shared-prefix", {"approximate", "precise"})],
)
def test_every_count_of_routers_runs_alone_and_sharing_with_and_without_the_mitigation(
    workload: str, sources: set[str]
) -> None:
    cell = next(c for c in Replicas().cells(False) if c.tags["workload"] == workload)
    made = variants(cell.tags["policy"], sources_of(workload), quick=False)
    assert cell.variants == made
    by_label = {v.label: v for v in made}
    assert {v.prefix_source for v in made} == sources
    for source in sources:
        for n in ROUTERS:
            for shared in (False, True) if n > 1 else (False,):
                for near in (False, True):
                    v = by_label[label(cell.tags["policy"], source, n, shared, near)]
                    assert (v.routers, v.balancer) == (n, "round_robin")
                    assert v.share_delay_s == (SHARE_DELAY_S if shared else None)
                    assert v.near_best == (NEAR_BEST if near else None)


def test_a_replica_variant_sets_the_routers_of_its_runs() -> None:
    profile = get_profile("a40-qwen2.5-3b")
    v = ReplicaVariant(
        "x", "marginal_cost", routers=4, balancer="session", share_delay_s=0.01, prefix_source="precise"
    )
    setup = sim_setup(profile, 2, 4, v, "approximate")
    assert (setup.routers, setup.balancer, setup.share_delay_s, setup.prefix_source) == (
        4,
        "session",
        0.01,
        "precise",
    )
    plain = sim_setup(profile, 2, 4, ReplicaVariant("y", "marginal_cost"), "precise")
    assert (plain.routers, plain.share_delay_s, plain.near_best, plain.prefix_source) == (
        1,
        None,
        None,
        "precise",
    )


def test_a_quick_run_reports_the_routers_against_one_and_keeps_the_herd(tmp_path: Path) -> None:
    exp = Replicas()
    (result,) = run_experiment(
        exp, SimBackend(get_profile("a40-qwen2.5-3b")), True, tmp_path, scale=Scale(300, (0, 1))
    )
    assert result.seeds() == [0, 1] and {r.label for r in result.runs} == {
        v.label for v in exp.cells(True)[0].variants
    }
    exp_dir = tmp_path / "replicas"
    report = (exp_dir / "report.md").read_text()
    assert "### Summary: N routers against one" in report and "herd: across / within" in report
    assert "near_best - plain" in report and "marginal_cost-approximate-N2-alone-session" in report
    assert (exp_dir / "shared-prefix-marginal_cost-routers.png").stat().st_size > 1000
    herd = json.loads((exp_dir / "herd.json").read_text())["shared-prefix-marginal_cost"]
    two = herd[label("marginal_cost", "precise", 2, True)]
    assert two["seeds"] == [0, 1] and two["cross_pairs"] >= two["cross_same_decode"] >= 0
    assert label("marginal_cost", "precise", 1) not in herd  # one router: no group, no herd
    # the records gone (results copied elsewhere), the report still has the herd
    for path in (exp_dir / "records").rglob("*.replicas.json"):
        path.unlink()
    assert exp.report([result], exp_dir) == report
