"""ProxyConfig and the limits nested in it refuse settings the proxy could not run with, naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from calroute.errors import ConfigError
from calroute.proxy.config import AnswerLimits, ClientLimits, ProxyConfig
from tests.conftest import unreachable_cluster
from tests.proxy.conftest import CAL


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("poll_interval_s", 0.0),
        ("poll_interval_s", -0.05),
        ("max_attempts", 0),
        ("predictor_noise", -0.1),
        ("engine_api_key", "key\r\nX-Injected: 1"),  # it would add a header to every engine request
        ("engine_api_key", "key\x00"),
    ],
)
def test_bad_settings_are_refused_by_name(field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=field):
        ProxyConfig(cluster=unreachable_cluster(1, 1), calibration=CAL, **{field: value})


@pytest.mark.parametrize(
    ("limits", "field", "value"),
    [
        (AnswerLimits, "max_answer_bytes", 1023),
        (AnswerLimits, "max_event_bytes", 0),
        (AnswerLimits, "max_probe_bytes", -1),
        (ClientLimits, "head_timeout_s", 0.0),
        (ClientLimits, "body_timeout_s", -1.0),
        (ClientLimits, "body_min_rate_bytes_s", 0.0),
        (ClientLimits, "keepalive_timeout_s", 0.0),
        (ClientLimits, "max_client_connections", 0),
        (ClientLimits, "max_body_bytes", 0),
        (ClientLimits, "max_buffered_body_bytes", 0),
    ],
)
def test_bad_limits_are_refused_by_name(
    limits: type[AnswerLimits | ClientLimits], field: str, value: Any
) -> None:
    with pytest.raises(ConfigError, match=field):
        limits(**{field: value})


def test_defaults_are_accepted() -> None:
    cfg = ProxyConfig(cluster=unreachable_cluster(1, 1), calibration=CAL)
    assert cfg.poll_interval_s == 0.05 and cfg.max_attempts == 3
    assert cfg.client_limits == ClientLimits() and cfg.answer_limits == AnswerLimits()
