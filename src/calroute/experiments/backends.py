"""Where an experiment's cells run. A backend saturates a setup and runs a cell's variants over seeds;
the simulator is one, the live emulated and real-vLLM clusters (through the harness) are the others."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol, runtime_checkable

from calroute.costmodel.calibration import Calibration, mismatched
from calroute.costmodel.profiles import HardwareProfile
from calroute.costmodel.slo import PAPER, PRESETS, SloSpec, with_slo
from calroute.errors import ConfigError
from calroute.executors import Executor
from calroute.executors.local import LocalExecutor
from calroute.experiments.cells import Cell, Run, SaturationQuery
from calroute.experiments.compare import SimSetup, saturate, simulate_run
from calroute.experiments.saturation import SaturationResult
from calroute.routing.variant import Variant
from calroute.sim.simulator import ClusterShape
from calroute.workload.source import workload_source


class Backend(Protocol):
    name: str

    def saturation_rate(self, query: SaturationQuery) -> float:
        """The rate at which the query's policy's goodput crosses 0.85 on its setup."""
        ...

    def run_cell(
        self,
        cell: Cell,
        rate_rps: float,
        seeds: Sequence[int],
        requests: int,
        records_dir: Path,
        on_run: Callable[[Run], None],
    ) -> list[Run]:
        """Every variant on every seed (a seed's requests are the same for every variant); records of a run go
        to ``records_dir / f"{label}-seed{seed}.jsonl"``."""
        ...


@runtime_checkable
class ManySaturations(Protocol):
    """A backend that can run several saturation searches at once (the simulator, on its executor's
    workers). The live backends cannot: they run one cluster at a time."""

    def saturation_rates(
        self,
        queries: Sequence[SaturationQuery],
        on_rate: Callable[[SaturationQuery, float], None] = ...,
    ) -> list[float]:
        """Each query's rate, as ``Backend.saturation_rate`` would give it; ``on_rate`` as each ends."""
        ...


def router_calibration(variant: Variant, hardware: Calibration) -> Calibration:
    if variant.router == "calibrated":
        return hardware
    if variant.router in ("mismatched", "online"):
        return mismatched(hardware)
    raise ConfigError(f"unknown router constants {variant.router!r}: calibrated, mismatched or online")


SATURATION_SEEDS = (0, 1, 2)  # the simulator is cheap: saturate on the mean of three traces


def sim_setup(profile: HardwareProfile, prefill: int, decode: int, variant: Variant) -> SimSetup:
    return SimSetup(
        profile=profile,
        shape=ClusterShape(prefill, decode),
        router_calibration=router_calibration(variant, profile.calibration),
        predictor=variant.predictor,
        predictor_noise=variant.predictor_noise,
        policy_params={variant.policy: variant.params},
        online_calibration=variant.router == "online",
    )


def portable_workload(workload: str) -> str:
    """A trace file's absolute path (a worker may run in another directory), a family's name as it is."""
    path = Path(workload)
    return str(path.resolve()) if path.is_file() else workload


@dataclass(frozen=True)
class SimRun:
    """One simulated run of a cell, self-contained so that any executor's worker makes the same run: the
    requests are regenerated from the workload, rate and seed (cheaper than shipping them)."""

    profile: HardwareProfile
    prefill: int
    decode: int
    workload: str
    trace_windows: int
    requests: int
    rate_rps: float
    seed: int
    variant: Variant
    records_path: Path


def run_sim(item: SimRun) -> Run:
    source = workload_source(item.workload, item.requests, trace_windows=item.trace_windows)
    v = item.variant
    setup = sim_setup(item.profile, item.prefill, item.decode, v)
    result = simulate_run(
        setup,
        v.policy,
        source.requests(item.rate_rps, item.seed),
        item.seed,
        item.rate_rps,
        records_path=item.records_path,
        label=v.label,
    )
    return Run(v.label, item.seed, result.summary)


@dataclass(frozen=True)
class SimSaturation:
    profile: HardwareProfile
    query: SaturationQuery


def saturate_sim(item: SimSaturation, executor: Executor | None = None) -> SaturationResult:
    """A saturation search on the simulator; with ``executor``, each probe's seeds run on it."""
    q = item.query
    return saturate(
        sim_setup(item.profile, q.prefill, q.decode, Variant(q.policy, q.policy, dict(q.params))),
        workload_source(q.workload, q.requests, trace_windows=q.trace_windows),
        reference_policy=q.policy,
        seeds=SATURATION_SEEDS,
        executor=executor,
    )


def saturation_rate_sim(item: SimSaturation) -> float:
    return saturate_sim(item).rate_rps


class SimBackend:
    """The simulator. Its runs and saturation searches go through ``executor`` (default: inline, in this
    process); every executor gives the same results, each item carrying its own seed."""

    name = "sim"

    def __init__(
        self, profile: HardwareProfile, slo: SloSpec = PRESETS[PAPER], executor: Executor | None = None
    ) -> None:
        # The runs judge by the spec's targets, resolved on the simulated hardware (the profile's tau_pre).
        self.profile = (
            profile if slo.is_paper else replace(profile, calibration=with_slo(profile.calibration, slo))
        )
        self.executor = executor or LocalExecutor(1)

    def saturation_rate(self, query: SaturationQuery) -> float:
        return self.saturation(query).rate_rps

    def saturation(self, q: SaturationQuery) -> SaturationResult:
        item = SimSaturation(self.profile, replace(q, workload=portable_workload(q.workload)))
        return saturate_sim(item, self.executor)

    def saturation_rates(
        self,
        queries: Sequence[SaturationQuery],
        on_rate: Callable[[SaturationQuery, float], None] = lambda q, rate: None,
    ) -> list[float]:
        """Several searches at once: one search per worker when there are enough of them to go round,
        else one after the other with each probe's seeds spread over the workers (a search's probes
        depend on each other, its seeds do not). Either way each rate is the same."""
        if len(queries) < self.executor.workers:
            rates = []
            for q in queries:
                rates.append(self.saturation_rate(q))
                on_rate(q, rates[-1])
            return rates
        items = [
            SimSaturation(self.profile, replace(q, workload=portable_workload(q.workload))) for q in queries
        ]
        return self.executor.map(
            saturation_rate_sim, items, on_result=lambda i, rate: on_rate(queries[i], rate)
        )

    def run_cell(
        self,
        cell: Cell,
        rate_rps: float,
        seeds: Sequence[int],
        requests: int,
        records_dir: Path,
        on_run: Callable[[Run], None],
    ) -> list[Run]:
        workload = portable_workload(cell.workload)
        items = [
            SimRun(
                self.profile,
                cell.prefill,
                cell.decode,
                workload,
                cell.trace_windows,
                requests,
                rate_rps,
                seed,
                v,
                records_dir / f"{v.label}-seed{seed}.jsonl",
            )
            for seed in seeds
            for v in cell.variants
        ]
        return self.executor.map(run_sim, items, on_result=lambda i, run: on_run(run))
