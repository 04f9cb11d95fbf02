"""The policy contract and the small helpers every policy shares.

A policy is a pure decision: ``route(admission, view) -> RouteDecision``. It reads no clock, file or
global RNG and keeps no state between calls; rotation and randomness derive from ``view.seq`` and the
policy's own ``seed`` parameter, so replaying the same (admission, view) pairs gives the same decisions
in the simulator and in the proxy.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import Any, ClassVar, Protocol, TypeVar, Union, get_args, get_origin, get_type_hints

from calroute.errors import ConfigError, NoCandidateError
from calroute.types import Admission, ClusterView, InstanceState, RouteDecision


class RoutingPolicy(Protocol):
    name: ClassVar[str]
    # Whether route() reads the engines' sampled metrics (kv_used_tokens, running, waiting,
    # metrics_age_s). The proxy scrapes every engine's /metrics only for a policy that does: a scrape
    # loads the engine (a real vLLM on shared CPU cores stalls under them, docs/proxy.md) and the proxy.
    reads_engine_samples: ClassVar[bool]

    def route(self, adm: Admission, view: ClusterView) -> RouteDecision: ...


def healthy(pool: tuple[InstanceState, ...], role: str) -> list[InstanceState]:
    """The routable members of a pool, in view order; NoCandidateError when there are none.

    Tuples, not Sequences, here and in argmin_rotating: the compiled build (setup.py) indexes a tuple
    directly and a Sequence through the object protocol.
    """
    out = [s for s in pool if s.healthy]
    if not out:
        raise NoCandidateError(f"no healthy {role} instance to route to")
    return out


def argmin_rotating(keys: tuple[float, ...], start: int) -> int:
    """Index of the smallest key; ties go to the first one found rotating from ``start``.

    Rotating the tie-break (rather than always taking index 0) spreads an idle cluster's requests.
    """
    n = len(keys)
    best = start % n
    best_key = keys[best]
    for k in range(1, n):
        i = (start + k) % n
        if keys[i] < best_key:
            best, best_key = i, keys[i]
    return best


P = TypeVar("P")


def parse_params(policy: str, params_cls: type[P], raw: Mapping[str, Any]) -> P:
    """Build a policy's typed Params from raw values (strings from the CLI, or JSON values).

    Unknown keys and values of the wrong type are ConfigErrors naming the policy and the field.
    """
    if not dataclasses.is_dataclass(params_cls):
        raise TypeError(f"{params_cls!r} is not a dataclass")
    hints = get_type_hints(params_cls)
    fields = {f.name for f in dataclasses.fields(params_cls)}
    unknown = sorted(set(raw) - fields)
    if unknown:
        known = ", ".join(sorted(fields)) or "(none)"
        raise ConfigError(f"policy {policy!r}: unknown parameter(s) {', '.join(unknown)}; known: {known}")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        values[key] = _coerce(policy, key, hints[key], value)
    try:
        return params_cls(**values)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"policy {policy!r}: {e}") from e


def _coerce(policy: str, key: str, hint: Any, value: Any) -> Any:
    target = hint
    if get_origin(hint) in (Union, types.UnionType):
        target = next(a for a in get_args(hint) if a is not type(None))
    try:
        if target is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
                return value.lower() in ("true", "1", "yes")
            raise ValueError(f"not a boolean: {value!r}")
        if target is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError(f"not an integer: {value!r}")
            return int(value)
        if target is float:
            if isinstance(value, bool):
                raise ValueError(f"not a number: {value!r}")
            return float(value)
        return target(value)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"policy {policy!r}: parameter {key!r}: {e}") from e


def check(cond: bool, message: str) -> None:
    """Parameter validation inside Params.__post_init__ (parse_params turns it into a ConfigError)."""
    if not cond:
        raise ValueError(message)
