"""The prefix families: determinism, order, the reuse structure each promises, rates and limits."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest

from calroute.costmodel.profiles import DEFAULT_PROFILE, get_profile
from calroute.errors import ConfigError
from calroute.types import PREFIX_BLOCK_TOKENS, RequestSpec, SloClass
from calroute.workload.families import FAMILIES, LengthDist
from calroute.workload.prefix_families import block_id_base, generate_prefix_family, session_turns
from calroute.workload.prefix_params import (
    PREFIX_FAMILIES,
    AgenticParams,
    MultiTurnParams,
    SharedPrefixParams,
    default_params,
)
from calroute.workload.reuse import unbounded_reuse
from calroute.workload.source import WORKLOADS, FamilyWorkload

N = 3000
RATE_RPS = 4.0
BLOCK = PREFIX_BLOCK_TOKENS


@pytest.fixture(scope="module")
def generated() -> dict[str, list[RequestSpec]]:
    return {family: generate_prefix_family(family, RATE_RPS, N, seed=1) for family in PREFIX_FAMILIES}


def _sessions(family: str, reqs: list[RequestSpec], **kw: object) -> list[list[RequestSpec]]:
    """``reqs`` (generated at RATE_RPS, seed 1, unless ``kw`` says otherwise) grouped into their sessions,
    each in turn order; only sessions that start within the run."""
    args: dict[str, object] = {"rate_rps": RATE_RPS, "n_requests": len(reqs), "seed": 1, **kw}
    turns = session_turns(family, **args)  # type: ignore[arg-type]
    sessions: dict[int, list[tuple[int, RequestSpec]]] = {}
    for (session, turn), r in zip(turns, reqs, strict=True):
        sessions.setdefault(session, []).append((turn, r))
    out = []
    for members in sessions.values():
        if members[0][0] == 0:
            assert [turn for turn, _ in members] == list(range(len(members)))
            out.append([r for _, r in members])
    return out


def test_registered_everywhere_families_are() -> None:
    assert PREFIX_FAMILIES == ("shared-prefix", "multi-turn", "agentic")
    assert WORKLOADS == FAMILIES + PREFIX_FAMILIES
    for family in PREFIX_FAMILIES:
        source = FamilyWorkload(family, 50)
        assert source.requests(2.0, 0) == generate_prefix_family(family, 2.0, 50, 0)
        with pytest.raises(ConfigError, match="needs a rate"):
            source.requests(None, 0)


@pytest.mark.parametrize("family", PREFIX_FAMILIES)
def test_deterministic_and_seeded(family: str, generated: dict[str, list[RequestSpec]]) -> None:
    assert generate_prefix_family(family, RATE_RPS, N, seed=1) == generated[family]
    other = generate_prefix_family(family, RATE_RPS, N, seed=2)
    assert [r.arrival_s for r in other] != [r.arrival_s for r in generated[family]]
    # Block ids of different seeds and families live apart.
    assert not {b for r in other for b in r.prefix_blocks} & {
        b for r in generated[family] for b in r.prefix_blocks
    }


def test_families_use_disjoint_block_ids(generated: dict[str, list[RequestSpec]]) -> None:
    ids = {family: {b for r in reqs for b in r.prefix_blocks} for family, reqs in generated.items()}
    for family in PREFIX_FAMILIES:
        assert all(b >= block_id_base(family, 1) for b in ids[family])
        assert max(ids[family]) < 2**62
        for other in PREFIX_FAMILIES:
            if other != family:
                assert not ids[family] & ids[other]


@pytest.mark.parametrize("family", PREFIX_FAMILIES)
def test_first_n_are_a_prefix_of_more(family: str, generated: dict[str, list[RequestSpec]]) -> None:
    """A larger n only adds later requests (the load generator grows n until a duration is covered)."""
    assert generate_prefix_family(family, RATE_RPS, 200, seed=1) == generated[family][:200]
    assert generate_prefix_family(family, RATE_RPS, 0, seed=1) == []


@pytest.mark.parametrize("family", PREFIX_FAMILIES)
def test_sorted_ids_and_slo_mix(family: str, generated: dict[str, list[RequestSpec]]) -> None:
    reqs = generated[family]
    assert len(reqs) == N
    arrivals_s = np.array([r.arrival_s for r in reqs])
    assert arrivals_s[0] > 0
    assert np.all(np.diff(arrivals_s) >= 0)
    assert [r.request_id for r in reqs] == [f"r{i:06d}" for i in range(N)]
    tight = np.mean([r.slo_class is SloClass.TIGHT for r in reqs])
    assert tight == pytest.approx(0.5, abs=0.04)


@pytest.mark.parametrize("family", PREFIX_FAMILIES)
def test_blocks_name_every_full_block_within_limits(
    family: str, generated: dict[str, list[RequestSpec]]
) -> None:
    limits = get_profile(DEFAULT_PROFILE).limits
    for r in generated[family]:
        assert len(r.prefix_blocks) == r.prompt_tokens // BLOCK
        assert r.prompt_tokens >= 1 and r.output_tokens >= 1
        assert r.prompt_tokens + r.output_tokens <= limits.max_request_tokens
        assert len(set(r.prefix_blocks)) == len(r.prefix_blocks)


@pytest.mark.parametrize("family", ["multi-turn", "agentic"])
def test_a_turn_repeats_the_answer_blocks_its_predecessor_named(
    family: str, generated: dict[str, list[RequestSpec]]
) -> None:
    """A request's answer blocks are the whole blocks its prompt and output fill past its prompt's; the next
    turn's prompt, which repeats both, names them next (what the engine that decoded the answer holds)."""
    sessions = [s for s in _sessions(family, generated[family]) if len(s) > 1]
    assert sessions
    for session in sessions:
        for prev, nxt in zip(session, session[1:], strict=False):
            named = prev.prefix_blocks + prev.answer_blocks
            assert len(named) == (prev.prompt_tokens + prev.output_tokens) // BLOCK
            assert nxt.prefix_blocks[: len(named)] == named
            assert not set(prev.answer_blocks) & set(prev.prefix_blocks)


