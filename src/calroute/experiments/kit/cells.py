"""What an experiment is: a name, a title, its cells (one cluster, one workload, several policy variants, at
one rate) and a report of their results; the results serializable so a killed experiment resumes where it
stopped."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from calroute.results.metrics import RunSummary
from calroute.routing.variant import Variant


def baselines_and_product() -> tuple[Variant, ...]:
    """The paper's four: round-robin, least-loaded (JSQ), the length heuristic, and marginal_cost."""
    return tuple(Variant(p, p) for p in ("round_robin", "least_loaded", "length_heuristic", "marginal_cost"))


@dataclass(frozen=True)
class Cell:
    key: str  # unique in its experiment; used in file names
    prefill: int
    decode: int
    workload: str  # a family name (chat, document, ...), or a trace file's path (workload/source.py)
    variants: tuple[Variant, ...]
    rate_rps: float | None = None  # fixed rate; None: saturate
    saturate_like: tuple[int, int] | None = (
        None  # saturate on this (prefill, decode) shape instead of our own
    )
    rate_factor: float = 1.0  # multiply the saturation rate (e.g. 0.7 for a steady, unsaturated load)
    # The policies whose goodput crossing the target sets the rate: the highest of their crossing rates,
    # so that a comparison sits where the strongest of them starts to fail.
    saturate_on: tuple[str, ...] = ("round_robin",)
    # Policies whose crossing rates are measured for the report too (CellResult.tags["saturation_rps"]).
    measure_saturation_of: tuple[str, ...] = ()
    # A trace replayed in this many consecutive windows, seed s on window s (workload/source.py).
    trace_windows: int = 1
    tags: dict[str, Any] = field(default_factory=dict)  # what the report groups by (e.g. {"decode": 3})
    # The goodput the saturation search crosses (0.90: where the policies still hold), and whether it
    # averages the cell's own seeds (True) or the simulator's saturation seeds 0-2.
    saturation_target: float = 0.85
    saturate_on_run_seeds: bool = False

    @property
    def saturation_shape(self) -> tuple[int, int]:
        return self.saturate_like or (self.prefill, self.decode)


@dataclass(frozen=True)
class SaturationQuery:
    """A saturation search: on this cluster shape and workload, the rate at which ``policy``'s goodput
    crosses the target (a trace replayed in ``trace_windows`` windows, workload/source.py)."""

    prefill: int
    decode: int
    workload: str
    requests: int
    policy: str = "round_robin"
    trace_windows: int = 1
    # The policy's parameters (sorted name, value pairs): those of the cell's variant named after the policy,
    # e.g. from `experiment --params FILE`; () for its defaults.
    params: tuple[tuple[str, Any], ...] = ()
    target: float = 0.85  # the goodput crossed
    seeds: tuple[int, ...] | None = None  # the seeds averaged (None: the backend's saturation seeds)

    @property
    def key(self) -> str:
        """How the runner files the answer (round_robin's key is the one saved before other policies could
        be searched on; a policy with its defaults has the key saved before parameters could be given)."""
        windows = "" if self.trace_windows == 1 else f":windows={self.trace_windows}"
        policy = "" if self.policy == "round_robin" else f":{self.policy}"
        params = ""
        if self.params:
            digest = hashlib.sha256(json.dumps(self.params).encode()).hexdigest()[:12]
            params = f":params={digest}"
        target = "" if self.target == 0.85 else f":target={self.target:g}"
        seeds = ""
        if self.seeds is not None:
            seeds = f":seeds={','.join(map(str, self.seeds))}"
        return f"{self.prefill}P{self.decode}D:{self.workload}{windows}{policy}{params}{target}{seeds}"


@dataclass(frozen=True)
class Run:
    label: str
    seed: int
    summary: RunSummary
    # a live run with a prefix index on KV events: their mean delay from the engine's ts to the index
    kv_event_delay_s: float | None = None
    # a live run whose load generator fell behind its schedule (the offered load was not the one asked):
    # kept, and named in the report (invalid_runs_note)
    valid: bool = True


@dataclass(frozen=True)
class CellResult:
    cell_key: str
    backend: str
    rate_rps: float
    runs: tuple[Run, ...]
    tags: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CellResult:
        return cls(
            cell_key=d["cell_key"],
            backend=d["backend"],
            rate_rps=d["rate_rps"],
            runs=tuple(
                Run(
                    r["label"],
                    r["seed"],
                    RunSummary(**r["summary"]),
                    r.get("kv_event_delay_s"),
                    r.get("valid", True),
                )
                for r in d["runs"]
            ),
            tags=d.get("tags", {}),
        )

    def invalid_runs(self) -> list[Run]:
        return [r for r in self.runs if not r.valid]

    def goodputs(self, label: str) -> list[float]:
        return [r.summary.goodput for r in sorted(self.runs, key=lambda r: r.seed) if r.label == label]

    def mean_goodput(self, label: str) -> float:
        g = self.goodputs(label)
        return sum(g) / len(g) if g else float("nan")

    def labels(self) -> list[str]:
        return list(dict.fromkeys(r.label for r in self.runs))

    def seeds(self) -> list[int]:
        return sorted({r.seed for r in self.runs})


class Experiment(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def title(self) -> str: ...

    def cells(self, quick: bool) -> list[Cell]: ...

    def report(self, results: list[CellResult], exp_dir: Path) -> str:
        """Markdown for the report (plots are written into ``exp_dir``)."""
        ...
