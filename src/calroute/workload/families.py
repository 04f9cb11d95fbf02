"""The paper's four synthetic workload families, generated reproducibly from one integer seed.

Lengths are lognormal (given median and log-sigma), rounded to whole tokens and clipped to [min, max]:

* chat (short in, short out): prompt LengthDist(256, 0.8, 16, 2048), output LengthDist(128, 0.7, 8, 512);
  Poisson arrivals.
* document (long in, up to 4k, short out): prompt LengthDist(2048, 0.4, 512, 4096), output
  LengthDist(96, 0.6, 16, 384); Poisson arrivals.
* reasoning (short in, long out): prompt LengthDist(192, 0.6, 32, 1024), output
  LengthDist(1024, 0.6, 256, 4096); Poisson arrivals.
* mixed-bursty: each request independently chat (50 %), document (25 %) or reasoning (25 %), with that
  family's lengths; arrivals from ``bursty_arrivals`` with its defaults (4x bursts, 20 % of the time, 5 s
  on average).

Each request is TIGHT with probability ``tight_fraction``, else LOOSE. Arrivals, prompt lengths, output
lengths, SLO classes and the mixed family choice each draw from their own stream ``[seed, STREAM]``, so
changing one of them (say the SLO mix) leaves the others unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from calroute.errors import ConfigError
from calroute.types import RequestSpec, SloClass
from calroute.workload.arrivals import bursty_arrivals, poisson_arrivals

FAMILIES = ("chat", "document", "reasoning", "mixed-bursty")

# The base families a mixed-bursty request picks from, and how often.
MIXED_COMPONENTS = ("chat", "document", "reasoning")
MIXED_WEIGHTS = (0.5, 0.25, 0.25)

_ARRIVAL_STREAM = 1
_PROMPT_STREAM = 2
_OUTPUT_STREAM = 3
_SLO_STREAM = 4
_FAMILY_STREAM = 5

# Fixed, so the mean-token estimate is a constant of the family and not of the caller's seed.
_MEAN_ESTIMATE_SEED = 20_240_601
_MEAN_ESTIMATE_SAMPLES = 20_000

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class LengthDist:
    """A lognormal token-length distribution with median ``median_tokens``, rounded and clipped."""

    median_tokens: float
    sigma: float
    min_tokens: int
    max_tokens: int

    def __post_init__(self) -> None:
        if not self.median_tokens > 0:
            raise ConfigError(f"median_tokens must be > 0, got {self.median_tokens}")
        if not self.sigma >= 0:
            raise ConfigError(f"sigma must be >= 0, got {self.sigma}")
        if not 1 <= self.min_tokens <= self.max_tokens:
            raise ConfigError(
                f"need 1 <= min_tokens <= max_tokens, got min_tokens={self.min_tokens}, "
                f"max_tokens={self.max_tokens}"
            )

    def from_normals(self, z: npt.NDArray[np.float64]) -> IntArray:
        """Map standard-normal draws to token counts (lets callers share one draw across distributions)."""
        raw = np.exp(np.log(self.median_tokens) + self.sigma * z)
        tokens: IntArray = np.clip(np.rint(raw), self.min_tokens, self.max_tokens).astype(np.int64)
        return tokens

    def sample(self, rng: np.random.Generator, n: int) -> IntArray:
        return self.from_normals(rng.standard_normal(n))


@dataclass(frozen=True)
class _BaseFamily:
    prompt: LengthDist
    output: LengthDist


_CHAT = _BaseFamily(LengthDist(256, 0.8, 16, 2048), LengthDist(128, 0.7, 8, 512))
_DOCUMENT = _BaseFamily(LengthDist(2048, 0.4, 512, 4096), LengthDist(96, 0.6, 16, 384))
_REASONING = _BaseFamily(LengthDist(192, 0.6, 32, 1024), LengthDist(1024, 0.6, 256, 4096))


def _base_family(name: str) -> _BaseFamily:
    if name == "chat":
        return _CHAT
    if name == "document":
        return _DOCUMENT
    if name == "reasoning":
        return _REASONING
    raise ConfigError(f"not a base family: {name!r} (known: {', '.join(MIXED_COMPONENTS)})")


def _check_family(family: str) -> None:
    if family not in FAMILIES:
        raise ConfigError(f"unknown workload family {family!r}; known families: {', '.join(FAMILIES)}")


def length_dists(family: str) -> tuple[LengthDist, LengthDist]:
    """The (prompt, output) length distributions of a base family (mixed-bursty has none of its own)."""
    _check_family(family)
    base = _base_family(family)
    return base.prompt, base.output


def component_families(family: str, n_requests: int, seed: int) -> tuple[str, ...]:
    """Which base family each request of ``generate_family(family, ..., seed)`` takes its lengths from."""
    _check_family(family)
    _check_seed_and_count(seed, n_requests)
    if family != "mixed-bursty":
        return (family,) * n_requests
    rng = np.random.default_rng([seed, _FAMILY_STREAM])
    picks = rng.choice(len(MIXED_COMPONENTS), size=n_requests, p=MIXED_WEIGHTS)
    return tuple(MIXED_COMPONENTS[i] for i in picks.tolist())


def _check_seed_and_count(seed: int, n_requests: int) -> None:
    if seed < 0:
        raise ConfigError(f"seed must be >= 0, got {seed}")
    if n_requests < 0:
        raise ConfigError(f"n_requests must be >= 0, got {n_requests}")


def _sample_lengths(components: tuple[str, ...], seed: int) -> tuple[IntArray, IntArray]:
    n = len(components)
    z_prompt = np.random.default_rng([seed, _PROMPT_STREAM]).standard_normal(n)
    z_output = np.random.default_rng([seed, _OUTPUT_STREAM]).standard_normal(n)
    prompt_tokens = np.empty(n, dtype=np.int64)
    output_tokens = np.empty(n, dtype=np.int64)
    names = np.array(components, dtype=object)
    for name in sorted(set(components)):
        base = _base_family(name)
        mask = names == name
        prompt_tokens[mask] = base.prompt.from_normals(z_prompt[mask])
        output_tokens[mask] = base.output.from_normals(z_output[mask])
    return prompt_tokens, output_tokens


def generate_family(
    family: str, rate_rps: float, n_requests: int, seed: int, tight_fraction: float = 0.5
) -> list[RequestSpec]:
    """``n_requests`` requests of ``family`` arriving at ``rate_rps`` on average, ids ``r000000`` on."""
    _check_family(family)
    _check_seed_and_count(seed, n_requests)
    if not 0.0 <= tight_fraction <= 1.0:
        raise ConfigError(f"tight_fraction must be in [0, 1], got {tight_fraction}")

    arrival_rng = np.random.default_rng([seed, _ARRIVAL_STREAM])
    if family == "mixed-bursty":
        arrivals_s = bursty_arrivals(rate_rps, n_requests, arrival_rng)
    else:
        arrivals_s = poisson_arrivals(rate_rps, n_requests, arrival_rng)

    prompt_tokens, output_tokens = _sample_lengths(component_families(family, n_requests, seed), seed)
    tight = np.random.default_rng([seed, _SLO_STREAM]).random(n_requests) < tight_fraction
    return [
        RequestSpec(f"r{i:06d}", t_s, p, o, SloClass.TIGHT if is_tight else SloClass.LOOSE)
        for i, (t_s, p, o, is_tight) in enumerate(
            zip(
                arrivals_s.tolist(),
                prompt_tokens.tolist(),
                output_tokens.tolist(),
                tight.tolist(),
                strict=True,
            )
        )
    ]


def family_mean_tokens(family: str) -> tuple[float, float]:
    """Expected (prompt, output) tokens per request, estimated from a fixed-seed sample.

    Meant for a first guess of a sustainable rate; the estimate does not depend on any caller's seed.
    """
    _check_family(family)
    components = component_families(family, _MEAN_ESTIMATE_SAMPLES, _MEAN_ESTIMATE_SEED)
    prompt_tokens, output_tokens = _sample_lengths(components, _MEAN_ESTIMATE_SEED)
    return float(prompt_tokens.mean()), float(output_tokens.mean())
