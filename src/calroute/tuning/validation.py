"""Hand-set against tuned parameters on seeds the study never saw: on the training workload(s) and on each
other family, each at its own saturation rate (found for the hand-set parameters on the training seeds, as the
study's were), at the study's rate factors. A seed's value is its mean goodput over the rate factors, so the
pairs are the seeds (independent traces) and the interval is over them."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from calroute.costmodel.profiles import HardwareProfile
from calroute.errors import ConfigError
from calroute.executors import Executor
from calroute.results.stats import PairedDiff, paired_difference
from calroute.tuning.config import TuneConfig, WorkloadSpec
from calroute.tuning.jobs import RunJob, SaturationJob, find_rate, run_goodput


@dataclass(frozen=True)
class FamilyResult:
    workload: str
    trained_on: bool
    saturation_rps: float | None
    handset: tuple[float, ...]  # per validation seed, mean goodput over the rate factors
    tuned: tuple[float, ...]
    note: str | None = None  # why there are no runs (no saturation point)

    @property
    def diff(self) -> PairedDiff | None:
        return paired_difference(self.tuned, self.handset) if self.tuned else None

    def to_dict(self) -> dict[str, Any]:
        d = self.diff
        return {
            "workload": self.workload,
            "trained_on": self.trained_on,
            "saturation_rps": self.saturation_rps,
            "handset_goodput": _mean(self.handset),
            "tuned_goodput": _mean(self.tuned),
            "handset_per_seed": list(self.handset),
            "tuned_per_seed": list(self.tuned),
            "tuned_minus_handset": None
            if d is None
            else {"mean": d.mean, "low": d.low, "high": d.high, "n": d.n, "verdict": d.verdict},
            "note": self.note,
        }


def _mean(xs: Sequence[float]) -> float | None:
    return math.fsum(xs) / len(xs) if xs else None


def validation_seeds(config: TuneConfig, count: int) -> list[int]:
    """``count`` seeds after the last training seed: never trained on."""
    first = max(config.train_seeds) + 1
    return list(range(first, first + count))


def validation_workloads(config: TuneConfig, families: Sequence[str]) -> list[WorkloadSpec]:
    """The training workloads first (their held-out seeds, or a trace's held-out windows), then each other
    family."""
    out = list(config.workloads)
    out += [WorkloadSpec(f, config.requests) for f in families if f not in config.names]
    return out


def _rate_or_note(job: SaturationJob) -> tuple[float | None, str | None]:
    try:
        return find_rate(job).rate_rps, None
    except ConfigError as e:  # no saturation point on this family: reported, not fatal
        return None, str(e)


def validate(
    config: TuneConfig,
    profile: HardwareProfile,
    handset: Mapping[str, Any],
    tuned: Mapping[str, Any],
    seeds: Sequence[int],
    workloads: Sequence[WorkloadSpec],
    known_rates_rps: Mapping[str, float],
    executor: Executor,
    on_step: Callable[[], None] | None = None,
) -> list[FamilyResult]:
    """Every workload's saturation (those in ``known_rates_rps``, the training ones', are given), then its
    runs, both through ``executor``; ``on_step()`` as each search or run finishes."""

    def step(_: int, __: object) -> None:
        if on_step is not None:
            on_step()

    hand_setup = config.setup(profile, handset)
    others = [w for w in workloads if w.name not in known_rates_rps]
    searched = executor.map(
        _rate_or_note,
        [SaturationJob(hand_setup, config.policy, w, config.train_seeds) for w in others],
        step,
    )
    found = dict(zip((w.name for w in others), searched, strict=True))
    rates = [
        (known_rates_rps[w.name], None) if w.name in known_rates_rps else found[w.name] for w in workloads
    ]
    variants = (hand_setup, config.setup(profile, tuned))
    jobs = [
        RunJob(setup, config.policy, w, seed, rate * f)
        for w, (rate, _) in zip(workloads, rates, strict=True)
        if rate is not None
        for seed in seeds
        for setup in variants
        for f in config.rate_factors
    ]
    goodputs = iter(executor.map(run_goodput, jobs, step))
    k = len(config.rate_factors)
    out = []
    for w, (rate, note) in zip(workloads, rates, strict=True):
        hand: list[float] = []
        mine: list[float] = []
        if rate is not None:
            for _ in seeds:
                hand.append(math.fsum(next(goodputs) for _ in range(k)) / k)
                mine.append(math.fsum(next(goodputs) for _ in range(k)) / k)
        out.append(FamilyResult(w.name, w.name in config.names, rate, tuple(hand), tuple(mine), note))
    return out


def validation_steps(workloads: int, seeds: int, rate_factors: int, known: int = 1) -> int:
    """How many on_step calls validate makes: a progress bar's total (``known``: the workloads whose
    saturation is given, not searched)."""
    return (workloads - known) + workloads * seeds * 2 * rate_factors