@pytest.mark.parametrize(
    ("family", "seed", "rel"),
    [("shared-prefix", 0, 0.05), ("multi-turn", 1, 0.06), ("agentic", 2, 0.06)],
)
def test_long_run_rate(family: str, seed: int, rel: float) -> None:
    # Sessions bunch requests, so the rate over a run varies more than a Poisson process's would.
    reqs = generate_prefix_family(family, 5.0, 30_000, seed)
    assert (len(reqs) - 1) / reqs[-1].arrival_s == pytest.approx(5.0, rel=rel)
    # No ramp-up: the burn-in puts the first tenth at the long-run rate too.
    tenth_s = reqs[-1].arrival_s / 10
    first = sum(r.arrival_s < tenth_s for r in reqs)
    assert first / tenth_s == pytest.approx(5.0, rel=0.12)


def test_rate_scales_time_not_content() -> None:
    slow = generate_prefix_family("shared-prefix", 1.0, 500, 3)
    fast = generate_prefix_family("shared-prefix", 4.0, 500, 3)
    assert [r[2:] for r in slow] == [r[2:] for r in fast]
    np.testing.assert_allclose([r.arrival_s for r in slow], [4 * r.arrival_s for r in fast])


def test_shared_prefix_zipf_popularity(generated: dict[str, list[RequestSpec]]) -> None:
    params = SharedPrefixParams()
    reqs = generated["shared-prefix"]
    appearances = Counter(b for r in reqs for b in r.prefix_blocks)
    system_prompts: dict[int, tuple[int, ...]] = {}  # first block -> the system prompt's blocks
    for r in reqs:
        shared = sum(appearances[b] > 1 for b in r.prefix_blocks)
        # A system prompt (blocks others have too), then the request's own blocks.
        assert all(appearances[b] > 1 for b in r.prefix_blocks[:shared])
        assert all(appearances[b] == 1 for b in r.prefix_blocks[shared:])
        system = r.prefix_blocks[:shared]
        assert system_prompts.setdefault(system[0], system) == system
    assert len(system_prompts) == params.n_prompts
    # Zipf: the k-th most popular prompt gets a share proportional to k**-exponent.
    counts = sorted(Counter(r.prefix_blocks[0] for r in reqs).values(), reverse=True)
    expected = np.arange(1, params.n_prompts + 1, dtype=float) ** -params.zipf_exponent
    np.testing.assert_allclose(counts[:3], (expected / expected.sum() * N)[:3], rtol=0.12)
    assert counts[0] > 5 * counts[-1]
    # The distinct system prompts hold well over one engine's KV: routing decides what hits.
    system_tokens = BLOCK * sum(len(blocks) for blocks in system_prompts.values())
    assert system_tokens > 1.5 * get_profile(DEFAULT_PROFILE).limits.kv_capacity_tokens


@pytest.mark.parametrize("family", ["multi-turn", "agentic"])
def test_each_turn_extends_the_previous(family: str, generated: dict[str, list[RequestSpec]]) -> None:
    params = default_params(family)
    assert isinstance(params, MultiTurnParams | AgenticParams)
    sessions = _sessions(family, generated[family])
    # Geometric turn counts, over the sessions the end of the run does not cut.
    end_s = generated[family][-1].arrival_s
    lengths = [len(s) for s in sessions if s[0].arrival_s < end_s - 300]
    mean_turns = params.mean_turns if isinstance(params, MultiTurnParams) else params.mean_steps
    assert np.mean(lengths) == pytest.approx(mean_turns, rel=0.1)
    assert max(lengths) > 2 * mean_turns
    for session in sessions:
        for prev, cur in zip(session, session[1:], strict=False):
            assert cur.prefix_blocks[: len(prev.prefix_blocks)] == prev.prefix_blocks
            # The previous prompt, its answer and a new message.
            assert cur.prompt_tokens > prev.prompt_tokens + prev.output_tokens
            assert cur.arrival_s >= prev.arrival_s + prev.output_tokens * params.answer_s_per_token


