"""What the report says of vllm-router's install (benchmarks/overhead/bench.py): no path outside the repo."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmarks.overhead.method import VLLM_ROUTER_VERSION

from benchmarks.overhead import bench


def test_an_installed_router_is_named_with_its_venv_relative_to_the_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = tmp_path / ".venv-bench"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "vllm-router").touch()
    python = venv / "bin" / "python"  # answers the version check as the venv's python would
    python.write_text(f"#!/bin/sh\necho {VLLM_ROUTER_VERSION}\n")
    python.chmod(0o755)
    monkeypatch.setattr(bench, "REPO", tmp_path)
    monkeypatch.setattr(bench, "BENCH_VENV", venv)
    exe, note = bench.ensure_vllm_router(tmp_path / "install.log")
    assert exe == venv / "bin" / "vllm-router"
    assert note == f"vllm-router {VLLM_ROUTER_VERSION} from .venv-bench"
