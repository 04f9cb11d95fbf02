"""The paper's experiments, one module each, in one registry."""

from __future__ import annotations

from calroute.errors import ConfigError
from calroute.experiments.ablation import Ablation
from calroute.experiments.base import Experiment
from calroute.experiments.calibration import CalibrationValue
from calroute.experiments.failure_regions import FailureRegions
from calroute.experiments.fidelity import Fidelity
from calroute.experiments.frontier import Frontier
from calroute.experiments.heterogeneity import Heterogeneity
from calroute.experiments.mixed_bursty import MixedBursty
from calroute.experiments.noise import Noise
from calroute.experiments.prefix import PrefixReuse
from calroute.experiments.scarcity import Scarcity
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
    )
}


# What `calroute experiment all` runs: the paper's experiments. The others (prefix) run by name.
PAPER_EXPERIMENTS: tuple[str, ...] = tuple(name for name in EXPERIMENTS if name != "prefix")


def get_experiment(name: str) -> Experiment:
    if name not in EXPERIMENTS:
        raise ConfigError(f"unknown experiment {name!r}; known: {', '.join(EXPERIMENTS)}, all")
    return EXPERIMENTS[name]
