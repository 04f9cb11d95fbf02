"""`calroute serve`'s options reach the proxy's config, each defaults to the config's own default, and a value
no proxy could run with is refused by the option's name (docs/proxy.md). One table for every option that
maps to one ProxyConfig field."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from calroute.cli.app import app
from calroute.proxy.config import ProxyConfig
from tests.conftest import unreachable_cluster

# option: (ProxyConfig field, a value to give, what the field then holds, a value refused)
OPTIONS: dict[str, tuple[str, str, Any, str]] = {
    "--poll-interval": ("poll_interval_s", "0.5", 0.5, "0"),
    "--stall-timeout": ("stall_timeout_s", "10", 10.0, "-1"),
    "--max-answer-bytes": ("max_answer_bytes", "2048", 2048, "100"),
    "--max-event-bytes": ("max_event_bytes", "2048", 2048, "100"),
    "--max-probe-bytes": ("max_probe_bytes", "2048", 2048, "100"),
    "--head-timeout-s": ("head_timeout_s", "2.5", 2.5, "0"),
    "--body-timeout-s": ("body_timeout_s", "3", 3.0, "0"),
    "--body-min-rate-bytes-s": ("body_min_rate_bytes_s", "1000", 1000.0, "0"),
    "--keepalive-timeout-s": ("keepalive_timeout_s", "7", 7.0, "0"),
    "--max-client-connections": ("max_client_connections", "16", 16, "0"),
    "--max-body-bytes": ("max_body_bytes", "1024", 1024, "0"),
    "--max-buffered-body-bytes": ("max_buffered_body_bytes", "4096", 4096, "0"),
}
DEFAULTS = {f.name: f.default for f in dataclasses.fields(ProxyConfig)}


def serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *argv: str) -> tuple[int, str, list[ProxyConfig]]:
    """Run `calroute serve` up to the point where it would listen: the config it built, if any."""
    cluster = tmp_path / "cluster.yaml"
    unreachable_cluster(1, 1).save(cluster)
    seen: list[ProxyConfig] = []

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


@pytest.mark.parametrize("option", list(OPTIONS))
def test_the_option_reaches_the_proxy(option: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    field, text, want, _ = OPTIONS[option]
    code, stderr, [cfg] = serve(tmp_path, monkeypatch, option, text)
    assert code == 0, stderr
    assert getattr(cfg, field) == want


def test_without_the_options_every_field_is_the_configs_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, stderr, [cfg] = serve(tmp_path, monkeypatch)
    assert code == 0, stderr
    assert {f: getattr(cfg, f) for f, _, _, _ in OPTIONS.values()} == {
        f: DEFAULTS[f] for f, _, _, _ in OPTIONS.values()
    }


@pytest.mark.parametrize("option", list(OPTIONS))
def test_a_value_no_proxy_runs_with_is_refused_by_name(
    option: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, stderr, seen = serve(tmp_path, monkeypatch, option, OPTIONS[option][3])
    assert code == 2 and option in stderr and not seen


def test_prefix_index_is_a_switch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, stderr, [cfg] = serve(tmp_path, monkeypatch, "--prefix-index")
    assert code == 0, stderr
    assert cfg.prefix_index and not DEFAULTS["prefix_index"]
