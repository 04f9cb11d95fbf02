"""Core value types shared by the policies, the ledger, the simulator and (later) the proxy.

Hot-path types (built once per routing decision) are ``NamedTuple``s: immutable like frozen dataclasses
but about five times cheaper to construct (0.27 us against 1.3 us for nine fields, measured on CPython
3.11), which matters for a simulator that makes tens of thousands of decisions per second.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple


class SloClass(StrEnum):
    """Latency class of a request; loose targets are a multiple of tight ones (see Calibration)."""

    TIGHT = "tight"
    LOOSE = "loose"


class Role(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"


class RequestSpec(NamedTuple):
    """One request of a workload. Carries the true output length: never hand it to a policy."""

    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    slo_class: SloClass


class Admission(NamedTuple):
    """What a router may know about a request when it admits it (never the true output length)."""

    request_id: str
    prompt_tokens: int
    predicted_output_tokens: int
    slo_class: SloClass


class InstanceState(NamedTuple):
    """One engine as a policy sees it at decision time.

    ``in_flight``, ``backlog_s`` and ``kv_committed_tokens`` come from the in-flight ledger (the router's own
    bookkeeping, fresh). ``kv_used_tokens``, ``running`` and ``waiting`` come from the engine's metrics,
    sampled periodically, so they may be up to one sampling period old (``metrics_age_s``).
    """

    instance_id: str
    role: Role
    healthy: bool
    in_flight: int
    backlog_s: float
    kv_committed_tokens: int
    kv_used_tokens: int
    kv_capacity_tokens: int
    running: int
    waiting: int
    metrics_age_s: float


class ClusterView(NamedTuple):
    """Both pools at one decision. ``seq`` counts decisions made before this one (0-based).

    Stateless policies derive rotation and randomness from ``seq``, so a decision is a pure function of
    (Admission, ClusterView): the simulator and the proxy replaying the same views decide identically.
    """

    now_s: float
    seq: int
    prefill: tuple[InstanceState, ...]
    decode: tuple[InstanceState, ...]


class RouteDecision(NamedTuple):
    """The chosen pair, and the per-candidate scores behind it when the policy has any (lower is better)."""

    prefill_id: str
    decode_id: str
    prefill_scores: tuple[float, ...] = ()
    decode_scores: tuple[float, ...] = ()


class RequestStatus(StrEnum):
    """Terminal status of a request: every admitted request ends in exactly one record with one of these."""

    OK = "ok"
    REJECTED = "rejected"  # invalid or can never fit (e.g. longer than the model's context)
    FAILED = "failed"  # an engine or transfer failed and no retry succeeded
    CANCELLED = "cancelled"  # the client went away


class InstanceSpec(NamedTuple):
    """A member of the cluster as configured: what the router knows before any traffic."""

    instance_id: str
    role: Role
    kv_capacity_tokens: int
