"""The mypyc-compiled simulator (setup.py, `make compiled`) writes the records the sources write, byte for
byte. Compiled code coerces ints to floats at typed boundaries and runs native arithmetic, so equality is
not a given: these runs cover the paths where that could show (overload with preemption, predictor noise,
the oracle, every compiled policy). The build is made here if missing or stale (make's own timestamps),
bounded in time.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPILED = ROOT / "build" / "compiled"


@pytest.fixture(scope="module")
def compiled_path() -> Path:
    subprocess.run(["make", "-s", "compiled"], cwd=ROOT, check=True, timeout=900)
    return COMPILED


def _simulate(out: Path, args: list[str], pythonpath: Path | None) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    cmd = [sys.executable, "-m", "calroute", "simulate", *args, "--seeds", "2", "--out", str(out)]
    subprocess.run(cmd, env=env, check=True, timeout=300, capture_output=True)


def test_compiled_build_is_compiled(compiled_path: Path) -> None:
    code = (
        "import calroute.sim.decode as d, calroute.routing.ledger as l; print(d.__file__); print(l.__file__)"
    )
    env = {**os.environ, "PYTHONPATH": str(compiled_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
    files = out.stdout.split()
    assert all(f.startswith(str(compiled_path)) and f.endswith(".so") for f in files), files


# Every frozen dataclass of the compiled modules pickles by its constructor (types.PicklesByConstructor), as
# a process pool needs: compiled, pickle's default would restore them attribute by attribute, and fail.
_PICKLE_CHECK = """
import dataclasses, importlib, pickle, sys
from calroute.costmodel.profiles import get_profile
from calroute.policies.marginal_cost import Params
from calroute.results.metrics import summarize
from calroute.types import Admission, PicklesByConstructor, SloClass
missing = []
for path in sys.argv[1:]:
    module = importlib.import_module(path.removeprefix("src/").removesuffix(".py").replace("/", "."))
    for cls in vars(module).values():
        if (
            isinstance(cls, type)
            and cls.__module__ == module.__name__
            and dataclasses.is_dataclass(cls)
            and cls.__dataclass_params__.frozen
            and not issubclass(cls, PicklesByConstructor)
        ):
            missing.append(f"{module.__name__}.{cls.__name__}")
assert not missing, missing
cal = get_profile("a40-qwen2.5-3b").calibration
for obj in (cal, Params(w_b=0.5), summarize([], cal.slo), Admission("r", 700, 180, SloClass.TIGHT)):
    assert pickle.loads(pickle.dumps(obj)) == obj, obj
print("ok")
"""


def test_the_compiled_frozen_dataclasses_pickle(compiled_path: Path) -> None:
    setup_py = ast.parse((ROOT / "setup.py").read_text())
    modules = next(
        ast.literal_eval(node.value)
        for node in setup_py.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "COMPILED_MODULES"
    )
    env = {**os.environ, "PYTHONPATH": str(compiled_path)}
    out = subprocess.run(
        [sys.executable, "-c", _PICKLE_CHECK, *modules],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# A loaded shared-prefix run whose router hears the engines' KV events: every prefix path of the simulator.
SHARED_PREFIX_ON_EVENTS = [
    "--workload",
    "shared-prefix",
    "--rate",
    "8",
    "--requests",
    "800",
    "--prefix-source",
    "precise",
]

CASES = {
    "mixed-bursty, every compiled policy": [
        "--workload",
        "mixed-bursty",
        "--rate",
        "11",
        "--requests",
        "1500",
        "--policies",
        "round_robin,least_loaded,length_heuristic,marginal_cost",
    ],
    "overload with preemption, noisy predictor": [
        "--workload",
        "reasoning",
        "--rate",
        "40",
        "--requests",
        "800",
        "--prefill",
        "1",
        "--decode",
        "1",
        "--predictor-noise",
        "0.5",
        "--policies",
        "marginal_cost,power_of_two,random",
    ],
    "documents, oracle predictor": [
        "--workload",
        "document",
        "--rate",
        "6",
        "--requests",
        "600",
        "--predictor",
        "oracle",
        "--policies",
        "marginal_cost",
    ],
    "shared prefixes on KV events: the caches (kvcache/pool.py) and the index": [
        *SHARED_PREFIX_ON_EVENTS,
        "--policies",
        "marginal_cost,cache_aware",
    ],
    "shared prefixes on KV events: the ledger's active blocks, a placements-only index": [
        *SHARED_PREFIX_ON_EVENTS,
        "--policies",
        "kv_overlap_cost,prefix_scorer_mix",
        "--param",
        "kv_overlap_cost.assume_kv_reuse=true",
    ],
}


@pytest.mark.parametrize("args", list(CASES.values()), ids=list(CASES))
def test_compiled_records_equal_the_sources(compiled_path: Path, tmp_path: Path, args: list[str]) -> None:
    _simulate(tmp_path / "pure", args, None)
    _simulate(tmp_path / "compiled", args, compiled_path)
    pure = sorted((tmp_path / "pure" / "records").iterdir())
    assert pure, "no record files written"
    for f in pure:
        assert f.read_bytes() == (tmp_path / "compiled" / "records" / f.name).read_bytes(), f.name
