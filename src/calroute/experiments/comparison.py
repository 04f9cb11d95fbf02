"""A plain comparison: the given policies on one cluster and workload (`calroute run`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from calroute.experiments.base import goodput_table
from calroute.experiments.cells import Cell, CellResult
from calroute.routing.variant import Variant


@dataclass(frozen=True)
class Comparison:
    prefill: int
    decode: int
    workload: str
    policies: tuple[str, ...]
    rate_rps: float | None
    name: str = "comparison"
    params: dict[str, dict[str, str]] = field(default_factory=dict)  # per policy, as given on the CLI

    @property
    def title(self) -> str:
        return f"{self.workload}, {self.prefill}P+{self.decode}D"

    def cells(self, quick: bool) -> list[Cell]:
        variants = tuple(Variant(p, p, dict(self.params.get(p, {}))) for p in self.policies)
        return [
            Cell(
                f"{self.prefill}P{self.decode}D",
                self.prefill,
                self.decode,
                self.workload,
                variants,
                rate_rps=self.rate_rps,
            )
        ]

    def report(self, results: list[CellResult], exp_dir: Path) -> str:
        return f"## {self.title}\n\n" + goodput_table(results, "cluster")


def summary_json(result: CellResult) -> dict[str, object]:
    """The shape of `calroute simulate --json`."""
    return {
        "rate_rps": result.rate_rps,
        "backend": result.backend,
        "runs": [
            {
                "policy": r.label,
                "seed": r.seed,
                "requests": r.summary.requests,
                "goodput": r.summary.goodput,
                "ttft_p50_s": r.summary.ttft_p50_s,
                "ttft_p99_s": r.summary.ttft_p99_s,
                "tpot_p50_s": r.summary.tpot_p50_s,
                "tpot_p99_s": r.summary.tpot_p99_s,
                "status_counts": r.summary.status_counts,
            }
            for r in result.runs
        ],
    }
