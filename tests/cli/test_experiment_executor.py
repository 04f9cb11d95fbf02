"""`calroute experiment --executor/--workers/--address`: a Ray address that does not answer and executor
flags on a live backend are refused by name before anything is written or started."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from calroute.cli.app import app


def _closed_port() -> int:
    """A local port nothing listens on (bound once for a free number, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_a_ray_address_that_does_not_answer_is_named_and_nothing_is_written(tmp_path: Path) -> None:
    address = f"127.0.0.1:{_closed_port()}"
    out = tmp_path / "out"
    argv = ["experiment", "width", "--quick", "--out", str(out), "--executor", "ray", "--address", address]
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 2
    assert f"--address {address}: no Ray cluster answers there" in " ".join(res.stderr.split())
    assert not out.exists()


@pytest.mark.parametrize(
    "flags", [["--executor", "ray"], ["--workers", "2"], ["--address", "127.0.0.1:6379"]]
)
def test_executor_flags_are_refused_on_a_live_backend(tmp_path: Path, flags: list[str]) -> None:
    out = tmp_path / "out"
    argv = ["experiment", "width", "--backend", "emulated", "--out", str(out), *flags]
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 2
    assert "--executor, --workers and --address apply to --backend sim only" in " ".join(res.stderr.split())
    assert not out.exists()
