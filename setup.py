"""The C parts of the package, and the optional compiled build.

Every install compiles one small C extension, the two loops of a prefix-aware routing decision (src/calroute/
routing/_native.c: hashing the prompt's blocks and walking them through the prefix index), which took about 45
of the 50 microseconds a decision may take in numpy and Python (benchmarks/decision_speed.py). Building it
needs a C compiler and Python's headers.

`CALROUTE_COMPILE=1 pip install .` also compiles the simulator's hot path with mypyc (part of mypy, already
the project's type checker) into C extensions, about 7x faster (benchmarks/RESULTS.md); `make compiled`
builds it into build/compiled for the benchmark and the equivalence test. Editable installs leave the Python
modules interpreted, so that edits to src/ take effect.

Everything else (metadata, dependencies) is in pyproject.toml.
"""

from __future__ import annotations

import os

from setuptools import Extension, setup

# The modules a simulated request passes through, and the types they share. Compiled classes cannot be
# monkeypatched or subclassed from Python, which none of these need; tests run against the pure sources.
COMPILED_MODULES = [
    "src/calroute/types.py",
    "src/calroute/routing/heap.py",
    "src/calroute/costmodel/calibration.py",
    "src/calroute/costmodel/predictors.py",
    "src/calroute/routing/ledger.py",
    "src/calroute/routing/router.py",
    "src/calroute/policies/base.py",
    "src/calroute/policies/least_loaded.py",
    "src/calroute/policies/marginal_cost.py",
    "src/calroute/policies/round_robin.py",
    "src/calroute/results/records.py",
    "src/calroute/results/metrics.py",
    "src/calroute/kvcache/pool.py",
    "src/calroute/sim/kernel.py",
    "src/calroute/sim/requests.py",
    "src/calroute/sim/sampling.py",
    "src/calroute/sim/prefill.py",
    "src/calroute/sim/decode.py",
    "src/calroute/sim/simulator.py",
]

NATIVE = Extension(
    "calroute.routing._native",
    ["src/calroute/routing/_native.c"],
    extra_compile_args=["-O3"],
)

if os.environ.get("CALROUTE_COMPILE") == "1":
    from mypyc.build import mypycify

    setup(ext_modules=[NATIVE, *mypycify(COMPILED_MODULES, opt_level="3")])
else:
    setup(ext_modules=[NATIVE])
