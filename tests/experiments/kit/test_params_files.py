"""An experiment run with a params file: the file's parameters under each variant of its policy, the
variant's own on top, the other policies untouched."""

from __future__ import annotations

from calroute.experiments import get_experiment
from calroute.experiments.kit.params_files import WithParams, experiment_policies


def test_the_files_parameters_start_each_variant_of_its_policy() -> None:
    base = get_experiment("ablation")
    tuned = WithParams(base, "marginal_cost", {"w_b": 2.5, "use_slo": True})
    assert (tuned.name, tuned.title) == (base.name, base.title)
    for before, after in zip(base.cells(True), tuned.cells(True), strict=True):
        for v0, v1 in zip(before.variants, after.variants, strict=True):
            if v0.policy != "marginal_cost":
                assert v1 == v0
                continue
            assert v1.params["w_b"] == 2.5
            # what the experiment varies wins over the file
            assert v1.params["use_slo"] == v0.params.get("use_slo", True)
            assert (v1.label, v1.router, v1.predictor) == (v0.label, v0.router, v0.predictor)
    assert any(v.params.get("use_slo") is False for c in tuned.cells(True) for v in c.variants)


def test_experiment_policies() -> None:
    assert "marginal_cost" in experiment_policies(get_experiment("mixed-bursty"), True)
    assert "cache_aware" not in experiment_policies(get_experiment("mixed-bursty"), True)
