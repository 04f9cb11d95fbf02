"""The simulator as a backend: one simulated run (records streamed to disk), a saturation search, a plain
comparison of policies over seeds (`calroute simulate`), and an experiment's cells, on an executor's
workers. A run may be routed by several routers (sim/replicas.py): SimSetup's ``routers``, or a cell's
ReplicaVariant."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from calroute.costmodel.calibration import Calibration, mismatched
from calroute.costmodel.profiles import HardwareProfile
from calroute.costmodel.slo import PAPER, PRESETS, SloSpec, with_slo
from calroute.errors import ConfigError
from calroute.executors import Executor
from calroute.executors.local import LocalExecutor
from calroute.experiments.kit.cells import Cell, Run, SaturationQuery
from calroute.experiments.kit.paths import portable_workload
from calroute.experiments.kit.saturation import Probe, SaturationResult, find_saturation
from calroute.results.metrics import RunSink, RunSummary, SummaryAccumulator
from calroute.results.records import RecordWriter
from calroute.routing.variant import Variant
from calroute.sim.replicas import GroupStats, RouterGroup, check_group
from calroute.sim.routers import RouterRecipe, run_routers
from calroute.sim.simulator import ClusterShape, ClusterSim, SimStats
from calroute.types import RequestSpec
from calroute.workload.source import WorkloadSource, workload_source

PREFIX_SOURCES = ("approximate", "precise")


@dataclass(frozen=True)
class SimSetup:
    """Everything but the policy, the seed and the requests."""

    profile: HardwareProfile
    shape: ClusterShape
    router_calibration: Calibration  # what the policy prices with; the profile is what the hardware does
    predictor: str = "bucket"
    predictor_noise: float = 0.0
    policy_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    sample_interval_s: float = 0.05
    online_calibration: bool = False  # refit the router's constants from completed requests as they come
    # Where the router's prefix index learns what each engine caches (docs/prefix.md): "approximate", its
    # own placements; "precise", the engines' KV events, heard kv_event_delay_s late.
    prefix_source: str = "approximate"
    kv_event_delay_s: float = 0.01
    # Routers in front of the cluster (sim/replicas.py): how many, how the arrivals are split among them
    # (BALANCERS), and the delay with which each one's bookings reach the others' ledgers (None: never).
    routers: int = 1
    balancer: str = "round_robin"
    share_delay_s: float | None = None
    # The herd's mitigation (sim/herd.py): each pool's engine drawn among the candidates within this
    # min-max normalised distance of the best (None: off, the policy's own pick).
    near_best: float | None = None

    def __post_init__(self) -> None:
        if self.prefix_source not in PREFIX_SOURCES:
            raise ConfigError(
                f"unknown prefix source {self.prefix_source!r}; known: {', '.join(PREFIX_SOURCES)}"
            )
        check_group(self.routers, self.balancer, self.share_delay_s, self.near_best)


@dataclass(frozen=True)
class ReplicaVariant(Variant):
    """A variant routed by several routers: SimSetup's ``routers``, ``balancer``, ``share_delay_s`` and
    ``near_best``, on a prefix source of its own (None: the backend's). The simulator backend's only."""

    routers: int = 1
    balancer: str = "round_robin"
    share_delay_s: float | None = None
    near_best: float | None = None
    prefix_source: str | None = None


@dataclass(frozen=True)
class RunResult:
    policy: str
    seed: int
    rate_rps: float | None
    summary: RunSummary
    stats: SimStats
    records_path: Path | None
    replicas: GroupStats | None = None  # a run through a RouterGroup: its routers' admissions, the herd


def simulate_run(
    setup: SimSetup,
    policy: str,
    requests: Sequence[RequestSpec],
    seed: int,
    rate_rps: float | None = None,
    records_path: Path | None = None,
    label: str | None = None,
) -> RunResult:
    """One simulated run. With ``records_path``, every record is streamed to that JSONL file; ``label``
    names the run in its records (default: the policy)."""
    instances = setup.shape.instances(setup.profile.limits.kv_capacity_tokens)
    # Only prompts with block ids can hit; without any, the index would answer nothing, at a cost.
    indexed = any(r.prefix_blocks for r in requests)
    precise = indexed and setup.prefix_source == "precise"
    recipe = RouterRecipe(
        policy,
        setup.policy_params.get(policy, {}),
        setup.router_calibration,
        setup.predictor,
        setup.predictor_noise,
        setup.online_calibration,
        setup.near_best,
    )
    routers = run_routers(
        recipe, instances, seed, indexed, precise, setup.routers, setup.balancer, setup.share_delay_s
    )
    sim = ClusterSim(
        setup.profile,
        setup.shape,
        routers,
        label or policy,
        setup.sample_interval_s,
        kv_event_delay_s=setup.kv_event_delay_s if precise else None,
    )
    acc = SummaryAccumulator(setup.profile.calibration.slo)
    with ExitStack() as stack:
        writer = None
        if records_path is not None:
            records_path.parent.mkdir(parents=True, exist_ok=True)
            writer = RecordWriter(stack.enter_context(records_path.open("w")), flush_every=1024)
        sink = RunSink(acc, writer)
        stats = sim.run(requests, sink)
    replicas = routers.stats() if isinstance(routers, RouterGroup) else None
    return RunResult(policy, seed, rate_rps, acc.summary(), stats, records_path, replicas)


def group_stats_path(records_path: Path) -> Path:
    """Where ``run_sim`` keeps a run's GroupStats (GroupStats.to_dict): beside its records."""
    return records_path.with_name(f"{records_path.stem}.replicas.json")


def compare(
    setup: SimSetup,
    workload: WorkloadSource,
    policies: Sequence[str],
    seeds: Sequence[int],
    rate_rps: float | None,
    records_dir: Path | None = None,
    on_run: Callable[[Run], None] = lambda run: None,
) -> list[Run]:
    """Every policy on every seed, in this process (`calroute simulate`); a seed's requests are made once and
    are the same for every policy. Records go where a backend's ``run_cell`` puts them: ``records_dir /
    f"{policy}-seed{seed}.jsonl"``."""
    runs = []
    for seed in seeds:
        requests = workload.requests(rate_rps, seed)
        for policy in policies:
            path = None if records_dir is None else records_dir / f"{policy}-seed{seed}.jsonl"
            r = simulate_run(setup, policy, requests, seed, rate_rps, path)
            runs.append(Run(policy, seed, r.summary))
            on_run(runs[-1])
    return runs


@dataclass(frozen=True)
class SeedProbe:
    """One seed of a saturation probe: self-contained, for an executor's worker."""

    setup: SimSetup
    workload: WorkloadSource
    policy: str
    rate_rps: float
    seed: int


def probe_goodput(p: SeedProbe) -> float:
    return simulate_run(
        p.setup, p.policy, p.workload.requests(p.rate_rps, p.seed), p.seed, p.rate_rps
    ).summary.goodput


def saturate(
    setup: SimSetup,
    workload: WorkloadSource,
    target: float = 0.85,
    reference_policy: str = "round_robin",
    seeds: Sequence[int] = (0,),
    on_probe: Callable[[Probe], None] | None = None,
    executor: Executor | None = None,
) -> SaturationResult:
    """The rate at which ``reference_policy``'s goodput, averaged over ``seeds``, crosses ``target``.

    Averaging over the seeds a comparison will run matters for bursty workloads and short runs, where one
    trace's calm stretch would otherwise set the rate for all of them. With ``executor``, a probe's seeds
    run on its workers (the probes themselves depend on each other, so they run one after the other).
    """
    runner = executor or LocalExecutor(1)

    def measure(rate: float) -> float:
        goodputs = runner.map(
            probe_goodput, [SeedProbe(setup, workload, reference_policy, rate, s) for s in seeds]
        )
        return sum(goodputs) / len(goodputs)

    return find_saturation(measure, target=target, on_probe=on_probe)


def router_calibration(variant: Variant, hardware: Calibration) -> Calibration:
    if variant.router == "calibrated":
        return hardware
    if variant.router in ("mismatched", "online"):
        return mismatched(hardware)
    raise ConfigError(f"unknown router constants {variant.router!r}: calibrated, mismatched or online")


SATURATION_SEEDS = (0, 1, 2)  # the simulator is cheap: saturate on the mean of three traces


def sim_setup(
    profile: HardwareProfile,
    prefill: int,
    decode: int,
    variant: Variant,
    prefix_source: str = "approximate",
    kv_event_delay_s: float = 0.01,
) -> SimSetup:
    """The setup of ``variant`` on a prefill x decode cluster; a ReplicaVariant's routers, and its own prefix
    source where it names one."""
    setup = SimSetup(
        profile=profile,
        shape=ClusterShape(prefill, decode),
        router_calibration=router_calibration(variant, profile.calibration),
        predictor=variant.predictor,
        predictor_noise=variant.predictor_noise,
        policy_params={variant.policy: variant.params},
        online_calibration=variant.router == "online",
        prefix_source=prefix_source,
        kv_event_delay_s=kv_event_delay_s,
    )
    if not isinstance(variant, ReplicaVariant):
        return setup
    return replace(
        setup,
        routers=variant.routers,
        balancer=variant.balancer,
        share_delay_s=variant.share_delay_s,
        near_best=variant.near_best,
        prefix_source=variant.prefix_source or prefix_source,
    )


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
    prefix_source: str = "approximate"
    kv_event_delay_s: float = 0.01


def run_sim(item: SimRun) -> Run:
    source = workload_source(item.workload, item.requests, trace_windows=item.trace_windows)
    v = item.variant
    setup = sim_setup(item.profile, item.prefill, item.decode, v, item.prefix_source, item.kv_event_delay_s)
    result = simulate_run(
        setup,
        v.policy,
        source.requests(item.rate_rps, item.seed),
        item.seed,
        item.rate_rps,
        records_path=item.records_path,
        label=v.label,
    )
    if result.replicas is not None:
        path = group_stats_path(item.records_path)
        path.write_text(json.dumps(result.replicas.to_dict(), indent=2) + "\n")
    return Run(v.label, item.seed, result.summary)


@dataclass(frozen=True)
class SimSaturation:
    profile: HardwareProfile
    query: SaturationQuery
    prefix_source: str = "approximate"
    kv_event_delay_s: float = 0.01


def saturate_sim(item: SimSaturation, executor: Executor | None = None) -> SaturationResult:
    """A saturation search on the simulator; with ``executor``, each probe's seeds run on it."""
    q = item.query
    return saturate(
        sim_setup(
            item.profile,
            q.prefill,
            q.decode,
            Variant(q.policy, q.policy, dict(q.params)),
            item.prefix_source,
            item.kv_event_delay_s,
        ),
        workload_source(q.workload, q.requests, trace_windows=q.trace_windows),
        target=q.target,
        reference_policy=q.policy,
        seeds=SATURATION_SEEDS if q.seeds is None else q.seeds,
        executor=executor,
    )


def saturation_rate_sim(item: SimSaturation) -> float:
    return saturate_sim(item).rate_rps


def judged_profile(profile: HardwareProfile, slo: SloSpec) -> HardwareProfile:
    """``profile`` judging its runs by ``slo``'s targets, resolved on the simulated hardware (the profile's
    tau_pre): what the simulator backend's runs are judged by."""
    return profile if slo.is_paper else replace(profile, calibration=with_slo(profile.calibration, slo))


class SimBackend:
    """The simulator. Its runs and saturation searches go through ``executor`` (default: inline, in this
    process); every executor gives the same results, each item carrying its own seed."""

    name = "sim"

    def __init__(
        self,
        profile: HardwareProfile,
        slo: SloSpec = PRESETS[PAPER],
        executor: Executor | None = None,
        prefix_source: str = "approximate",
        kv_event_delay_s: float = 0.01,
    ) -> None:
        """``prefix_source`` and ``kv_event_delay_s``: where the routers' prefix indexes learn what the
        engines cache (SimSetup); the experiments' cells run on the router's placements unless a live run
        they stand beside routed on KV events (experiments/fidelity.py)."""
        if prefix_source not in PREFIX_SOURCES:
            raise ConfigError(f"unknown prefix source {prefix_source!r}; known: {', '.join(PREFIX_SOURCES)}")
        self.prefix_source = prefix_source
        self.kv_event_delay_s = kv_event_delay_s
        self.profile = judged_profile(profile, slo)
        self.executor = executor or LocalExecutor(1)

    def saturation_rate(self, query: SaturationQuery) -> float:
        return self.saturation(query).rate_rps

    def saturation(self, q: SaturationQuery) -> SaturationResult:
        return saturate_sim(self._saturation_item(q), self.executor)

    def _saturation_item(self, q: SaturationQuery) -> SimSaturation:
        return SimSaturation(
            self.profile,
            replace(q, workload=portable_workload(q.workload)),
            self.prefix_source,
            self.kv_event_delay_s,
        )

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
        items = [self._saturation_item(q) for q in queries]
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
                self.prefix_source,
                self.kv_event_delay_s,
            )
            for seed in seeds
            for v in cell.variants
        ]
        return self.executor.map(run_sim, items, on_result=lambda i, run: on_run(run))
