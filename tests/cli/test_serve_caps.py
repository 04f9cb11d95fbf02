"""`calroute serve`'s caps on engine answers (docs/proxy.md): each option reaches the proxy's config, its
default is the config's own, and a value below 1 KiB is refused."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from typer.testing import CliRunner

from calroute.cli.app import app
from calroute.proxy.config import ProxyConfig

CAPS = {
    "--max-answer-bytes": "max_answer_bytes",
    "--max-event-bytes": "max_event_bytes",
    "--max-probe-bytes": "max_probe_bytes",
}


@pytest.mark.parametrize("option", CAPS)
@pytest.mark.parametrize(("value", "code"), [("2048", 0), (None, 0), ("100", 2)])
def test_serve_caps_reach_the_proxy_or_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, option: str, value: str | None, code: int
) -> None:
    from tests.conftest import unreachable_cluster

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
    argv = ["serve", "--cluster", str(cluster)] + ([] if value is None else [option, value])
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == code, res.stderr
    field = CAPS[option]
    if code != 0:
        assert seen == [] and option in res.stderr
        return
    (cfg,) = seen
    (default,) = (f.default for f in dataclasses.fields(ProxyConfig) if f.name == field)
    assert getattr(cfg, field) == (default if value is None else int(value))
