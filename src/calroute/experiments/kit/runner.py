"""Run an experiment's cells on a backend: saturation first, then every variant and seed; each finished
cell is saved at once, so a killed experiment resumes where it stopped. A manifest records what ran.

A saved cell is reused only if it was made from the same cell definition (variants, their parameters, the
rate) and scale; a cell made by another commit is reused with a note, since a changed default inside a
policy is invisible to the definition."""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from calroute.costmodel.slo import PAPER, PRESETS, SloSpec
from calroute.errors import ConfigError
from calroute.experiments.kit.cells import Cell, CellResult, Experiment, Run, SaturationQuery
from calroute.experiments.kit.paths import REPO, recorded_paths
from calroute.results.provenance import git_commit


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


@dataclass(frozen=True)
class Scale:
    requests: int
    seeds: tuple[int, ...]


def scale_for(backend: str, quick: bool) -> Scale:
    if backend == "sim":
        return Scale(300, (0,)) if quick else Scale(4000, (0, 1, 2))
    return Scale(120, (0,)) if quick else Scale(800, (0, 1, 2))


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)  # atomic: a kill never leaves half a result


def _saturation_queries(cell: Cell, scale: Scale, slo_key: str) -> dict[str, tuple[str, SaturationQuery]]:
    """The searches a cell's rate and tags need, by policy: each with the key its answer is saved under."""
    if cell.rate_rps is not None and not cell.measure_saturation_of:
        return {}
    p, d = cell.saturation_shape
    # A policy is searched with the parameters of the cell's variant named after it (the file's, under
    # `--params`), so the rate and the crossing rates reported are those of what the cell runs.
    params = {v.policy: v.params for v in cell.variants if v.label == v.policy}
    out = {}
    for policy in dict.fromkeys((*cell.saturate_on, *cell.measure_saturation_of)):
        own = tuple(sorted(params.get(policy, {}).items()))
        query = SaturationQuery(
            p,
            d,
            cell.workload,
            scale.requests,
            policy,
            cell.trace_windows,
            own,
            cell.saturation_target,
            tuple(scale.seeds) if cell.saturate_on_run_seeds else None,
        )
        out[policy] = (query.key + slo_key, query)
    return out


def invalid_runs_note(results: list[CellResult]) -> str:
    """The live runs whose load generator fell behind its schedule, by cell: their figures are in the tables
    above, made at an offered load that was not the one asked (empty when there are none)."""
    lines = [
        f"- {c.cell_key}: " + ", ".join(f"{r.label} seed {r.seed}" for r in c.invalid_runs())
        for c in results
        if c.invalid_runs()
    ]
    if not lines:
        return ""
    return (
        "\n**Invalid runs** (the load generator fell behind its schedule: p99 lateness past its bound, so "
        "the offered load was not the one asked; their figures are in the tables above):\n\n"
        + "\n".join(lines)
        + "\n"
    )


