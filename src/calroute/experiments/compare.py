"""Policy comparisons on the simulator: one run per (policy, seed), records streamed to disk."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calroute.costmodel.calibration import Calibration
from calroute.costmodel.profiles import HardwareProfile
from calroute.errors import ConfigError
from calroute.executors import Executor
from calroute.executors.local import LocalExecutor
from calroute.experiments.saturation import Probe, SaturationResult, find_saturation
from calroute.results.metrics import RunSink, RunSummary, SummaryAccumulator
from calroute.results.records import RecordWriter
from calroute.routing.build import build_router
from calroute.routing.ledger import Ledger
from calroute.routing.prefix_index import PrefixIndex
from calroute.routing.seeds import RouterSeeds
from calroute.sim.simulator import ClusterShape, ClusterSim, SimStats
from calroute.types import PREFIX_BLOCK_TOKENS, RequestSpec
from calroute.workload.source import WorkloadSource

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

    def __post_init__(self) -> None:
        if self.prefix_source not in PREFIX_SOURCES:
            raise ConfigError(
                f"unknown prefix source {self.prefix_source!r}; known: {', '.join(PREFIX_SOURCES)}"
            )


@dataclass(frozen=True)
class RunResult:
    policy: str
    seed: int
    rate_rps: float | None
    summary: RunSummary
    stats: SimStats
    records_path: Path | None


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
    prefix = PrefixIndex(instances, PREFIX_BLOCK_TOKENS) if any(r.prefix_blocks for r in requests) else None
    router = build_router(
        policy,
        setup.policy_params.get(policy, {}),
        setup.router_calibration,
        Ledger(instances, setup.router_calibration),
        seeds=RouterSeeds.of_run(seed),
        predictor=setup.predictor,
        predictor_noise=setup.predictor_noise,
        online_calibration=setup.online_calibration,
        prefix=prefix,
    )
    precise = prefix is not None and setup.prefix_source == "precise"
    router.record_placements = not precise
    sim = ClusterSim(
        setup.profile,
        setup.shape,
        router,
        label or policy,
        setup.sample_interval_s,
        kv_event_delay_s=setup.kv_event_delay_s if precise else None,
    )
    acc = SummaryAccumulator(setup.profile.calibration.slo)
    with ExitStack() as stack:
        sink = RunSink(acc)
        if records_path is not None:
            records_path.parent.mkdir(parents=True, exist_ok=True)
            sink.writer = RecordWriter(stack.enter_context(records_path.open("w")), flush_every=1024)
        stats = sim.run(requests, sink)
    return RunResult(policy, seed, rate_rps, acc.summary(), stats, records_path)


def compare(
    setup: SimSetup,
    workload: WorkloadSource,
    policies: Sequence[str],
    seeds: Sequence[int],
    rate_rps: float | None,
    out_dir: Path | None = None,
    on_run: Callable[[RunResult], None] | None = None,
) -> list[RunResult]:
    """Every policy on every seed; a seed's requests are the same for every policy."""
    results = []
    for seed in seeds:
        requests = workload.requests(rate_rps, seed)
        for policy in policies:
            path = None if out_dir is None else out_dir / "records" / f"{policy}-seed{seed}.jsonl"
            r = simulate_run(setup, policy, requests, seed, rate_rps, path)
            results.append(r)
            if on_run is not None:
                on_run(r)
    return results


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