def test_agentic_sessions_share_few_long_contexts(generated: dict[str, list[RequestSpec]]) -> None:
    params = AgenticParams()
    sessions = _sessions("agentic", generated["agentic"])
    contexts = Counter(s[0].prefix_blocks[0] for s in sessions)
    assert len(contexts) <= params.n_contexts
    assert len(contexts) >= params.n_contexts - 2
    assert min(len(s[0].prefix_blocks) for s in sessions) * BLOCK >= params.context.min_tokens
    # Quick resubmission: a step follows the previous one within seconds.
    gaps_s = [cur.arrival_s - prev.arrival_s for s in sessions for prev, cur in zip(s, s[1:], strict=False)]
    assert np.median(gaps_s) < 3.0


def test_multi_turn_context_cap() -> None:
    params = MultiTurnParams(mean_turns=40.0, max_context_tokens=12_288)
    reqs = generate_prefix_family("multi-turn", 2.0, 2000, 0, params=params)
    assert max(r.prompt_tokens + r.output_tokens for r in reqs) <= 12_288
    # The cap, not the geometric count, ends most sessions; the rate still holds.
    assert np.mean([len(s) for s in _sessions("multi-turn", reqs, rate_rps=2.0, seed=0, params=params)]) < 20
    assert (len(reqs) - 1) / reqs[-1].arrival_s == pytest.approx(2.0, rel=0.15)


@pytest.mark.parametrize(
    ("family", "low", "high"),
    [("shared-prefix", 0.9, 0.97), ("multi-turn", 0.7, 0.82), ("agentic", 0.88, 0.97)],
)
def test_unbounded_reuse_at_defaults(
    family: str, low: float, high: float, generated: dict[str, list[RequestSpec]]
) -> None:
    assert low < unbounded_reuse(generated[family]).hit_ratio < high


_BAD: list[tuple[str, Callable[[], object], str]] = [
    ("family", lambda: generate_prefix_family("chat", 1.0, 10, 0), "unknown prefix family"),
    ("rate", lambda: generate_prefix_family("agentic", 0.0, 10, 0), "rate_rps"),
    ("rate_nan", lambda: generate_prefix_family("agentic", float("nan"), 10, 0), "rate_rps"),
    ("n", lambda: generate_prefix_family("agentic", 1.0, -1, 0), "n_requests"),
    ("seed", lambda: generate_prefix_family("agentic", 1.0, 10, -1), "seed"),
    ("tight", lambda: generate_prefix_family("agentic", 1.0, 10, 0, 1.5), "tight_fraction"),
    (
        "params_type",
        lambda: generate_prefix_family("agentic", 1.0, 10, 0, params=MultiTurnParams()),
        "AgenticParams",
    ),
    ("prompts", lambda: SharedPrefixParams(n_prompts=0).shape(), "n_prompts"),
    ("contexts", lambda: AgenticParams(n_contexts=0).shape(), "n_contexts"),
    ("turns", lambda: MultiTurnParams(mean_turns=0.5).shape(), "turns"),
    ("think", lambda: MultiTurnParams(mean_think_s=-1.0).shape(), "gap"),
    ("zipf", lambda: SharedPrefixParams(zipf_exponent=-1.0).shape(), "zipf_exponent"),
    (
        "first_turn_too_long",
        lambda: replace(AgenticParams(), context=LengthDist(8192, 0.4, 4096, 32768)).shape(),
        "longest first turn",
    ),
]


@pytest.mark.parametrize(("name", "call", "pattern"), _BAD, ids=[b[0] for b in _BAD])
def test_bad_arguments(name: str, call: Callable[[], object], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        call()


def test_a_familys_pool_of_contexts_is_the_same_for_every_seed() -> None:
    # a seed varies arrivals and samples, not the workload's definition: the shared contexts' lengths (in
    # blocks) are the family's; only their ids are salted by the seed
    def context_lengths(seed: int) -> set[int]:
        reqs = generate_prefix_family("shared-prefix", 20.0, 2000, seed)
        # the longest run of blocks shared by every request that opens with the same first block
        runs: dict[int, tuple[int, ...]] = {}
        for r in reqs:
            if not r.prefix_blocks:
                continue
            b = r.prefix_blocks
            prev = runs.get(b[0])
            if prev is None:
                runs[b[0]] = b
            else:
                n = 0
                while n < min(len(prev), len(b)) and prev[n] == b[n]:
                    n += 1
                runs[b[0]] = prev[:n]
        return {len(v) for v in runs.values()}

    assert context_lengths(3) == context_lengths(7) == context_lengths(0)
