"""The NixlConnector handoff bodies: pure functions, table-driven."""

from __future__ import annotations

from typing import Any

import pytest

from calroute.contract import handoff


def test_prefill_body_is_the_nixl_handoff_request() -> None:
    client = {
        "model": "m",
        "prompt": "p",
        "max_tokens": 50,
        "min_tokens": 50,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "temperature": 0,
        "user": "u",
    }
    body = handoff.prefill_body(client)
    assert body["max_tokens"] == 1 and body["stream"] is False
    assert "stream_options" not in body and "min_tokens" not in body
    assert body["kv_transfer_params"] == {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    assert body["ignore_eos"] is True and body["user"] == "u"  # the client's other fields are preserved
    assert client["max_tokens"] == 50 and "kv_transfer_params" not in client  # not mutated


def test_prefill_caps_max_completion_tokens_only_when_sent() -> None:
    assert handoff.prefill_body({"messages": [], "max_completion_tokens": 9})["max_completion_tokens"] == 1
    assert "max_completion_tokens" not in handoff.prefill_body({"messages": []})


@pytest.mark.parametrize(
    ("client", "kv", "want_options"),
    [
        ({"prompt": "p", "stream": True}, {"x": 1}, {"include_usage": True}),
        (
            {"prompt": "p", "stream": True, "stream_options": {"continuous_usage_stats": True}},
            {"x": 1},
            {"continuous_usage_stats": True, "include_usage": True},
        ),
        ({"prompt": "p"}, {"x": 1}, None),
    ],
)
def test_decode_body(client: dict[str, Any], kv: dict[str, Any], want_options: dict[str, Any] | None) -> None:
    body = handoff.decode_body(client, kv)
    assert body["kv_transfer_params"] == kv
    assert body.get("stream_options") == want_options
    assert body["prompt"] == "p"


def test_decode_without_params_computes_locally() -> None:
    assert "kv_transfer_params" not in handoff.decode_body(
        {"prompt": "p", "kv_transfer_params": {"a": 1}}, None
    )
