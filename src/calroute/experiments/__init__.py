"""The catalogue: the paper's experiments (and the studies beside them), one module each, in one registry.
What they run on (cells, the runner, the backends, the report) is kit/."""

from __future__ import annotations

from calroute.errors import ConfigError
from calroute.experiments.ablation import Ablation
from calroute.experiments.calibration import CalibrationValue
from calroute.experiments.failure_regions import FailureRegions
from calroute.experiments.fidelity import Fidelity
from calroute.experiments.frontier import Frontier
from calroute.experiments.headroom import Headroom
from calroute.experiments.heterogeneity import Heterogeneity
from calroute.experiments.kit.cells import Experiment
from calroute.experiments.local_prefill import LocalPrefill
from calroute.experiments.mixed_bursty import MixedBursty
from calroute.experiments.noise import Noise
from calroute.experiments.prefix import PrefixReuse
from calroute.experiments.replicas import Replicas
from calroute.experiments.scarcity import Scarcity
from calroute.experiments.tuned import TunedCheck
from calroute.experiments.width import Width

EXPERIMENTS: dict[str, Experiment] = {
    e.name: e
    for e in (
        MixedBursty(),
        CalibrationValue(),
        Heterogeneity(),
        Width(),
        Scarcity(),
        Frontier(),
        Ablation(),
        Noise(),
        FailureRegions(),
        Fidelity(),
        PrefixReuse(),
        Headroom(),
        TunedCheck(),
        LocalPrefill(),
        Replicas(),
    )
}


# What `calroute experiment all` runs: the paper's experiments. The others run by name: prefix, local
# prefill, replicas, and the tuning's headroom and live check, which read the tuned parameters in
# docs/results/tuning.
PAPER_EXPERIMENTS: tuple[str, ...] = tuple(
    name for name in EXPERIMENTS if name not in ("prefix", "local-prefill", "replicas", "headroom", "tuned")
)


def get_experiment(name: str) -> Experiment:
    if name not in EXPERIMENTS:
        raise ConfigError(f"unknown experiment {name!r}; known: {', '.join(EXPERIMENTS)}, all")
    return EXPERIMENTS[name]
