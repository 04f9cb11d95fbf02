"""Engine clusters for the compatibility suite: the same tests run on emulated and on real vLLM engines."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from calroute.engines import launch, vllm
from calroute.engines.cluster import ClusterFile

REPO = Path(__file__).resolve().parents[2]


# Module scope: idle vLLM CPU engines keep about a core busy, which would skew every timing test after them.
@pytest.fixture(scope="module", params=["emulated", "vllm"])
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ClusterFile]:
    """1 prefill + 2 decode emulated engines, or 1 prefill + 1 decode real vLLM engines with NIXL."""
    logs = tmp_path_factory.mktemp(f"engines-{request.param}")
    if request.param == "emulated":
        launched = launch.up_emulated(1, 2, logs, process_per_engine=True)
    else:
        venv, model = vllm.default_vllm_paths(REPO)
        if not vllm.vllm_available(venv, model):
            pytest.fail("real vLLM is not installed: run `make vllm` (make test does it)")
        launched = launch.up_vllm(1, 1, logs, repo_root=REPO)
    try:
        yield launched.file
    finally:
        launched.stop()
