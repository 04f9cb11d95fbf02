"""The experiment runner: the saturation rate a cell runs at, and what it records of it."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from calroute.errors import ConfigError
from calroute.experiments.kit.cells import Cell, CellResult, Run, SaturationQuery
from calroute.experiments.kit.paths import REPO
from calroute.experiments.kit.runner import Scale, run_experiment
from calroute.results.metrics import RunSummary
from calroute.routing.variant import Variant

CROSSING_RPS = {"round_robin": 4.0, "least_loaded": 6.0, "cache_aware": 9.0, "marginal_cost": 10.0}


class FakeBackend:
    name = "fake"

    def __init__(self, late_seeds: tuple[int, ...] = ()) -> None:
        self.late_seeds = late_seeds  # runs whose load generator fell behind: invalid
        self.searched: list[str] = []
        self.rates: list[float] = []

    def saturation_rate(self, query: SaturationQuery) -> float:
        self.searched.append(query.policy)
        return CROSSING_RPS[query.policy]

    def run_cell(
        self,
        cell: Cell,
        rate_rps: float,
        seeds: Sequence[int],
        requests: int,
        records_dir: Path,
        on_run: Callable[[Run], None],
    ) -> list[Run]:
        self.rates.append(rate_rps)
        summary = RunSummary(10, 10, 9, 0.9, 0.1, 0.2, 0.01, 0.02, 1.0, 9.0, {"ok": 10})
        return [
            Run(v.label, s, summary, valid=s not in self.late_seeds) for s in seeds for v in cell.variants
        ]


class OneCell:
    name = "one"
    title = "one cell"

    def __init__(self, cell: Cell) -> None:
        self.cell = cell

    def cells(self, quick: bool) -> list[Cell]:
        return [self.cell]

    def report(self, results: list[CellResult], exp_dir: Path) -> str:
        return ""


def test_a_cell_runs_where_the_strongest_of_its_reference_policies_crosses(tmp_path: Path) -> None:
    cell = Cell(
        "c",
        2,
        4,
        "chat",
        (Variant("marginal_cost", "marginal_cost"),),
        saturate_on=("least_loaded", "cache_aware"),
        measure_saturation_of=("marginal_cost", "least_loaded"),
    )
    backend = FakeBackend()
    (result,) = run_experiment(OneCell(cell), backend, False, tmp_path, scale=Scale(10, (0, 1)))
    assert backend.rates == [9.0] and result.rate_rps == 9.0
    assert result.tags["saturation_rps"] == {"least_loaded": 6.0, "cache_aware": 9.0, "marginal_cost": 10.0}
    assert sorted(backend.searched) == ["cache_aware", "least_loaded", "marginal_cost"]
    # a second run reuses the saved searches and the saved cell
    again = FakeBackend()
    run_experiment(OneCell(cell), again, False, tmp_path, scale=Scale(10, (0, 1)))
    assert again.searched == [] and again.rates == []


def test_by_default_round_robin_sets_the_rate(tmp_path: Path) -> None:
    cell = Cell("c", 2, 4, "chat", (Variant("round_robin", "round_robin"),), rate_factor=0.5)
    backend = FakeBackend()
    (result,) = run_experiment(OneCell(cell), backend, False, tmp_path, scale=Scale(10, (0,)))
    assert backend.searched == ["round_robin"] and result.rate_rps == 2.0
    assert "saturation_rps" not in result.tags


def test_a_policy_is_searched_with_the_parameters_of_its_variant(tmp_path: Path) -> None:
    queries: list[SaturationQuery] = []

    class Recording(FakeBackend):
        def saturation_rate(self, query: SaturationQuery) -> float:
            queries.append(query)
            return super().saturation_rate(query)

    cell = Cell(
        "c",
        2,
        4,
        "chat",
        (
            Variant("marginal_cost", "marginal_cost", {"w_evict": 2.5, "rho": 0.5}),  # as --params gives it
            Variant("marginal_cost-no-slo", "marginal_cost", {"use_slo": False}),  # not the one searched
            Variant("least_loaded", "least_loaded"),
        ),
        saturate_on=("marginal_cost",),
        measure_saturation_of=("least_loaded",),
    )
    run_experiment(OneCell(cell), Recording(), False, tmp_path, scale=Scale(10, (0,)))
    by_policy = {q.policy: q for q in queries}
    assert by_policy["marginal_cost"].params == (("rho", 0.5), ("w_evict", 2.5))
    assert by_policy["least_loaded"].params == ()
    # defaults keep the key saved before parameters could be given; parameters get their own
    assert by_policy["least_loaded"].key == "2P4D:chat:least_loaded"
    assert by_policy["marginal_cost"].key.startswith("2P4D:chat:marginal_cost:params=")


def test_the_manifest_records_no_absolute_path(tmp_path: Path) -> None:
    trace = REPO / "data" / "traces" / "mooncake_fast25" / "synthetic_trace.jsonl"
    cell = Cell("c", 2, 4, str(trace), (Variant("round_robin", "round_robin"),), rate_rps=1.0)
    out = tmp_path / "out"
    run_experiment(OneCell(cell), FakeBackend(), False, out, extra_manifest={"out": str(out)})
    text = (out / "one" / "manifest.json").read_text()
    assert str(tmp_path) not in text and str(REPO) not in text
    manifest = json.loads(text)
    assert manifest["out"] == ".." and manifest["cells"][0]["workload"] == str(trace.relative_to(REPO))


class TwoCells(OneCell):
    name = "two"

    def cells(self, quick: bool) -> list[Cell]:
        return [self.cell, Cell("d", 1, 2, "chat", self.cell.variants, rate_rps=2.0)]


def test_only_the_cells_asked_run_and_an_unknown_one_is_named(tmp_path: Path) -> None:
    exp = TwoCells(Cell("c", 2, 4, "chat", (Variant("round_robin", "round_robin"),), rate_rps=1.0))
    backend = FakeBackend()
    (result,) = run_experiment(exp, backend, False, tmp_path, scale=Scale(10, (0,)), only_cells=("d",))
    assert result.cell_key == "d" and backend.rates == [2.0]
    with pytest.raises(ConfigError, match=r"--cell: 'e' is no cell of two; its cells: c, d"):
        run_experiment(exp, FakeBackend(), False, tmp_path, only_cells=("d", "e"))


def test_invalid_runs_are_kept_and_named_in_the_report(tmp_path: Path) -> None:
    cell = Cell("c", 2, 4, "chat", (Variant("round_robin", "round_robin"),), rate_rps=1.0)
    late = FakeBackend(late_seeds=(1,))
    (result,) = run_experiment(OneCell(cell), late, False, tmp_path, scale=Scale(10, (0, 1, 2)))
    assert [r.seed for r in result.invalid_runs()] == [1] and len(result.runs) == 3
    report = (tmp_path / "one" / "report.md").read_text()
    assert "**Invalid runs**" in report and "- c: round_robin seed 1" in report
    saved = json.loads((tmp_path / "one" / "results.json").read_text())
    assert CellResult.from_dict(saved[0]) == result
    clean = tmp_path / "clean"
    run_experiment(OneCell(cell), FakeBackend(), False, clean, scale=Scale(10, (0,)))
    assert "Invalid" not in (clean / "one" / "report.md").read_text()
