"""Workload families: length distributions, the mixed family's composition, SLO mix, arrivals, determinism."""

from __future__ import annotations

from collections import Counter

import numpy as np
import numpy.typing as npt
import pytest

from calroute.errors import ConfigError
from calroute.types import RequestSpec, SloClass
from calroute.workload.families import (
    FAMILIES,
    LengthDist,
    component_families,
    family_mean_tokens,
    generate_family,
    length_dists,
)

N = 20_000
# Low enough that the mixed family sees ~400 burst cycles, so its long-run rate settles.
RATE_RPS = 2.0

# The definitions from the paper, written out again so a silent change to the module fails here.
EXPECTED = {
    "chat": (LengthDist(256, 0.8, 16, 2048), LengthDist(128, 0.7, 8, 512)),
    "document": (LengthDist(2048, 0.4, 512, 4096), LengthDist(96, 0.6, 16, 384)),
    "reasoning": (LengthDist(192, 0.6, 32, 1024), LengthDist(1024, 0.6, 256, 4096)),
}


def _lengths(requests: list[RequestSpec]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    prompt = np.array([r.prompt_tokens for r in requests], dtype=np.int64)
    output = np.array([r.output_tokens for r in requests], dtype=np.int64)
    return prompt, output


@pytest.fixture(scope="module")
def generated() -> dict[str, list[RequestSpec]]:
    return {family: generate_family(family, RATE_RPS, N, seed=1) for family in FAMILIES}


def test_families_constant() -> None:
    assert FAMILIES == ("chat", "document", "reasoning", "mixed-bursty")


@pytest.mark.parametrize("family", list(EXPECTED))
def test_length_definitions(family: str) -> None:
    assert length_dists(family) == EXPECTED[family]


@pytest.mark.parametrize("family", list(EXPECTED))
def test_lengths_match_definition(family: str, generated: dict[str, list[RequestSpec]]) -> None:
    prompt, output = _lengths(generated[family])
    for values, dist in zip((prompt, output), EXPECTED[family], strict=True):
        assert np.median(values) == pytest.approx(dist.median_tokens, rel=0.04)
        assert values.min() >= dist.min_tokens
        assert values.max() <= dist.max_tokens
        # Log-sigma from the unclipped bulk: a lognormal's interquartile range is 2 * 0.674 * sigma in logs.
        q25, q75 = np.percentile(np.log(values), [25, 75])
        assert (q75 - q25) / (2 * 0.6745) == pytest.approx(dist.sigma, rel=0.06)


def test_length_dist_clips_and_rounds() -> None:
    dist = LengthDist(100, 3.0, 10, 200)
    values = dist.sample(np.random.default_rng(0), 5_000)
    assert values.dtype == np.int64
    assert values.min() == 10
    assert values.max() == 200


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"median_tokens": 0}, "median_tokens"),
        ({"sigma": -0.1}, "sigma"),
        ({"min_tokens": 0}, "min_tokens"),
        ({"min_tokens": 50, "max_tokens": 40}, "max_tokens"),
    ],
)
def test_length_dist_rejects_bad_values(kwargs: dict[str, float], param: str) -> None:
    args: dict[str, float] = {"median_tokens": 100, "sigma": 0.5, "min_tokens": 1, "max_tokens": 1000}
    args.update(kwargs)
    with pytest.raises(ConfigError, match=param):
        LengthDist(**args)  # type: ignore[arg-type]


def test_mixed_shares_and_component_lengths(generated: dict[str, list[RequestSpec]]) -> None:
    requests = generated["mixed-bursty"]
    components = component_families("mixed-bursty", N, seed=1)
    shares = Counter(components)
    assert shares["chat"] / N == pytest.approx(0.50, abs=0.015)
    assert shares["document"] / N == pytest.approx(0.25, abs=0.015)
    assert shares["reasoning"] / N == pytest.approx(0.25, abs=0.015)

    prompt, output = _lengths(requests)
    names = np.array(components)
    for name, (prompt_dist, output_dist) in EXPECTED.items():
        mask = names == name
        assert prompt[mask].min() >= prompt_dist.min_tokens and prompt[mask].max() <= prompt_dist.max_tokens
        assert output[mask].min() >= output_dist.min_tokens and output[mask].max() <= output_dist.max_tokens
        assert np.median(output[mask]) == pytest.approx(output_dist.median_tokens, rel=0.05)
    # Both short and long requests show up in one workload.
    assert np.mean(output < 150) > 0.3
    assert np.mean(output > 700) > 0.15
    assert np.mean(prompt > 1500) > 0.15


@pytest.mark.parametrize("family", ["chat", "document", "reasoning"])
def test_base_family_components_are_itself(family: str) -> None:
    assert component_families(family, 5, seed=0) == (family,) * 5


