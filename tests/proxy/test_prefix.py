"""The proxy's prefix helpers: what a prefill engine says it served from cache."""

from __future__ import annotations

from typing import Any

import pytest

from calroute.proxy.prefix import cached_tokens


@pytest.mark.parametrize(
    ("answer", "kv", "cached"),
    [
        ({"usage": {"prompt_tokens_details": {"cached_tokens": 640}}}, None, 640),  # vLLM's
        ({"usage": {"prompt_tokens_details": None}}, {"remote_prefill_cached_tokens": 32}, 32),  # emulator's
        (
            {"usage": {"prompt_tokens_details": {"cached_tokens": 16}}},
            {"remote_prefill_cached_tokens": 32},
            16,
        ),
        ({"usage": {}}, None, 0),
        ({"usage": {"prompt_tokens_details": {"cached_tokens": -5}}}, None, 0),
        ({"usage": {"prompt_tokens_details": {"cached_tokens": True}}}, None, 0),
        ({"usage": {"prompt_tokens_details": {"cached_tokens": "640"}}}, None, 0),
        ({"usage": {"prompt_tokens_details": [1]}}, {"remote_prefill_cached_tokens": 1.5}, 0),
    ],
)
def test_the_prefill_engines_cached_tokens_are_read_from_what_it_reports(
    answer: dict[str, Any], kv: Any, cached: int
) -> None:
    assert cached_tokens(answer, kv) == cached
