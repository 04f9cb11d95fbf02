"""Workload sources: what a run draws its requests from (a synthetic family, or a trace), at a given rate."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from calroute.errors import ConfigError
from calroute.types import RequestSpec
from calroute.workload.families import FAMILIES, generate_family
from calroute.workload.prefix_families import generate_prefix_family
from calroute.workload.prefix_params import PREFIX_FAMILIES
from calroute.workload.traces import Trace, load_trace

# Every name `--workload` takes: the paper's families, then the ones with prompt reuse.
WORKLOADS = FAMILIES + PREFIX_FAMILIES


def generate_workload(
    name: str, rate_rps: float, n_requests: int, seed: int, tight_fraction: float = 0.5
) -> list[RequestSpec]:
    """``n_requests`` requests of the workload ``name`` (one of WORKLOADS) at ``rate_rps`` on average."""
    if name in PREFIX_FAMILIES:
        return generate_prefix_family(name, rate_rps, n_requests, seed, tight_fraction)
    return generate_family(name, rate_rps, n_requests, seed, tight_fraction)


class WorkloadSource(Protocol):
    @property
    def name(self) -> str: ...

    def requests(self, rate_rps: float | None, seed: int) -> list[RequestSpec]:
        """The run's requests; ``rate_rps`` None means the source's own rate (traces only)."""
        ...

    def describe(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class FamilyWorkload:
    family: str
    n_requests: int
    tight_fraction: float = 0.5

    def __post_init__(self) -> None:
        if self.family not in WORKLOADS:
            raise ConfigError(f"unknown workload {self.family!r}; known: {', '.join(WORKLOADS)}")
        if self.n_requests < 1:
            raise ConfigError(f"--requests must be >= 1, got {self.n_requests}")

    @property
    def name(self) -> str:
        return self.family

    def requests(self, rate_rps: float | None, seed: int) -> list[RequestSpec]:
        if rate_rps is None:
            raise ConfigError(f"workload {self.family!r} needs a rate: give --rate or --saturate")
        return generate_workload(self.family, rate_rps, self.n_requests, seed, self.tight_fraction)

    def describe(self) -> dict[str, Any]:
        return {"workload": self.family, "requests": self.n_requests, "tight_fraction": self.tight_fraction}


def workload_source(
    name: str, n_requests: int, tight_fraction: float = 0.5, trace_windows: int = 1
) -> WorkloadSource:
    """A family by name, or else a trace file at that path (what an experiment's cell names), replayed in
    ``trace_windows`` windows (TraceWorkload)."""
    if name in WORKLOADS:
        return FamilyWorkload(name, n_requests, tight_fraction)
    path = Path(name)
    if not path.is_file():
        raise ConfigError(f"workload {name!r} is neither a family ({', '.join(WORKLOADS)}) nor a trace file")
    return TraceWorkload(path, n_requests, tight_fraction, trace_windows)


class TraceWorkload:
    """A trace file; its arrivals are rescaled to the requested rate (the factor is reported)."""

    def __init__(
        self, path: Path, n_requests: int | None, tight_fraction: float = 0.5, windows: int = 1
    ) -> None:
        """``windows`` > 1 cuts the trace into that many consecutive windows of equal length (at most
        ``n_requests`` each) and seed s replays window s mod ``windows``: paired runs on distinct stretches
        of the trace, where seeds alone would only redraw the SLO classes of the same requests."""
        if windows < 1:
            raise ConfigError(f"trace windows must be >= 1, got {windows}")
        self.path = path
        self.n_requests = n_requests
        self.tight_fraction = tight_fraction
        self.windows = windows
        self.name = path.name
        self._last: Trace | None = None
        self._window_len: int | None = None

    def requests(self, rate_rps: float | None, seed: int) -> list[RequestSpec]:
        limit, offset = self.n_requests, 0
        if self.windows > 1:
            if self._window_len is None:
                total = len(load_trace(self.path).requests)
                self._window_len = max(1, total // self.windows)
                if self.n_requests is not None:
                    self._window_len = min(self._window_len, self.n_requests)
            limit, offset = self._window_len, (seed % self.windows) * self._window_len
        trace = load_trace(
            self.path,
            seed=seed,
            tight_fraction=self.tight_fraction,
            rate_rps=rate_rps,
            limit=limit,
            offset=offset,
        )
        self._last = trace
        return trace.requests

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"trace": str(self.path), "requests": self.n_requests}
        if self._last is not None:
            d.update(
                format=self._last.format,
                native_rate_rps=self._last.native_rate_rps,
                scale_factor=self._last.scale_factor,
                clamped=self._last.clamped,
            )
        return d
