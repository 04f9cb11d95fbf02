"""A plain comparison: the given policies on one cluster and workload, over seeds. `calroute run` runs it as
an experiment through the runner on a live cluster, `calroute simulate` on the simulator in process; both
write what it gave the same way (``write_comparison``): summary.json, every run with its records file, and
table.md, each policy's goodput minus marginal_cost's paired by seed with its 95 % interval."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calroute.experiments.kit.cells import Cell, CellResult, Run
from calroute.experiments.kit.paths import recorded_path, recorded_paths
from calroute.results.tables import RunRow, markdown_table
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
        # the table `write_comparison` writes: report.md and table.md never disagree
        return f"## {self.title}\n\n" + "\n".join(comparison_table(c.runs) for c in results)


def comparison_table(runs: Sequence[Run]) -> str:
    """One row per policy: goodput per seed, mean, spread, P99 latencies, and the paired difference to
    marginal_cost (results/tables.py)."""
    return markdown_table([RunRow(r.label, r.seed, r.summary) for r in runs])


def comparison_summary(
    runs: Sequence[Run],
    rate_rps: float | None,
    backend: str,
    records_dir: Path | None,
    folder: Path | None,
    context: Mapping[str, Any],
) -> dict[str, Any]:
    """The summary.json object (and `calroute simulate --json`'s): the rate, the backend, every run with its
    records file (``records_dir / "{policy}-seed{seed}.jsonl"``, where backends put them), then ``context``,
    what ran (workload, cluster, SLO...). With ``folder``, where the summary is written, every path in it is
    relative to that folder or the repository (kit/paths.py)."""
    out: dict[str, Any] = {
        "rate_rps": rate_rps,
        "backend": backend,
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
                "prefix_hit_ratio": r.summary.prefix_hit_ratio,
                "records": _records(records_dir, r, folder),
            }
            for r in runs
        ],
        **context,
    }
    return out if folder is None else recorded_paths(out, folder)


def _records(records_dir: Path | None, run: Run, folder: Path | None) -> str | None:
    if records_dir is None:
        return None
    path = records_dir / f"{run.label}-seed{run.seed}.jsonl"
    return str(path) if folder is None else recorded_path(path.absolute(), folder)


def write_comparison(
    folder: Path,
    runs: Sequence[Run],
    rate_rps: float | None,
    backend: str,
    records_dir: Path | None,
    context: Mapping[str, Any],
) -> dict[str, Any]:
    """summary.json and table.md in ``folder``; the summary written, as ``comparison_summary`` makes it."""
    doc = comparison_summary(runs, rate_rps, backend, records_dir, folder, context)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(json.dumps(doc, indent=2) + "\n")
    (folder / "table.md").write_text(comparison_table(runs))
    return doc
