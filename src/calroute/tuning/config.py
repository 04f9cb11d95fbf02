"""What a study is: everything that decides its trials' values. A stored study is resumed only under the
same configuration (``TuneConfig.key``); the trial count, the executor and the output path are not part of
it, so a study can be continued to more trials, on another executor, written elsewhere.

A study trains on one workload (a family or a trace) or on several families at once; several are kept
sorted by name, so the order they were given in changes neither the study nor its output."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calroute.costmodel.profiles import HardwareProfile
from calroute.errors import ConfigError
from calroute.experiments.kit.sim_backend import SimSetup
from calroute.policies import params_class
from calroute.policies.base import parse_params
from calroute.policies.params_file import params_dict
from calroute.policies.search_space import Range, declared_space, select
from calroute.sim.simulator import ClusterShape
from calroute.workload.source import WORKLOADS, WorkloadSource, workload_source

# Three rates around saturation: at it, and 10 % either side, so that tuned weights are not fitted to one
# point of the load curve (docs/tuning.md).
DEFAULT_RATE_FACTORS = (0.9, 1.0, 1.1)
SATURATION_TARGET = 0.85


@dataclass(frozen=True)
class WorkloadSpec:
    """A family by name, or a trace file replayed in ``windows`` windows (seed s on window s, so training
    and validation seeds replay distinct stretches of it)."""

    name: str
    requests: int
    windows: int = 1

    @property
    def is_trace(self) -> bool:
        return self.name not in WORKLOADS

    def source(self) -> WorkloadSource:
        return workload_source(self.name, self.requests, trace_windows=self.windows)


@dataclass(frozen=True)
class TuneConfig:
    policy: str
    workloads: tuple[WorkloadSpec, ...]  # one family or trace, or several families (sorted by name here)
    prefill: int
    decode: int
    train_seeds: tuple[int, ...]
    rate_factors: tuple[float, ...] = DEFAULT_RATE_FACTORS
    search: tuple[str, ...] | None = None  # None: every declared parameter
    fixed: Mapping[str, Any] = field(default_factory=dict)  # parameters set, not searched (--param)
    study_seed: int = 0
    batch_size: int = 8
    calibration_source: str = "profile"  # what the hardware is: a profile name or a calibration file
    calibration_sha256: str | None = None

    def __post_init__(self) -> None:
        _check_workloads(self.workloads)
        # sorted: a study is the same whatever order its families were named in
        object.__setattr__(self, "workloads", tuple(sorted(self.workloads, key=lambda w: w.name)))
        if not self.train_seeds:
            raise ConfigError("--seeds must be >= 1")
        if not self.rate_factors or any(not f > 0 for f in self.rate_factors):
            raise ConfigError(f"--rate-factors must be > 0, got {list(self.rate_factors)}")
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size must be >= 1, got {self.batch_size}")
        cls = params_class(self.policy)
        space = self.space
        clash = sorted(set(self.fixed) & set(space)) if self.search is not None else []
        if clash:
            raise ConfigError(f"--param {', '.join(clash)}: set with --param and searched with --search")
        parse_params(self.policy, cls, self.fixed)  # an unknown name or a bad value, named

    @property
    def names(self) -> tuple[str, ...]:
        """The workloads trained on, by name."""
        return tuple(w.name for w in self.workloads)

    @property
    def several(self) -> bool:
        """Trained on several families (a study of one keeps the single-workload key and output)."""
        return len(self.workloads) > 1

    @property
    def requests(self) -> int:
        return self.workloads[0].requests

    @property
    def space(self) -> dict[str, Range]:
        """The ranges searched: the declared ones named by ``search`` (all but those fixed by --param, when
        ``search`` is None)."""
        declared = declared_space(params_class(self.policy))
        if self.search is None:
            names = [n for n in declared if n not in self.fixed]
            return select(declared, names if len(names) < len(declared) else None, self.policy)
        return select(declared, list(self.search), self.policy)

    def params(self, searched: Mapping[str, Any]) -> dict[str, Any]:
        """A trial's full parameters: the fixed ones and the searched values."""
        return {**self.fixed, **searched}

    def full_params(self, searched: Mapping[str, Any]) -> dict[str, Any]:
        """Every field of the policy's Params, as a params file holds them."""
        return params_dict(parse_params(self.policy, params_class(self.policy), self.params(searched)))

    @property
    def handset(self) -> dict[str, Any]:
        """The hand-set parameters: the Params defaults with the fixed ones applied."""
        return dict(self.fixed)

    def setup(self, profile: HardwareProfile, params: Mapping[str, Any]) -> SimSetup:
        return SimSetup(
            profile=profile,
            shape=ClusterShape(self.prefill, self.decode),
            router_calibration=profile.calibration,
            policy_params={self.policy: dict(params)},
        )

    def key(self) -> dict[str, Any]:
        """What a stored study must match to be resumed, as JSON values. One workload: ``workload``, its name
        (the key studies stored before several could be trained on have); several: ``workloads``, the
        sorted list."""
        trained: dict[str, Any] = (
            {"workloads": list(self.names)} if self.several else {"workload": self.workloads[0].name}
        )
        return {
            "policy": self.policy,
            **trained,
            "requests": self.requests,
            "trace_windows": self.workloads[0].windows,
            "prefill": self.prefill,
            "decode": self.decode,
            "train_seeds": list(self.train_seeds),
            "rate_factors": list(self.rate_factors),
            "space": {n: r.to_dict() for n, r in self.space.items()},
            "fixed": {k: self.fixed[k] for k in sorted(self.fixed)},
            "study_seed": self.study_seed,
            "batch_size": self.batch_size,
            "calibration": self.calibration_source,
            "calibration_sha256": self.calibration_sha256,
            "saturation_target": SATURATION_TARGET,
        }


def _check_workloads(workloads: tuple[WorkloadSpec, ...]) -> None:
    if not workloads:
        raise ConfigError("--workload: no workload given")
    if len(workloads) == 1:
        return
    names = [w.name for w in workloads]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        # a trace is trained on alone: its windows are its seeds, which families do not share
        raise ConfigError(
            f"--workload: unknown {', '.join(unknown)} (several workloads must all be families; a trace "
            f"is trained on alone); known: {', '.join(WORKLOADS)}"
        )
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"--workload: {', '.join(twice)} given twice")
    if len({(w.requests, w.windows) for w in workloads}) > 1:
        raise ConfigError("--requests: every family of a study runs the same number of requests")


def typed_params(policy: str, raw: Mapping[str, Any]) -> dict[str, Any]:
    """``raw`` (--param strings, or JSON values) as the typed values the policy's Params holds."""
    parsed = parse_params(policy, params_class(policy), raw)
    return {k: getattr(parsed, k) for k in raw}


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
