"""`calroute serve`'s options reach the proxy's config, each defaults to the config's own default (written
once, in proxy/config.py), and a value no proxy could run with is refused by the option's name
(docs/proxy.md). One table for every option that maps to a config field."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from calroute.cli.app import app
from calroute.costmodel.profiles import DEFAULT_PROFILE, get_profile
from calroute.proxy.config import ProxyConfig
from calroute.types import SloClass
from tests.conftest import unreachable_cluster

# option: (its config field, a dotted path for the limits nested in the config; a value to give, None for a
# switch; what the field then holds; a value refused, None where the CLI does not check it)
OPTIONS: dict[str, tuple[str, str | None, Any, str | None]] = {
    "--policy": ("policy", "round_robin", "round_robin", None),
    "--predictor": ("predictor", "constant", "constant", None),
    "--predictor-noise": ("predictor_noise", "0.2", 0.2, "-1"),
    "--predictor-seed": ("predictor_seed", "7", 7, "x"),
    "--default-slo": ("default_slo", "tight", SloClass.TIGHT, "medium"),
    "--log": ("log_path", "requests.jsonl", Path("requests.jsonl"), None),
    "--decision-log": ("decision_log_path", "decisions.jsonl", Path("decisions.jsonl"), None),
    "--max-attempts": ("max_attempts", "5", 5, "0"),
    "--online-calibration": ("online_calibration", None, True, None),
    "--prefix-index": ("prefix_index", None, True, None),
    "--poll-interval": ("poll_interval_s", "0.5", 0.5, "0"),
    "--stall-timeout": ("stall_timeout_s", "10", 10.0, "-1"),
    "--max-answer-bytes": ("answer_limits.max_answer_bytes", "2048", 2048, "100"),
    "--max-event-bytes": ("answer_limits.max_event_bytes", "2048", 2048, "100"),
    "--max-probe-bytes": ("answer_limits.max_probe_bytes", "2048", 2048, "100"),
    "--head-timeout-s": ("client_limits.head_timeout_s", "2.5", 2.5, "0"),
    "--body-timeout-s": ("client_limits.body_timeout_s", "3", 3.0, "0"),
    "--body-min-rate-bytes-s": ("client_limits.body_min_rate_bytes_s", "1000", 1000.0, "0"),
    "--keepalive-timeout-s": ("client_limits.keepalive_timeout_s", "7", 7.0, "0"),
    "--max-client-connections": ("client_limits.max_client_connections", "16", 16, "0"),
    "--max-body-bytes": ("client_limits.max_body_bytes", "1024", 1024, "0"),
    "--max-buffered-body-bytes": ("client_limits.max_buffered_body_bytes", "4096", 4096, "0"),
}
# The options that are no config field's: read into one (the cluster file, the calibration, the policy's
# parameters) or the listener's.
NOT_FIELDS = {"--cluster", "--calibration", "--param", "--params", "--slo", "--host", "--port"}
DEFAULTS = ProxyConfig(
    cluster=unreachable_cluster(1, 1), calibration=get_profile(DEFAULT_PROFILE).calibration
)


def value_at(cfg: ProxyConfig, path: str) -> Any:
    return functools.reduce(getattr, path.split("."), cfg)


def serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *argv: str) -> tuple[int, str, list[ProxyConfig]]:
    """Run `calroute serve` up to the point where it would listen: the config it built, if any."""
    cluster = tmp_path / "cluster.yaml"
    unreachable_cluster(1, 1).save(cluster)
    seen: list[ProxyConfig] = []

    class FakeProxy:
        def __init__(self, cfg: ProxyConfig, **_: object) -> None:
            seen.append(cfg)

        async def start(self, host: str, port: int) -> int:
            return port

        async def stop(self) -> None:
            pass

    monkeypatch.setattr("calroute.proxy.app.Proxy", FakeProxy)
    monkeypatch.setattr("calroute.aio.run_until_signalled", lambda *a, **kw: None)
    for name in ("CALROUTE_ADMIN_TOKEN", "CALROUTE_ENGINE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    res = CliRunner().invoke(app, ["serve", "--cluster", str(cluster), *argv])
    return res.exit_code, res.stderr, seen


def serve_params() -> dict[str, Any]:
    """The serve command's options by flag, as --help shows them."""
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    return {p.opts[0]: p for p in group.commands["serve"].params}


def test_the_table_holds_every_option_of_a_config_field() -> None:
    assert set(serve_params()) == set(OPTIONS) | NOT_FIELDS


@pytest.mark.parametrize("option", list(OPTIONS))
def test_the_options_default_is_its_fields(option: str) -> None:
    assert serve_params()[option].default == value_at(DEFAULTS, OPTIONS[option][0])


def test_without_options_the_config_is_the_configs_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, stderr, [cfg] = serve(tmp_path, monkeypatch)
    assert code == 0, stderr
    assert cfg == ProxyConfig(cluster=cfg.cluster, calibration=cfg.calibration)


@pytest.mark.parametrize("option", list(OPTIONS))
def test_the_option_reaches_the_proxy(option: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, text, want, _ = OPTIONS[option]
    assert value_at(DEFAULTS, path) != want  # the option, not the default, put it there
    code, stderr, [cfg] = serve(tmp_path, monkeypatch, option, *([text] if text is not None else []))
    assert code == 0, stderr
    assert value_at(cfg, path) == want


@pytest.mark.parametrize("option", [o for o, (_, _, _, refused) in OPTIONS.items() if refused is not None])
def test_a_value_no_proxy_runs_with_is_refused_by_name(
    option: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, stderr, seen = serve(tmp_path, monkeypatch, option, str(OPTIONS[option][3]))
    assert code == 2 and option in stderr and not seen