def run_experiment(
    exp: Experiment,
    backend: Backend,
    quick: bool,
    out_dir: Path,
    progress: Callable[[str], None] = lambda msg: None,
    extra_manifest: dict[str, Any] | None = None,
    scale: Scale | None = None,
    slo: SloSpec = PRESETS[PAPER],
    engine_limits: Mapping[str, int] | None = None,
    only_cells: Sequence[str] = (),
) -> list[CellResult]:
    """``only_cells``: run only the cells of these keys (none: all); an unknown key is a ConfigError naming
    the experiment's. ``slo``: the spec the backend judges by (given to both, the runner keys saved results
    by it).
    ``engine_limits``: the limits the backend's engines were given in place of the profile's (the runner keys
    saved results and saturation rates by them too)."""
    limits = dict(sorted((engine_limits or {}).items()))
    exp_dir = out_dir / exp.name
    scale = scale or scale_for(backend.name, quick)
    cells = exp.cells(quick)
    if only_cells:
        known = [c.key for c in cells]
        unknown = [k for k in only_cells if k not in known]
        if unknown:
            raise ConfigError(
                f"--cell: {', '.join(map(repr, unknown))} is no cell of {exp.name}"
                f"{' --quick' if quick else ''}; its cells: {', '.join(known)}"
            )
        cells = [c for c in cells if c.key in only_cells]
    manifest = {
        "experiment": exp.name,
        "title": exp.title,
        "backend": backend.name,
        "quick": quick,
        "scale": asdict(scale),
        "git_commit": git_commit(REPO),
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cells": [asdict(c) for c in cells],
        "slo": slo.definition(),
        **({"engine_limits": limits} if limits else {}),
        **(extra_manifest or {}),
    }
    # paths relative to the experiment's folder or the repository (kit/paths.py): no machine's in it
    _write_json(exp_dir / "manifest.json", recorded_paths(manifest, exp_dir))
    sat_path = exp_dir / "saturation.json"
    saturation: dict[str, float] = json.loads(sat_path.read_text()) if sat_path.exists() else {}
    commit = manifest["git_commit"]
    slo_key = "" if slo.is_paper else f":slo={slo.key}"
    # the engine limits, where given, key the results as the SLO spec does (none: as before they could be)
    slo_key += "".join(f":{k}={v}" for k, v in limits.items())
    saved: dict[str, CellResult] = {}
    definitions: dict[str, Any] = {}
    for cell in cells:
        # What the saved result must have been made from to be reused: the cell (variants, parameters,
        # rate) and the scale, as JSON would hold them.
        # Under other SLO targets every goodput differs: the spec is part of the definition, left out for the
        # paper's so results saved before targets could change are still reused.
        made_of: dict[str, Any] = {"cell": asdict(cell), "scale": asdict(scale)}
        if not slo.is_paper:
            made_of["slo"] = slo.definition()
        if limits:
            made_of["engine_limits"] = limits
        definitions[cell.key] = definition = json.loads(json.dumps(made_of))
        path = exp_dir / "cells" / f"{cell.key}.json"
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        if data.get("definition", definition) == definition:
            saved[cell.key] = CellResult.from_dict(data)
            made_by = data.get("git_commit")
            stale = f" (made by commit {made_by[:10]}, not this one)" if made_by and made_by != commit else ""
            progress(f"{exp.name}/{cell.key}: done earlier, skipped{stale}")
        else:
            progress(
                f"{exp.name}/{cell.key}: saved with other variants, parameters or scale: running it again"
            )
    to_run = [cell for cell in cells if cell.key not in saved]

    def on_rate(key: str, rate: float) -> None:
        saturation[key] = rate
        _write_json(sat_path, saturation)  # each search saved as it ends: a kill loses only those running

    if isinstance(backend, ManySaturations):
        # Every search the remaining cells need, at once: a backend with workers runs them side by side.
        missing = {
            key: query
            for cell in to_run
            for key, query in _saturation_queries(cell, scale, slo_key).values()
            if key not in saturation
        }
        if missing:
            for key in missing:
                progress(f"{exp.name}: saturation search on {key}")
            keys = {q: k for k, q in missing.items()}
            backend.saturation_rates(list(missing.values()), lambda q, rate: on_rate(keys[q], rate))
            # The searches ended in whatever order the workers finished them: file them in the queries'
            # order, so the file is the same whatever the executor.
            for key in missing:
                saturation[key] = saturation.pop(key)
            _write_json(sat_path, saturation)
    results = []
    for cell in cells:
        if cell.key in saved:
            results.append(saved[cell.key])
            continue
        rate = cell.rate_rps
        tags = dict(cell.tags)
        if rate is None or cell.measure_saturation_of:
            rates: dict[str, float] = {}
            for policy, (key, query) in _saturation_queries(cell, scale, slo_key).items():
                if key not in saturation:
                    progress(f"{exp.name}: saturation search on {key}")
                    on_rate(key, backend.saturation_rate(query))
                rates[policy] = saturation[key]
            if cell.measure_saturation_of:
                tags["saturation_rps"] = rates
            if rate is None:
                rate = max(rates[policy] for policy in cell.saturate_on) * cell.rate_factor
        progress(
            f"{exp.name}/{cell.key}: {len(cell.variants)} variants x {len(scale.seeds)} seeds "
            f"at {rate:.2f} req/s"
        )

        def on_run(run: Run, key: str = cell.key) -> None:
            progress(f"  {key} {run.label} seed {run.seed}: goodput {run.summary.goodput:.3f}")

        runs = backend.run_cell(
            cell, rate, scale.seeds, scale.requests, exp_dir / "records" / cell.key, on_run
        )
        result = CellResult(cell.key, backend.name, rate, tuple(runs), tags)
        path = exp_dir / "cells" / f"{cell.key}.json"
        _write_json(path, {**result.to_dict(), "definition": definitions[cell.key], "git_commit": commit})
        results.append(result)
    _write_json(exp_dir / "results.json", [r.to_dict() for r in results])
    section = exp.report(results, exp_dir) + invalid_runs_note(results)
    (exp_dir / "report.md").write_text(section)
    return results
