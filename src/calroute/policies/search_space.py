"""Search-space declarations: the range a tuner may search for a policy's numeric parameter, declared next
to its default in the policy's Params dataclass.

    w_b: float = field(default=1.0, metadata=tunable(0.0, 4.0))

A declaration is only the search's range: the policy's own ``__post_init__`` checks stay what a value must
satisfy to be used at all (a params file or ``--param`` may set a weight beyond the searched range). Ranges
are log-scaled where the parameter acts by orders of magnitude (a tie-breaker, a token threshold).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, get_type_hints

from calroute.errors import ConfigError

_KEY = "calroute.tune"


@dataclass(frozen=True)
class Range:
    """``low <= value <= high``; ``integer`` for an int parameter; ``log`` samples log-uniformly (then
    ``low`` must be > 0)."""

    low: float
    high: float
    log: bool = False
    integer: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.low) and math.isfinite(self.high)) or not self.low < self.high:
            raise ValueError(f"a search range needs finite low < high, got [{self.low}, {self.high}]")
        if self.log and self.low <= 0:
            raise ValueError(f"a log-scaled search range needs low > 0, got {self.low}")
        if self.integer and not (float(self.low).is_integer() and float(self.high).is_integer()):
            raise ValueError(f"an integer search range needs integer bounds, got [{self.low}, {self.high}]")

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def tunable(low: float, high: float, *, log: bool = False) -> Mapping[str, Range]:
    """The field metadata declaring a float parameter's search range."""
    return {_KEY: Range(low, high, log)}


def tunable_int(low: int, high: int, *, log: bool = False) -> Mapping[str, Range]:
    """The field metadata declaring an int parameter's search range."""
    return {_KEY: Range(low, high, log, integer=True)}


def declared_space(params_cls: type[Any]) -> dict[str, Range]:
    """Every declared range of a Params dataclass, in field order. A declaration whose kind does not match
    the field's type (an int range on a float, a range on a bool) is a TypeError: a programming error."""
    if not dataclasses.is_dataclass(params_cls):
        raise TypeError(f"{params_cls!r} is not a dataclass")
    hints = get_type_hints(params_cls)
    out: dict[str, Range] = {}
    for f in dataclasses.fields(params_cls):
        r = f.metadata.get(_KEY)
        if r is None:
            continue
        want = int if r.integer else float
        if hints[f.name] is not want:
            raise TypeError(f"{params_cls.__qualname__}.{f.name}: a {want.__name__} range on {hints[f.name]}")
        out[f.name] = r
    return out


def select(space: Mapping[str, Range], names: list[str] | None, policy: str) -> dict[str, Range]:
    """The ranges of ``names`` (all of them for None), in declaration order; a name without a declared range
    is a ConfigError naming it and the ones there are."""
    if not space:
        raise ConfigError(f"policy {policy!r} declares no tunable parameters")
    if names is None:
        return dict(space)
    unknown = [n for n in names if n not in space]
    if unknown:
        raise ConfigError(
            f"policy {policy!r}: no search range for {', '.join(unknown)}; tunable: {', '.join(space)}"
        )
    if not names:
        raise ConfigError(f"policy {policy!r}: no parameter to search; tunable: {', '.join(space)}")
    return {n: r for n, r in space.items() if n in names}