@pytest.mark.parametrize(
    ("family", "rel_tol", "min_cv", "max_cv"),
    [
        ("chat", 0.03, 0.95, 1.05),
        ("document", 0.03, 0.95, 1.05),
        ("reasoning", 0.03, 0.95, 1.05),
        ("mixed-bursty", 0.08, 1.15, 10.0),
    ],
)
def test_arrivals(
    family: str, rel_tol: float, min_cv: float, max_cv: float, generated: dict[str, list[RequestSpec]]
) -> None:
    requests = generated[family]
    arrivals_s = np.array([r.arrival_s for r in requests])
    assert arrivals_s[0] > 0
    assert np.all(np.diff(arrivals_s) >= 0)
    assert N / arrivals_s[-1] == pytest.approx(RATE_RPS, rel=rel_tol)
    gaps_s = np.diff(arrivals_s)
    assert min_cv < gaps_s.std() / gaps_s.mean() < max_cv


def test_request_ids(generated: dict[str, list[RequestSpec]]) -> None:
    ids = [r.request_id for r in generated["chat"]]
    assert ids[:3] == ["r000000", "r000001", "r000002"]
    assert len(set(ids)) == N


@pytest.mark.parametrize("tight_fraction", [0.0, 0.3, 0.5, 1.0])
def test_tight_fraction(tight_fraction: float) -> None:
    requests = generate_family("chat", 5.0, 10_000, seed=4, tight_fraction=tight_fraction)
    share = sum(r.slo_class is SloClass.TIGHT for r in requests) / len(requests)
    assert share == pytest.approx(tight_fraction, abs=0.015)
    if tight_fraction in (0.0, 1.0):
        assert share == tight_fraction


@pytest.mark.parametrize("family", FAMILIES)
def test_deterministic_per_seed(family: str) -> None:
    first = generate_family(family, 3.0, 300, seed=9)
    assert generate_family(family, 3.0, 300, seed=9) == first
    other = generate_family(family, 3.0, 300, seed=10)
    assert [r.arrival_s for r in other] != [r.arrival_s for r in first]
    assert [r.prompt_tokens for r in other] != [r.prompt_tokens for r in first]


def test_streams_are_independent() -> None:
    base = generate_family("mixed-bursty", 3.0, 500, seed=2, tight_fraction=0.5)
    other_slo = generate_family("mixed-bursty", 3.0, 500, seed=2, tight_fraction=0.2)
    assert [r[:4] for r in base] == [r[:4] for r in other_slo]
    other_rate = generate_family("mixed-bursty", 6.0, 500, seed=2, tight_fraction=0.5)
    assert [(r.prompt_tokens, r.output_tokens, r.slo_class) for r in base] == [
        (r.prompt_tokens, r.output_tokens, r.slo_class) for r in other_rate
    ]


def test_zero_requests() -> None:
    assert generate_family("mixed-bursty", 1.0, 0, seed=0) == []


def test_unknown_family_lists_known_ones() -> None:
    with pytest.raises(ConfigError, match="chat, document, reasoning, mixed-bursty"):
        generate_family("video", 1.0, 10, seed=0)
    with pytest.raises(ConfigError, match="unknown workload family"):
        family_mean_tokens("video")


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"tight_fraction": -0.1}, "tight_fraction"),
        ({"tight_fraction": 1.5}, "tight_fraction"),
        ({"rate_rps": 0.0}, "rate_rps"),
        ({"n_requests": -1}, "n_requests"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_arguments(kwargs: dict[str, float], param: str) -> None:
    args: dict[str, float] = {"rate_rps": 1.0, "n_requests": 10, "seed": 0, "tight_fraction": 0.5}
    args.update(kwargs)
    with pytest.raises(ConfigError, match=param):
        generate_family("chat", **args)  # type: ignore[arg-type]


@pytest.mark.parametrize("family", FAMILIES)
def test_family_mean_tokens(family: str, generated: dict[str, list[RequestSpec]]) -> None:
    mean_prompt, mean_output = family_mean_tokens(family)
    prompt, output = _lengths(generated[family])
    assert mean_prompt == pytest.approx(prompt.mean(), rel=0.03)
    assert mean_output == pytest.approx(output.mean(), rel=0.03)
    assert family_mean_tokens(family) == (mean_prompt, mean_output)


def test_mixed_mean_is_weighted_mix() -> None:
    parts = {name: family_mean_tokens(name) for name in ("chat", "document", "reasoning")}
    mixed_prompt, mixed_output = family_mean_tokens("mixed-bursty")
    weights = {"chat": 0.5, "document": 0.25, "reasoning": 0.25}
    assert mixed_prompt == pytest.approx(sum(w * parts[k][0] for k, w in weights.items()), rel=0.03)
    assert mixed_output == pytest.approx(sum(w * parts[k][1] for k, w in weights.items()), rel=0.03)
