"""The Ray executor: the executor contract, the same experiment results as the local executor, and a clean
stop. One Ray instance serves the whole module (each start costs seconds); the last test stops it."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from calroute.costmodel.profiles import DEFAULT_PROFILE, get_profile
from calroute.errors import ConfigError
from calroute.executors import Executor, make_executor
from calroute.executors.ray import RayExecutor, parse_address
from calroute.experiments.kit.cells import Cell, CellResult, SaturationQuery
from calroute.experiments.kit.runner import Scale, run_experiment
from calroute.experiments.kit.sim_backend import SimBackend
from calroute.routing.variant import Variant
from tests.executors.test_local import _fail_on_three, _square

PROFILE = get_profile(DEFAULT_PROFILE)


@pytest.fixture(scope="module")
def ray2() -> Iterator[Executor]:
    with make_executor("ray", 2) as ex:
        yield ex


def test_map_returns_results_in_item_order_as_they_arrive(ray2: Executor) -> None:
    seen: list[tuple[int, int]] = []
    assert ray2.map(_square, list(range(7)), on_result=lambda i, r: seen.append((i, r))) == [
        x * x for x in range(7)
    ]
    assert sorted(seen) == [(x, x * x) for x in range(7)]


def test_an_items_exception_reaches_the_caller_as_its_own_type(ray2: Executor) -> None:
    with pytest.raises(ValueError, match="three") as caught:
        ray2.map(_fail_on_three, [1, 2, 3, 4])
    assert type(caught.value) is ValueError
    assert ray2.map(_square, [5]) == [25]  # the executor is still usable after a failed map


class TwoCells:
    """Two cells on two shapes, each saturated on its own: the runner's searches run side by side."""

    name = "two"
    title = "two cells"

    def cells(self, quick: bool) -> list[Cell]:
        variants = (Variant("least_loaded", "least_loaded"), Variant("marginal_cost", "marginal_cost"))
        return [Cell("1P2D", 1, 2, "mixed-bursty", variants), Cell("2P2D", 2, 2, "chat", variants)]

    def report(self, results: list[CellResult], exp_dir: Path) -> str:
        return ""


def _experiment_on(ex: Executor, out: Path) -> tuple[list[CellResult], dict[str, bytes], str, float]:
    backend = SimBackend(PROFILE, executor=ex)
    results = run_experiment(TwoCells(), backend, True, out, scale=Scale(120, (0, 1)))
    records = {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*.jsonl"))}
    # one search alone, with fewer searches than workers: its probes' seeds spread over them instead
    alone = backend.saturation_rate(SaturationQuery(1, 1, "chat", 120))
    return results, records, (out / "two" / "saturation.json").read_text(), alone


def test_an_experiment_gives_the_same_results_on_every_executor(ray2: Executor, tmp_path: Path) -> None:
    with make_executor("local", 1) as local1:
        expected = _experiment_on(local1, tmp_path / "local1")
    results, records, saturation, alone = expected
    assert len(records) == 2 * 2 * 2 and all(records.values())
    assert len(json.loads(saturation)) == 2
    with make_executor("local", 2) as local2:
        assert _experiment_on(local2, tmp_path / "local2") == expected
    assert _experiment_on(ray2, tmp_path / "ray2") == expected


@pytest.mark.parametrize("address", ["10.0.0.1", "host:port", ":6379", "host:70000"])
def test_a_malformed_address_is_named(address: str) -> None:
    with pytest.raises(ConfigError, match=f"--address must be HOST:PORT.*{address}"):
        make_executor("ray", 2, address)


def test_addresses_parse_with_or_without_the_client_scheme() -> None:
    assert parse_address("10.0.0.1:6379") == ("10.0.0.1", 6379)
    assert parse_address("ray://head:10001") == ("head", 10001)
    assert parse_address("[::1]:6379") == ("::1", 6379)


def _ray_processes_under(pid: int) -> dict[int, str]:
    """The live processes descended from ``pid`` whose command line names Ray (its GCS, raylet, agents
    and workers), by pid."""
    parents: dict[int, int] = {}
    cmdlines: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone while we looked
            continue
        # the command name (field 2) may hold spaces: the fields after its closing parenthesis are fixed
        state, ppid = stat.rpartition(")")[2].split()[:2]
        if state != "Z":  # a zombie has stopped; only its exit status is left for its parent
            parents[int(entry.name)] = int(ppid)
            cmdlines[int(entry.name)] = cmdline

    def descends(p: int) -> bool:
        while p in parents:
            p = parents[p]
            if p == pid:
                return True
        return False

    return {p: c for p, c in cmdlines.items() if descends(p) and "ray" in c}


def test_close_stops_every_ray_process_it_started(ray2: Executor) -> None:
    """Last in the module: it closes the module's Ray instance."""
    assert isinstance(ray2, RayExecutor)
    started = _ray_processes_under(os.getpid())
    assert any("raylet" in c for c in started.values()) and any("gcs_server" in c for c in started.values())
    ray2.close()
    # ray.shutdown signals them and waits for most; a worker may take a moment to exit (bounded wait)
    deadline = time.monotonic() + 30
    while (left := set(started) & set(_ray_processes_under(os.getpid()))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, [started[p] for p in left]
    with pytest.raises(RuntimeError, match="closed"):
        ray2.map(_square, [1])
