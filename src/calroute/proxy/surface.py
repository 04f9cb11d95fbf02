"""The proxy's read-only answers besides generation: ``/v1/models`` as vLLM lists its one model, and
``/health``, which is healthy while each pool has an engine in routing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from calroute.cluster.file import ClusterFile


def models(cluster: ClusterFile) -> dict[str, Any]:
    model = {
        "id": cluster.model,
        "object": "model",
        "owned_by": "vllm",
        "root": cluster.model,
        "max_model_len": cluster.max_model_len,
    }
    return {"object": "list", "data": [model]}


def health(cluster: ClusterFile, healthy: Mapping[str, bool]) -> tuple[dict[str, Any], int]:
    """The body and the HTTP status: 503 when either pool has no engine in routing."""
    pre = sum(healthy[e.id] for e in cluster.prefill)
    dec = sum(healthy[e.id] for e in cluster.decode)
    ok = pre > 0 and dec > 0
    body = {"status": "ok" if ok else "unavailable", "prefill_instances": pre, "decode_instances": dec}
    return body, 200 if ok else 503
