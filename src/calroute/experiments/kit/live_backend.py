"""Live backends: experiments on an emulated or real-vLLM cluster, through the proxy and the load generator.

A backend brings up one cluster per shape the experiment needs (stopping the previous one: two cores do
not run two clusters well), runs the correctness gates and calibrates it once, then runs each cell's
variants with `harness.live.run_variant`. `calroute run` uses the same machinery on a cluster that is
already up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from calroute.cluster import launch
from calroute.cluster.file import ClusterFile
from calroute.costmodel.calibration import Calibration
from calroute.costmodel.profiles import EngineLimits
from calroute.costmodel.slo import PAPER, PRESETS, SloSpec, with_slo
from calroute.errors import ConfigError
from calroute.experiments.kit.cells import Cell, Run, SaturationQuery
from calroute.experiments.kit.paths import REPO, portable_workload
from calroute.experiments.kit.saturation import find_saturation
from calroute.harness.gates import require_gates
from calroute.harness.live import LiveSetup, run_variant
from calroute.routing.variant import Variant
from calroute.workload.source import workload_source


def _calibrate(
    cluster: ClusterFile, path: Path, progress: Callable[[str], None], budget_s: float
) -> Calibration:
    from calroute.calibrate.run import calibrate_cluster

    if path.exists():
        return Calibration.load(path)
    cal, _ = calibrate_cluster(cluster, budget_s, progress, cluster_path=path.parent / "cluster.yaml")
    cal.save(path)
    return cal


# The delay a simulated router hears KV events with before a live run has measured it (the proxy's
# measured mean on the emulated 2P+4D was 6 ms: docs/results/emulated/fidelity-prefix).
LIVE_KV_EVENT_DELAY_S = 0.01


def engine_limits(cluster: ClusterFile) -> EngineLimits:
    """What the cluster's engines hold: the smallest KV capacity among them and the model length."""
    capacity = min(e.kv_capacity_tokens for e in cluster.engines)
    return EngineLimits(kv_capacity_tokens=capacity, max_model_len=cluster.max_model_len)


