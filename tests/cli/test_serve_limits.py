"""`calroute serve`'s client limits reach the proxy's config, by default as the config's own defaults, and a
value no proxy could run with is refused by the option's name."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from calroute.cli.app import app
from calroute.proxy.config import ProxyConfig
from tests.conftest import unreachable_cluster

OPTIONS = {
    "--head-timeout-s": ("head_timeout_s", "2.5", 2.5),
    "--body-timeout-s": ("body_timeout_s", "3", 3.0),
    "--body-min-rate-bytes-s": ("body_min_rate_bytes_s", "1000", 1000.0),
    "--keepalive-timeout-s": ("keepalive_timeout_s", "7", 7.0),
    "--max-client-connections": ("max_client_connections", "16", 16),
    "--max-body-bytes": ("max_body_bytes", "1024", 1024),
    "--max-buffered-body-bytes": ("max_buffered_body_bytes", "4096", 4096),
}


def serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *argv: str) -> tuple[int, str, list[Any]]:
    cluster = tmp_path / "cluster.yaml"
    unreachable_cluster(1, 1).save(cluster)
    seen: list[Any] = []

    class FakeProxy:
        def __init__(self, cfg: ProxyConfig) -> None:
            seen.append(cfg)

        async def start(self, host: str, port: int) -> int:
            return port

        async def stop(self) -> None:
            pass

    monkeypatch.setattr("calroute.proxy.app.Proxy", FakeProxy)
    monkeypatch.setattr("calroute.aio.run_until_signalled", lambda *a, **kw: None)
    res = CliRunner().invoke(app, ["serve", "--cluster", str(cluster), *argv])
    return res.exit_code, res.stderr, seen


def test_each_limit_reaches_the_proxy_and_defaults_to_the_configs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = [x for option, (_, text, _) in OPTIONS.items() for x in (option, text)]
    code, stderr, [cfg] = serve(tmp_path, monkeypatch, *argv)
    assert code == 0, stderr
    assert {field: getattr(cfg, field) for field, _, _ in OPTIONS.values()} == {
        field: want for field, _, want in OPTIONS.values()
    }
    code, stderr, [cfg] = serve(tmp_path, monkeypatch)
    defaults = {f.name: f.default for f in dataclasses.fields(ProxyConfig)}
    assert code == 0 and all(getattr(cfg, field) == defaults[field] for field, _, _ in OPTIONS.values())


@pytest.mark.parametrize("option", list(OPTIONS))
def test_a_limit_of_zero_is_refused(option: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, stderr, seen = serve(tmp_path, monkeypatch, option, "0")
    assert code == 2 and option in stderr and not seen
