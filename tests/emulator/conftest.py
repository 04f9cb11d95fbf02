"""Engine clusters for the compatibility suite: the same tests run on emulated and on real vLLM engines."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from calroute.cluster import launch
from calroute.cluster.file import ClusterFile


# The real-vLLM parameter uses the session's shared cluster, and its tests run at the end of the session
# (tests/conftest.py): idle vLLM CPU engines keep about a core busy, which would skew every timing test
# beside them.
@pytest.fixture(scope="module", params=["emulated", pytest.param("vllm", marks=pytest.mark.real_vllm)])
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ClusterFile]:
    """1 prefill + 2 decode emulated engines, or the session's real vLLM engines (2P+1D, NIXL)."""
    if request.param == "vllm":
        shared: ClusterFile = request.getfixturevalue("real_vllm_cluster")
        yield shared
        return
    launched = launch.up_emulated(1, 2, tmp_path_factory.mktemp("engines-emulated"), process_per_engine=True)
    try:
        yield launched.file
    finally:
        launched.stop()
