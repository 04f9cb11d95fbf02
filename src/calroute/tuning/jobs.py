"""The work an executor runs for a study: module-level functions over picklable items, each carrying its
own seed, so the same items give the same values on every executor and worker count."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from calroute.experiments.kit.saturation import SaturationResult
from calroute.experiments.kit.sim_backend import SimSetup, saturate, simulate_run
from calroute.tuning.config import SATURATION_TARGET, WorkloadSpec


@dataclass(frozen=True)
class RunJob:
    """One simulated run: ``policy`` under ``setup`` (which holds its parameters) on one seed at one rate."""

    setup: SimSetup
    policy: str
    workload: WorkloadSpec
    seed: int
    rate_rps: float


def run_goodput(job: RunJob) -> float:
    requests = job.workload.source().requests(job.rate_rps, job.seed)
    return simulate_run(job.setup, job.policy, requests, job.seed, job.rate_rps).summary.goodput


@dataclass(frozen=True)
class SaturationJob:
    """The rate at which ``policy``'s goodput (under ``setup``), averaged over ``seeds``, crosses the
    target."""

    setup: SimSetup
    policy: str
    workload: WorkloadSpec
    seeds: Sequence[int]


def find_rate(job: SaturationJob) -> SaturationResult:
    return saturate(
        job.setup, job.workload.source(), SATURATION_TARGET, reference_policy=job.policy, seeds=job.seeds
    )
