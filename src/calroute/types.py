"""Core value types shared by the policies, the ledger, the simulator and (later) the proxy.

The types built once or more per routing decision (``Admission``, ``InstanceState``, ``ClusterView``,
``RouteDecision``; and ``RequestRecord``) are slotted classes with written ``__init__``s and
``Final`` fields: mypy rejects any assignment after construction (which keeps a policy from mutating what it
is shown), and the compiled build (setup.py) constructs them about ten times faster than a ``NamedTuple``,
whose ``__new__`` stays interpreted. ``SlottedValue`` gives them value semantics (equality, hashing, repr)
and ``replace``/``as_dict`` in place of ``_replace``/``_asdict``. The other types are ``NamedTuple``s.
"""

from __future__ import annotations

from dataclasses import fields
from enum import StrEnum
from typing import Any, ClassVar, Final, NamedTuple, Self, cast


class SloClass(StrEnum):
    """Latency class of a request; loose targets are a multiple of tight ones (see Calibration)."""

    TIGHT = "tight"
    LOOSE = "loose"


class Role(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"


# The unit of prompt reuse in workloads: Mooncake's trace names its prompts in blocks of 512 tokens, and
# the synthetic prefix families use the same. vLLM caches in smaller blocks (16 tokens), which divide 512.
PREFIX_BLOCK_TOKENS: Final = 512


class RequestSpec(NamedTuple):
    """One request of a workload. Carries the true output length: never hand it to a policy.

    ``prefix_blocks`` names the prompt's leading full blocks of PREFIX_BLOCK_TOKENS tokens. An id stands for
    its block *and everything before it* (Mooncake's ``hash_ids``), so two prompts share a prefix of k
    blocks exactly when their first k ids are equal. The tokens past the last named block are the prompt's
    own. Empty: the prompt shares nothing (the paper's families, traces without block ids).

    ``answer_blocks``: the ids of the blocks past ``prefix_blocks`` that the prompt and its answer fill
    whole, as a later prompt that repeats both names them (a conversation's next turn): what an engine that
    generated the answer holds in its cache (vLLM caches output blocks as it computes them). Empty: unknown,
    or nothing repeats them.
    """

    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    slo_class: SloClass
    prefix_blocks: tuple[int, ...] = ()
    answer_blocks: tuple[int, ...] = ()


def _by_fields(cls: type[Any], values: dict[str, Any]) -> Any:
    return cls(**values)


class PicklesByConstructor:
    """Pickling by the constructor, for frozen dataclasses. The compiled build (setup.py) makes them native
    classes, which pickle restores attribute by attribute through the frozen ``__setattr__``, and fails: a
    process pool (``calroute tune --workers 2``) sending a calibration to its workers did. The constructor
    checks the values again, as for any other caller."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _by_fields, (type(self), {f.name: getattr(self, f.name) for f in fields(cast(Any, self))})


class SlottedValue:
    """Value semantics for the slotted hot-path types, over the fields each lists in ``_fields``; they pickle
    by their constructor, as ``PicklesByConstructor`` says why."""

    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]]

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _by_fields, (type(self), self.as_dict())

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._fields}

    def replace(self, **changes: Any) -> Self:
        return type(self)(**{**self.as_dict(), **changes})

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self._fields)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.as_dict().items())})"


class Admission(SlottedValue):
    """What a router may know about a request when it admits it (never the true output length)."""

    _fields = ("request_id", "prompt_tokens", "predicted_output_tokens", "slo_class")
    __slots__ = _fields

    def __init__(
        self, request_id: str, prompt_tokens: int, predicted_output_tokens: int, slo_class: SloClass
    ) -> None:
        self.request_id: Final = request_id
        self.prompt_tokens: Final = prompt_tokens
        self.predicted_output_tokens: Final = predicted_output_tokens
        self.slo_class: Final = slo_class


class InstanceState(SlottedValue):
    """One engine as a policy sees it at decision time.

    ``in_flight``, ``backlog_s`` and ``kv_committed_tokens`` come from the in-flight ledger (the router's own
    bookkeeping, fresh). ``cached_tokens`` is about the request being routed: how many of its prompt tokens
    the router's prefix index expects this engine to hold already (0 without prefix information), and
    ``evicted_reuse_ratio`` the share of the blocks it evicted lately that a later request wanted back.
    ``kv_used_tokens``, ``running`` and ``waiting`` come from the engine's metrics, sampled periodically, so
    they may be up to one sampling period old (``metrics_age_s``).

    The engine's active sequences, from the ledger (as NVIDIA Dynamo's KV router tracks them): the requests
    admitted to a prefill engine whose prefill is not done, to a decode engine that are not done.
    ``pending_prefill_tokens``: their prompt tokens the prefill engine must still compute (less those the
    prefix index expected it to hold; on a decode engine, those of the requests it prefills itself, local
    ones, RouteDecision.local); ``active_tokens``: their prompt tokens, each
    sequence counted whole. Only for a policy that reads active blocks (``reads_active_blocks``, else 0):
    ``active_shared_tokens``, the tokens of the blocks two or more of them hold, counted past their first
    holder (``active_tokens - active_shared_tokens`` counts each block once), and ``active_overlap_tokens``,
    about the request being routed: the leading run of its blocks among those blocks, in tokens.
    """

    _fields = (
        "instance_id",
        "role",
        "healthy",
        "in_flight",
        "backlog_s",
        "kv_committed_tokens",
        "kv_used_tokens",
        "kv_capacity_tokens",
        "running",
        "waiting",
        "metrics_age_s",
        "cached_tokens",
        "evicted_reuse_ratio",
        "pending_prefill_tokens",
        "active_tokens",
        "active_shared_tokens",
        "active_overlap_tokens",
    )
    __slots__ = _fields

    def __init__(
        self,
        instance_id: str,
        role: Role,
        healthy: bool,
        in_flight: int,
        backlog_s: float,
        kv_committed_tokens: int,
        kv_used_tokens: int,
        kv_capacity_tokens: int,
        running: int,
        waiting: int,
        metrics_age_s: float,
        cached_tokens: int = 0,
        evicted_reuse_ratio: float = 0.0,
        pending_prefill_tokens: int = 0,
        active_tokens: int = 0,
        active_shared_tokens: int = 0,
        active_overlap_tokens: int = 0,
    ) -> None:
        self.instance_id: Final = instance_id
        self.role: Final = role
        self.healthy: Final = healthy
        self.in_flight: Final = in_flight
        self.backlog_s: Final = backlog_s
        self.kv_committed_tokens: Final = kv_committed_tokens
        self.kv_used_tokens: Final = kv_used_tokens
        self.kv_capacity_tokens: Final = kv_capacity_tokens
        self.running: Final = running
        self.waiting: Final = waiting
        self.metrics_age_s: Final = metrics_age_s
        self.cached_tokens: Final = cached_tokens
        self.evicted_reuse_ratio: Final = evicted_reuse_ratio
        self.pending_prefill_tokens: Final = pending_prefill_tokens
        self.active_tokens: Final = active_tokens
        self.active_shared_tokens: Final = active_shared_tokens
        self.active_overlap_tokens: Final = active_overlap_tokens


class ClusterView(SlottedValue):
    """Both pools at one decision. ``seq`` counts decisions made before this one (0-based).

    Stateless policies derive rotation and randomness from ``seq``, so a decision is a pure function of
    (Admission, ClusterView): the simulator and the proxy replaying the same views decide identically.
    """

    _fields = ("now_s", "seq", "prefill", "decode")
    __slots__ = _fields

    def __init__(
        self, now_s: float, seq: int, prefill: tuple[InstanceState, ...], decode: tuple[InstanceState, ...]
    ) -> None:
        self.now_s: Final = now_s
        self.seq: Final = seq
        self.prefill: Final = prefill
        self.decode: Final = decode


class RouteDecision(SlottedValue):
    """The chosen pair, and the per-candidate scores behind it when the policy has any (lower is better).

    ``local``: the decode engine prefills the prompt itself, in its own steps and on its own prefix cache (no
    prefill engine, no KV transfer; vLLM serves a request without ``kv_transfer_params`` so); ``prefill_id``
    is then the decode engine's id, so that whoever reads "the engine that prefilled" finds it. ``reason``:
    why the path was taken, a short code the policy or decider names (empty: the policy always
    disaggregates, nothing was decided).
    """

    _fields = ("prefill_id", "decode_id", "prefill_scores", "decode_scores", "local", "reason")
    __slots__ = _fields

    def __init__(
        self,
        prefill_id: str,
        decode_id: str,
        prefill_scores: tuple[float, ...] = (),
        decode_scores: tuple[float, ...] = (),
        local: bool = False,
        reason: str = "",
    ) -> None:
        if local and prefill_id != decode_id:
            raise ValueError(f"a local decision prefills on its decode engine: {prefill_id} != {decode_id}")
        self.prefill_id: Final = prefill_id
        self.decode_id: Final = decode_id
        self.prefill_scores: Final = prefill_scores
        self.decode_scores: Final = decode_scores
        self.local: Final = local
        self.reason: Final = reason


def local_decision(decode_id: str, reason: str, decode_scores: tuple[float, ...] = ()) -> RouteDecision:
    """The decode engine ``decode_id`` alone: it prefills the prompt itself (RouteDecision.local)."""
    return RouteDecision(decode_id, decode_id, (), decode_scores, True, reason)


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
