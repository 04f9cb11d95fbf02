"""The measurement client's readers that need no engine: KV bytes from vLLM's metrics, tokens per event."""

from __future__ import annotations

import pytest

from calroute.calibrate.client import RequestFailed, _event_tokens, kv_bytes_from_metrics


def test_kv_bytes_from_vllm_metrics() -> None:
    line = (
        'vllm:cache_config_info{block_size="128",cache_dtype="auto",engine="0",'
        'kv_cache_memory_bytes="67108864",num_gpu_blocks="512",num_cpu_blocks="None"} 1.0'
    )
    assert kv_bytes_from_metrics("# HELP x\n" + line + "\n") == 1024
    assert kv_bytes_from_metrics(line.replace('"67108864"', '"None"')) is None
    assert kv_bytes_from_metrics("vllm:num_requests_running 0\n") is None


@pytest.mark.parametrize(
    ("event", "tokens"),
    [
        (b'data: {"choices": [{"text": "ab", "token_ids": [5, 6]}]}', 2),
        (b'data: {"choices": [{"text": "", "token_ids": []}]}', 0),
        (b'data: {"choices": [], "usage": {"completion_tokens": 3}}', 0),  # the usage-only event
        (b"data: [DONE]", 0),
        (b': keep-alive\ndata: {"choices": [{"token_ids": [1]}]}', 1),
        (b"", 0),
    ],
)
def test_event_tokens(event: bytes, tokens: int) -> None:
    assert _event_tokens(event, "http://e") == tokens


@pytest.mark.parametrize(
    ("event", "says"),
    [
        (b"data: {not json", "not JSON"),
        (b"data: [1, 2]", "not a JSON object"),
        (b'data: {"error": {"message": "boom"}}', "boom"),
        (b'data: {"choices": [{"text": "a"}]}', "ignores return_token_ids"),
    ],
)
def test_event_tokens_refuses(event: bytes, says: str) -> None:
    with pytest.raises(RequestFailed, match=says):
        _event_tokens(event, "http://e")
