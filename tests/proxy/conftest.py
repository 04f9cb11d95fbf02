"""Emulated clusters and in-thread proxies for the proxy tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from calroute.cluster import launch
from calroute.cluster.file import ClusterFile
from calroute.costmodel.profiles import get_profile
from calroute.proxy.config import ProxyConfig
from tests.proxy.harness import RunningProxy

CAL = get_profile("a40-qwen2.5-3b").calibration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterFile]:
    """2 prefill + 2 decode emulated engines, shared by the non-destructive tests of a module."""
    launched = launch.up_emulated(2, 2, tmp_path_factory.mktemp("engines"))
    try:
        yield launched.file
    finally:
        launched.stop()


@pytest.fixture
def fresh_cluster(tmp_path: Path) -> Iterator[Callable[..., ClusterFile]]:
    """A cluster for one destructive test (one process per engine, so one can be killed)."""
    started: list[launch.LaunchedCluster] = []

    def make(prefill: int = 2, decode: int = 2) -> ClusterFile:
        launched = launch.up_emulated(
            prefill, decode, tmp_path / f"engines{len(started)}", process_per_engine=True
        )
        started.append(launched)
        return launched.file

    try:
        yield make
    finally:
        for launched in started:
            launched.stop()


@pytest.fixture
def proxy_for(tmp_path: Path) -> Iterator[Callable[..., RunningProxy]]:
    running: list[RunningProxy] = []

    def make(cluster: ClusterFile, **kw: Any) -> RunningProxy:
        kw.setdefault("health_interval_s", 0.2)
        cfg = ProxyConfig(
            cluster=cluster,
            calibration=CAL,
            log_path=tmp_path / f"log{len(running)}.jsonl",
            decision_log_path=tmp_path / f"decisions{len(running)}.jsonl",
            **kw,
        )
        p = RunningProxy(cfg)
        running.append(p)
        return p

    try:
        yield make
    finally:
        for p in running:
            p.stop()
