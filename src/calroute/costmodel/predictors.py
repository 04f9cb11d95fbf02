"""Output-length predictors: what the router believes about a request's output before it runs.

Every predictor answers ``predict(prompt_tokens)`` and may learn from ``observe(prompt, output)`` after a
request completes. The oracle needs the true length (``oracle_output_tokens``): the simulator has it, and a
proxy gets it only from a study's load generator, in a header (proxy/oracle.py). It refuses to run
without it, so it cannot silently stand in for a prediction.
"""

from __future__ import annotations

import random
from bisect import bisect_left
from dataclasses import dataclass
from typing import Final, Protocol

from calroute.errors import ConfigError

_COMPILED: Final = not __file__.endswith(".py")  # this module, built by setup.py


class OutputLengthPredictor(Protocol):
    name: str

    def predict(self, prompt_tokens: int, oracle_output_tokens: int | None = None) -> int: ...

    def observe(self, prompt_tokens: int, output_tokens: int) -> None: ...


@dataclass
class OraclePredictor:
    """The true length, for controlled studies: it has no answer without the oracle value."""

    name: str = "oracle"

    def predict(self, prompt_tokens: int, oracle_output_tokens: int | None = None) -> int:
        if oracle_output_tokens is None:
            raise ConfigError(
                "the oracle predictor needs the true output length (from the simulator, or a study's header)"
            )
        return oracle_output_tokens

    def observe(self, prompt_tokens: int, output_tokens: int) -> None:
        pass


@dataclass
class ConstantPredictor:
    tokens: int = 256
    name: str = "constant"

    def __post_init__(self) -> None:
        if self.tokens < 1:
            raise ConfigError(f"constant predictor: tokens must be >= 1, got {self.tokens}")

    def predict(self, prompt_tokens: int, oracle_output_tokens: int | None = None) -> int:
        return self.tokens

    def observe(self, prompt_tokens: int, output_tokens: int) -> None:
        pass


def _bisect_left(ordered: list[int], value: int) -> int:
    """bisect.bisect_left. Compiled (setup.py), the written loop compares ints natively and is twice as
    fast as the C bisect, which compares through the object protocol; interpreted, the C bisect is."""
    if not _COMPILED:
        return bisect_left(ordered, value)
    return _bisect_left_written(ordered, value)


def _bisect_left_written(ordered: list[int], value: int) -> int:
    lo, hi = 0, len(ordered)
    while lo < hi:
        mid = (lo + hi) // 2
        if ordered[mid] < value:
            lo = mid + 1
        else:
            hi = mid
    return lo


class _SortedWindow:
    """The last ``size`` values, in arrival order (a ring) and sorted (O(size) memmove per update)."""

    def __init__(self, size: int) -> None:
        self._ring: list[int] = []  # arrival order; once full, _next is the oldest
        self._next = 0
        self._sorted: list[int] = []
        self._size = size

    def __len__(self) -> int:
        return len(self._ring)

    def add(self, value: int) -> None:
        ring = self._ring
        ordered = self._sorted
        if len(ring) < self._size:
            ring.append(value)
        else:
            i = self._next
            old = ring[i]
            ring[i] = value
            self._next = i + 1 if i + 1 < self._size else 0
            if old == value:
                return  # the sorted list is unchanged
            del ordered[_bisect_left(ordered, old)]
        ordered.insert(_bisect_left(ordered, value), value)

    def quantile(self, q: float) -> int:
        n = len(self._sorted)
        i = int(q * n)  # a comparison, not min(): a generic call in the compiled build
        return self._sorted[i if i < n - 1 else n - 1]


class BucketQuantilePredictor:
    """A quantile of recently observed outputs among requests with a similar prompt length.

    Prompts fall in power-of-two buckets of their length; each bucket keeps the last ``window`` outputs.
    A bucket with fewer than ``min_samples`` falls back to all buckets pooled, then to ``default_tokens``.
    Memory is bounded by buckets x window.
    """

    name = "bucket"

    def __init__(
        self, quantile: float = 0.5, window: int = 256, min_samples: int = 8, default_tokens: int = 256
    ) -> None:
        if not 0.0 <= quantile <= 1.0:
            raise ConfigError(f"bucket predictor: quantile must be in [0, 1], got {quantile}")
        if window < 1 or min_samples < 1 or default_tokens < 1:
            raise ConfigError("bucket predictor: window, min_samples and default_tokens must be >= 1")
        self.quantile = quantile
        self.window = window
        self.min_samples = min_samples
        self.default_tokens = default_tokens
        self._buckets: dict[int, _SortedWindow] = {}
        self._all = _SortedWindow(window)

    @staticmethod
    def bucket_of(prompt_tokens: int) -> int:
        return prompt_tokens.bit_length() if prompt_tokens > 1 else 1

    def predict(self, prompt_tokens: int, oracle_output_tokens: int | None = None) -> int:
        values = self._buckets.get(self.bucket_of(prompt_tokens))
        if values is not None and len(values) >= self.min_samples:
            return values.quantile(self.quantile)
        if len(self._all) >= self.min_samples:
            return self._all.quantile(self.quantile)
        return self.default_tokens

    def observe(self, prompt_tokens: int, output_tokens: int) -> None:
        b = self.bucket_of(prompt_tokens)
        values = self._buckets.get(b)
        if values is None:
            values = self._buckets[b] = _SortedWindow(self.window)
        values.add(output_tokens)
        self._all.add(output_tokens)


class NoisyPredictor:
    """Wraps a predictor and multiplies its answer by (1 + e), e uniform in [-rel_error, +rel_error].

    The result is at least one token. Draws come from one RNG seeded once, in call order, so a
    deterministic caller (the simulator) gets deterministic predictions.
    """

    def __init__(self, inner: OutputLengthPredictor, rel_error: float, seed: int) -> None:
        if rel_error < 0:
            raise ConfigError(f"predictor noise must be >= 0, got {rel_error}")
        self.inner = inner
        self.rel_error = rel_error
        self.name = f"noisy({inner.name},{rel_error:g})"
        self._rng = random.Random(seed)

    def predict(self, prompt_tokens: int, oracle_output_tokens: int | None = None) -> int:
        base = self.inner.predict(prompt_tokens, oracle_output_tokens)
        e = self._rng.uniform(-self.rel_error, self.rel_error)
        return max(1, round(base * (1.0 + e)))

    def observe(self, prompt_tokens: int, output_tokens: int) -> None:
        self.inner.observe(prompt_tokens, output_tokens)


PREDICTOR_NAMES = ("oracle", "constant", "bucket")


def make_predictor(name: str, *, noise: float = 0.0, seed: int = 0) -> OutputLengthPredictor:
    """Build a predictor by name, wrapped in noise when ``noise`` > 0."""
    inner: OutputLengthPredictor
    if name == "oracle":
        inner = OraclePredictor()
    elif name == "constant":
        inner = ConstantPredictor()
    elif name == "bucket":
        inner = BucketQuantilePredictor()
    else:
        raise ConfigError(f"unknown predictor {name!r}; known: {', '.join(PREDICTOR_NAMES)}")
    if noise < 0:
        raise ConfigError(f"predictor noise must be >= 0, got {noise}")
    return NoisyPredictor(inner, noise, seed) if noise > 0 else inner
