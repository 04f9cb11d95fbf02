"""The two request bodies of vLLM's NixlConnector handoff, as pure functions of the client's body.

Prefill: a copy with ``max_tokens=1`` (``max_completion_tokens=1`` when the client sent it), no streaming,
no ``stream_options``, no ``min_tokens`` (vLLM rejects min_tokens > max_tokens), and
``kv_transfer_params.do_remote_decode`` so the engine holds the KV. Decode: the client's body, unchanged but
for the prefill engine's ``kv_transfer_params`` (forwarded verbatim, never reused) and, when streaming,
``stream_options.include_usage`` (the proxy needs the token count; it strips the usage chunk again if the
client did not ask for it). Release: the decode leg of a client that left, one token long.
"""

from __future__ import annotations

from typing import Any

PREFILL_KV_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def prefill_body(client: dict[str, Any]) -> dict[str, Any]:
    body = dict(client)
    body["kv_transfer_params"] = dict(PREFILL_KV_PARAMS)
    body["stream"] = False
    body["max_tokens"] = 1
    if "max_completion_tokens" in body:
        body["max_completion_tokens"] = 1
    for key in ("stream_options", "min_tokens", "min_completion_tokens"):
        body.pop(key, None)
    return body


def decode_body(client: dict[str, Any], kv_transfer_params: dict[str, Any] | None) -> dict[str, Any]:
    body = dict(client)
    if kv_transfer_params:
        body["kv_transfer_params"] = kv_transfer_params
    else:
        body.pop("kv_transfer_params", None)  # no handoff: the decode engine computes the prompt itself
    if body.get("stream"):
        body["stream_options"] = {**(client.get("stream_options") or {}), "include_usage": True}
    return body


def release_body(client: dict[str, Any], kv_transfer_params: dict[str, Any]) -> dict[str, Any]:
    """The decode leg of a client that left before its decode engine took it: one token, not streamed, so
    that the decode engine pulls the prompt's KV (which frees it on the prefill engine) and ends at once.
    Without it, vLLM's prefill engine keeps the blocks until its lease expires (``kv_lease_duration``, 30 s
    by default, in vLLM 0.32's nixl/base_scheduler.py); docs/proxy.md, "A client that leaves"."""
    body = prefill_body(client)
    body["kv_transfer_params"] = kv_transfer_params
    return body


def client_wants_usage(client: dict[str, Any]) -> bool:
    options = client.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage", True))