@dataclass
class LiveBackend:
    name: str  # emulated | vllm
    work_dir: Path
    progress: Callable[[str], None] = lambda msg: None
    fixed: LiveSetup | None = None  # `calroute run`: a cluster that is already up
    quick: bool = False  # a shorter calibration and a coarser saturation search
    time_scale: float = 1.0  # emulated engines: every modelled duration times this
    # "live": probe rates on the cluster; "sim": the simulator calibrated to the cluster finds it (minutes
    # faster; live and simulated saturation differ, so the report says which was used)
    saturation: str = "live"
    # The targets that judge the runs, resolved on each cluster's calibration once it is measured (the file
    # keeps the paper's); the proxies get them too, in the calibration they are started with.
    slo: SloSpec = PRESETS[PAPER]
    _shape: tuple[int, int] | None = None
    _launched: launch.LaunchedCluster | None = None
    _setup: LiveSetup | None = None
    _run_ids: dict[str, int] = field(default_factory=dict)

    def setup_for(self, prefill: int, decode: int) -> LiveSetup:
        if self.fixed is not None:
            return replace(self.fixed, calibration=with_slo(self.fixed.calibration, self.slo))
        if self._shape == (prefill, decode) and self._setup is not None:
            return self._setup
        self.close()
        shape_dir = self.work_dir / f"{prefill}P{decode}D"
        self.progress(f"{self.name}: bringing up {prefill}P+{decode}D")
        if self.name == "emulated":
            # KV events on: a prefix workload's proxy routes on them (docs/prefix.md); others ignore them
            self._launched = launch.up_emulated(
                prefill, decode, shape_dir / "logs", time_scale=self.time_scale, kv_events=True
            )
        else:
            self._launched = launch.up_vllm(prefill, decode, shape_dir / "logs", repo_root=REPO)
        cluster = self._launched.file
        cluster_path = shape_dir / "cluster.yaml"
        cluster.save(cluster_path)
        require_gates(cluster)
        cal = _calibrate(cluster, shape_dir / "calibration.json", self.progress, 20.0 if self.quick else 60.0)
        self._shape = (prefill, decode)
        self._setup = LiveSetup(cluster, cluster_path, with_slo(cal, self.slo))
        return self._setup

    def close(self) -> None:
        if self._launched is not None:
            self._launched.stop()
        self._launched = self._setup = None
        self._shape = None

    def _run(
        self,
        setup: LiveSetup,
        variant: Variant,
        workload: str,
        requests: int,
        rate: float,
        seed: int,
        run_dir: Path,
        trace_windows: int = 1,
    ) -> Run:
        source = workload_source(portable_workload(workload), requests, trace_windows=trace_windows)
        reqs = source.requests(rate, seed)
        live = run_variant(setup, variant, reqs, run_dir, seed=seed)
        if not live.valid:
            self.progress(
                f"  warning: {run_dir.name}: the load generator fell behind its schedule "
                f"(p99 lateness {1e3 * live.lateness_p99_s:.1f} ms); the run is marked invalid"
            )
        return Run(variant.label, seed, live.summary, live.kv_event_delay_s, live.valid)

    def saturation_rate(self, query: SaturationQuery) -> float:
        from calroute.costmodel.profiles import profile_from_calibration
        from calroute.experiments.kit.sim_backend import SimBackend

        q = query
        setup = self.setup_for(q.prefill, q.decode)
        # the simulator configured as the live router is: the engines' limits, the proxy's KV-event source
        sim = SimBackend(
            profile_from_calibration(setup.calibration, engine_limits(setup.cluster)),
            prefix_source="precise",
            kv_event_delay_s=LIVE_KV_EVENT_DELAY_S,
        ).saturation(q)
        if self.saturation == "sim":
            self.progress(
                f"  saturation on the simulator calibrated to this cluster: {sim.rate_rps:.2f} req/s"
            )
            return sim.rate_rps
        # The calibrated simulator's rate is the first guess: live saturation has been 0.6-1.0x of it (the
        # emulator's CPU cost per stream is not simulated), and a probe at a low rate is the slowest one. A
        # workload that cannot reach 0.85 even unloaded on the simulator (long prompts, tight TTFT) gets the
        # simulator's relative target rather than a live search down to a 64th of the rate (hours per probe);
        # if the live cluster cannot reach even that by an 8th of the start, the target becomes relative to
        # the best live probe.
        start_rps = sim.rate_rps / 2
        note = f", target {sim.target:.3f} as on the simulator" if sim.relative else ""
        self.progress(
            f"  live search from {start_rps:.2f} req/s, half the calibrated simulator's "
            f"{sim.rate_rps:.2f}{note}"
        )
        suffix = "" if q.policy == "round_robin" else f"-{q.policy}"
        probes_dir = (
            self.work_dir / f"{q.prefill}P{q.decode}D" / f"saturation-{Path(q.workload).name}{suffix}"
        )

        def measure(rate: float) -> float:
            run = self._run(
                setup,
                Variant(q.policy, q.policy, dict(q.params)),
                q.workload,
                q.requests,
                rate,
                0,
                probes_dir / f"rate-{rate:.4f}",
                q.trace_windows,
            )
            self.progress(f"  probe {rate:.2f} req/s: {q.policy} goodput {run.summary.goodput:.3f}")
            return run.summary.goodput

        return find_saturation(
            measure,
            target=sim.target,
            start_rps=start_rps,
            rel_tol=0.1 if self.quick else 0.03,
            lowest_fraction=1 / 8,
        ).rate_rps

    def run_cell(
        self,
        cell: Cell,
        rate_rps: float,
        seeds: Sequence[int],
        requests: int,
        records_dir: Path,
        on_run: Callable[[Run], None],
    ) -> list[Run]:
        setup = self.setup_for(cell.prefill, cell.decode)
        runs = []
        for seed in seeds:
            for v in cell.variants:
                run_dir = records_dir.parent.parent / "runs" / cell.key / f"{v.label}-seed{seed}"
                run = self._run(
                    setup, v, cell.workload, requests, rate_rps, seed, run_dir, cell.trace_windows
                )
                records_dir.mkdir(parents=True, exist_ok=True)
                (records_dir / f"{v.label}-seed{seed}.jsonl").write_bytes(
                    (run_dir / "records.jsonl").read_bytes()
                )
                runs.append(run)
                on_run(run)
        return runs


def live_backend(
    kind: str,
    work_dir: Path,
    progress: Callable[[str], None] = lambda msg: None,
    quick: bool = False,
    time_scale: float = 1.0,
    saturation: str = "live",
    slo: SloSpec = PRESETS[PAPER],
) -> LiveBackend:
    if kind != "emulated" and time_scale != 1.0:
        raise ConfigError(f"--time-scale applies to emulated engines only, not {kind}")
    if time_scale <= 0:
        raise ConfigError(f"--time-scale must be > 0, got {time_scale:g}")
    if saturation not in ("live", "sim"):
        raise ConfigError(f"--saturation must be live or sim, got {saturation!r}")
    return LiveBackend(
        kind, work_dir, progress, quick=quick, time_scale=time_scale, saturation=saturation, slo=slo
    )
