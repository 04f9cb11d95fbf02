"""The herd, and one mitigation: several routers pick the same best engine before their bookings reach
each other (issue 38). ``NearBest`` draws each pool's engine at random among the near-best of its inner
policy's candidates, so that routers seeing the same view spread instead of piling onto one engine.

``HerdCounter`` measures it: per admission, the earlier admissions within a window (one share delay) that
another router made, and how many of those picked the same decode engine (and the same prefill engine); the
same for the router's own earlier admissions, which its ledger did see, as the reference: a policy may put
consecutive requests on one engine by design (marginal_cost's decode price barely moves with one more
stream), and only picks that coincide more often across routers than within one are a herd.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar, cast

from calroute.errors import ConfigError
from calroute.policies.base import RoutingPolicy
from calroute.splitmix import hash64
from calroute.types import Admission, ClusterView, InstanceState, PicklesByConstructor, RouteDecision

# hash64 streams of the two pools' draws (the random policies use 1 and 2 for theirs)
_PREFILL_STREAM = 11
_DECODE_STREAM = 12


class NearBest:
    """The inner policy's pair, each engine drawn uniformly among the pool's near-best candidates.

    A candidate is near-best when its score, min-max normalised over the pool's healthy candidates, is at
    most ``tolerance`` (0: only ties with the best; 1: any engine). Normalised rather than relative to the
    best: marginal_cost's decode costs share a large term (the request's own decode seconds), so 10 % of the
    best would take in every engine, and kv_overlap_cost's best is often 0 tokens. The draw is
    ``hash64(seed, view.seq, pool)``: a pure function of the view, as the random policies' are, different
    for routers given different seeds. A decision without scores (round_robin), a local one, or one whose
    scores do not line up with the pool is returned as it is.

    Attributes the router reads off a policy (``reads_active_blocks``, ``prefix_source``,
    ``needs_true_state``, ``reads_engine_samples``) are the inner policy's.
    """

    name: ClassVar[str] = "near_best"

    def __init__(self, inner: RoutingPolicy, tolerance: float, seed: int) -> None:
        if not 0.0 <= tolerance <= 1.0:
            raise ConfigError(f"near-best tolerance must be in [0, 1], got {tolerance}")
        self.inner = inner
        self.tolerance = tolerance
        self.seed = seed
        attrs: Any = inner
        self.reads_engine_samples: bool = bool(attrs.reads_engine_samples)
        self.reads_active_blocks: bool = bool(getattr(attrs, "reads_active_blocks", False))
        self.prefix_source: str | None = getattr(attrs, "prefix_source", None)
        self.needs_true_state: bool = bool(getattr(attrs, "needs_true_state", False))

    def route(self, adm: Admission, view: ClusterView) -> RouteDecision:
        d = self.inner.route(adm, view)
        if d.local:
            return d
        prefill_id = self._draw(view.prefill, d.prefill_scores, d.prefill_id, view.seq, _PREFILL_STREAM)
        decode_id = self._draw(view.decode, d.decode_scores, d.decode_id, view.seq, _DECODE_STREAM)
        if prefill_id == d.prefill_id and decode_id == d.decode_id:
            return d
        return d.replace(prefill_id=prefill_id, decode_id=decode_id)

    def _draw(
        self, pool: tuple[InstanceState, ...], scores: tuple[float, ...], chosen: str, seq: int, stream: int
    ) -> str:
        members = [s for s in pool if s.healthy]
        if len(scores) != len(members) or len(members) < 2:
            return chosen
        low, high = min(scores), max(scores)
        bar = low + self.tolerance * (high - low)
        near = [s.instance_id for s, c in zip(members, scores, strict=True) if c <= bar]
        return near[hash64(self.seed, seq, stream) % len(near)]


def near_best(inner: RoutingPolicy, tolerance: float, seed: int) -> RoutingPolicy:
    """``inner`` wrapped in NearBest, typed as the router holds its policy (its ``reads_engine_samples`` is
    an instance attribute, the inner policy's, where the registry's policies have a class attribute)."""
    return cast(RoutingPolicy, NearBest(inner, tolerance, seed))


@dataclass(frozen=True)
class HerdStats(PicklesByConstructor):
    """Pairs of admissions less than ``window_s`` apart: made by two routers (``cross``) or by one
    (``own``), and how many of each picked the same decode engine, and the same prefill engine."""

    window_s: float
    cross_pairs: int = 0
    cross_same_decode: int = 0
    cross_same_prefill: int = 0
    own_pairs: int = 0
    own_same_decode: int = 0
    own_same_prefill: int = 0


class HerdCounter:
    """Counts HerdStats over a run's admissions, given in time order."""

    def __init__(self, window_s: float) -> None:
        if window_s <= 0:
            raise ConfigError(f"the herd window must be > 0 s, got {window_s}")
        self.window_s = window_s
        self._recent: deque[tuple[float, int, str, str]] = deque()  # (time, router, prefill, decode)
        self._counts = [0] * 6  # HerdStats' counts, in its order

    def admitted(self, now_s: float, router: int, prefill_id: str, decode_id: str) -> None:
        recent = self._recent
        while recent and recent[0][0] <= now_s - self.window_s:
            recent.popleft()
        counts = self._counts
        for _, other, prefill, decode in recent:
            k = 0 if other != router else 3
            counts[k] += 1
            if decode == decode_id:
                counts[k + 1] += 1
            if prefill == prefill_id:
                counts[k + 2] += 1
        recent.append((now_s, router, prefill_id, decode_id))

    def stats(self) -> HerdStats:
        return HerdStats(self.window_s, *self._counts)
