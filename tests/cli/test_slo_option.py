"""`--slo SPEC` of simulate, serve, run and experiment: the targets it names reach what judges the runs, the
default is the paper's, and a bad spec is refused by the option's name before anything starts. Each command
runs in process up to its runs, which fakes replace (no engine, proxy or simulation starts)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from calroute.cli.app import app
from calroute.costmodel.calibration import SloTargets
from calroute.costmodel.profiles import DEFAULT_PROFILE, get_profile
from calroute.costmodel.slo import resolve_slo
from calroute.experiments.kit.cells import CellResult, Run
from calroute.experiments.kit.live_backend import LiveBackend
from calroute.experiments.kit.sim_backend import SimBackend
from calroute.results.metrics import summarize
from tests.cli.test_serve import serve as serve_config
from tests.conftest import unreachable_cluster

CAL = get_profile(DEFAULT_PROFILE).calibration


class Reached(Exception):
    """Raised by a fake where the command would start its runs: it got this far with these targets."""


def simulate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slo: list[str]
) -> tuple[int, str, SloTargets | None]:
    seen: list[SloTargets] = []

    def compare(setup: Any, *args: Any, **kwargs: Any) -> list[Any]:
        seen.append(setup.profile.calibration.slo)
        return []

    monkeypatch.setattr("calroute.cli.simulate.compare", compare)
    res = CliRunner().invoke(app, ["simulate", "--workload", "chat", "--rate", "1", "--json", *slo])
    if res.exit_code == 0:  # the summary names the spec and gives the targets the runs were judged by
        doc = json.loads(res.stdout)["slo"]
        assert doc == {"spec": slo[1] if slo else "paper", **seen[0].to_dict()}
    return res.exit_code, res.stderr, seen[0] if seen else None


def serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slo: list[str]
) -> tuple[int, str, SloTargets | None]:
    code, stderr, seen = serve_config(tmp_path, monkeypatch, *slo)
    return code, stderr, seen[0].calibration.slo if seen else None


def _capture_run_experiment(
    monkeypatch: pytest.MonkeyPatch, seen: list[SloTargets], shape: tuple[int, int], result: Any = None
) -> None:
    """The runner's entry point replaced: it notes the targets the backend judges by, then returns ``result``
    (or stops the command where its runs would start)."""

    def run_experiment(exp: Any, backend: Any, *args: Any, slo: Any, **kwargs: Any) -> Any:
        if isinstance(backend, SimBackend):
            judged = backend.profile.calibration.slo
        else:
            assert isinstance(backend, LiveBackend)
            assert backend.slo == slo  # the runner keys saved results by the spec the backend judges by
            # `run`: the cluster at hand, judged by the spec; an experiment's clusters are not brought up here
            judged = backend.setup_for(*shape).calibration.slo if backend.fixed else backend.slo.resolve(CAL)
        seen.append(judged)
        if result is None:
            raise Reached
        return result

    monkeypatch.setattr("calroute.experiments.kit.runner.run_experiment", run_experiment)


def run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slo: list[str]
) -> tuple[int, str, SloTargets | None]:
    cluster, cal = tmp_path / "cluster.yaml", tmp_path / "calibration.json"
    unreachable_cluster(1, 1).save(cluster)
    CAL.save(cal)
    seen: list[SloTargets] = []
    monkeypatch.setattr("calroute.harness.gates.require_gates", lambda c: [])
    # one run with no requests: enough for the command to write its summary and table
    runs = (Run("round_robin", 0, summarize([], CAL.slo)),)
    _capture_run_experiment(monkeypatch, seen, (1, 1), [CellResult("1P1D", "emulated", 1.0, runs)])
    argv = [
        "run",
        "--cluster",
        str(cluster),
        "--calibration",
        str(cal),
        "--rate",
        "1",
        "--out",
        str(tmp_path),
    ]
    res = CliRunner().invoke(app, [*argv, *slo])
    if res.exit_code == 0:  # summary.json names the spec and gives the targets, as simulate --json does
        doc = json.loads((tmp_path / "summary.json").read_text())["slo"]
        # a spec file's path is recorded relative to the summary's folder (experiments/kit/paths.py)
        spec = Path(slo[1]).name if slo and Path(slo[1]).is_absolute() else slo[1] if slo else "paper"
        assert doc == {"spec": spec, **seen[0].to_dict()}
    return res.exit_code, res.stderr, seen[0] if seen else None


def experiment(
    backend: str,
) -> Callable[[Path, pytest.MonkeyPatch, list[str]], tuple[int, str, SloTargets | None]]:
    def invoke(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slo: list[str]
    ) -> tuple[int, str, SloTargets | None]:
        seen: list[SloTargets] = []
        _capture_run_experiment(monkeypatch, seen, (2, 4))
        argv = ["experiment", "mixed-bursty", "--backend", backend, "--out", str(tmp_path), *slo]
        res = CliRunner().invoke(app, argv)
        return (
            (0 if isinstance(res.exception, Reached) else res.exit_code),
            res.stderr,
            seen[0] if seen else None,
        )

    return invoke


COMMANDS = {
    "simulate": simulate,
    "serve": serve,
    "run": run,
    "experiment-sim": experiment("sim"),
    "experiment-emulated": experiment("emulated"),
}


def slo_file(tmp_path: Path) -> str:
    path = tmp_path / "slo.yaml"
    path.write_text("tight: {ttft_s: 0.3, ttft_s_per_token: 2.0e-4}\nloose: {tpot_s: 0.5}\n")
    return str(path)


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("spec", ["paper", "long-context", "file", None])
def test_the_slo_reaches_the_runs(
    command: str, spec: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    given = slo_file(tmp_path) if spec == "file" else spec
    code, stderr, judged = COMMANDS[command](tmp_path, monkeypatch, [] if given is None else ["--slo", given])
    assert code == 0, stderr
    assert judged == resolve_slo(given or "paper", CAL)
    assert judged.per_token is (spec in ("long-context", "file"))


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize(
    ("spec", "message"),
    [("long_context", "not a preset (paper, long-context) nor a file"), ("file", "tight.ttft_ms")],
)
def test_a_bad_slo_is_refused_by_name_before_anything_runs(
    command: str, spec: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if spec == "file":
        (tmp_path / "bad.yaml").write_text("tight: {ttft_ms: 200}\n")
        spec = str(tmp_path / "bad.yaml")
    code, stderr, judged = COMMANDS[command](tmp_path, monkeypatch, ["--slo", spec])
    text = " ".join(stderr.split())  # rich wraps lines
    assert code == 2 and "--slo" in text and message in text and judged is None
