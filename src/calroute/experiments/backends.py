"""Where an experiment's cells run. A backend saturates a setup and runs a cell's variants over seeds;
the simulator is one, the live emulated and real-vLLM clusters (through the harness) are the others."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from calroute.costmodel.calibration import Calibration, mismatched
from calroute.costmodel.profiles import HardwareProfile
from calroute.costmodel.slo import PAPER, PRESETS, SloSpec, with_slo
from calroute.errors import ConfigError
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


def router_calibration(variant: Variant, hardware: Calibration) -> Calibration:
    if variant.router == "calibrated":
        return hardware
    if variant.router in ("mismatched", "online"):
        return mismatched(hardware)
    raise ConfigError(f"unknown router constants {variant.router!r}: calibrated, mismatched or online")


SATURATION_SEEDS = (0, 1, 2)  # the simulator is cheap: saturate on the mean of three traces


class SimBackend:
    name = "sim"

    def __init__(self, profile: HardwareProfile, slo: SloSpec = PRESETS[PAPER]) -> None:
        # The runs judge by the spec's targets, resolved on the simulated hardware (the profile's tau_pre).
        self.profile = (
            profile if slo.is_paper else replace(profile, calibration=with_slo(profile.calibration, slo))
        )

    def _setup(self, prefill: int, decode: int, variant: Variant) -> SimSetup:
        return SimSetup(
            profile=self.profile,
            shape=ClusterShape(prefill, decode),
            router_calibration=router_calibration(variant, self.profile.calibration),
            predictor=variant.predictor,
            predictor_noise=variant.predictor_noise,
            policy_params={variant.policy: variant.params},
            online_calibration=variant.router == "online",
        )

    def saturation_rate(self, query: SaturationQuery) -> float:
        return self.saturation(query).rate_rps

    def saturation(self, q: SaturationQuery) -> SaturationResult:
        setup = self._setup(q.prefill, q.decode, Variant(q.policy, q.policy))
        return saturate(
            setup,
            workload_source(q.workload, q.requests, trace_windows=q.trace_windows),
            reference_policy=q.policy,
            seeds=SATURATION_SEEDS,
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
        source = workload_source(cell.workload, requests, trace_windows=cell.trace_windows)
        runs = []
        for seed in seeds:
            reqs = source.requests(rate_rps, seed)
            for v in cell.variants:
                path = records_dir / f"{v.label}-seed{seed}.jsonl"
                setup = self._setup(cell.prefill, cell.decode, v)
                result = simulate_run(setup, v.policy, reqs, seed, rate_rps, records_path=path, label=v.label)
                run = Run(v.label, seed, result.summary)
                runs.append(run)
                on_run(run)
        return runs
