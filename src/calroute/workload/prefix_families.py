"""Workload families with prompt reuse, for prefix-cache-aware routing: shared-prefix, multi-turn, agentic.

Reuse is modelled at PREFIX_BLOCK_TOKENS (512) tokens, the block of Mooncake's traces: every request names
all the *full* blocks of its prompt in ``prefix_blocks``, each id standing for its block and everything
before it (types.RequestSpec). Two requests share exactly the leading blocks whose ids agree; the tokens
past a prompt's last full block are its own. Finer reuse (vLLM caches 16-token blocks) is not modelled: a
block a prompt shares only in part counts as not shared.

All three families are one model, a *session*: a prompt that opens with a shared context (picked with Zipf
popularity from a pool of contexts, the family's own and the same for every seed: the k-th of K is picked with
probability proportional to k**-zipf_exponent) or with none, then the session's own first message; then, turn
after turn, the whole previous prompt again, the previous answer and a new message. A later turn's
``prefix_blocks`` therefore start with all of the previous turn's: its full blocks are cached on the engine
that prefilled it. The previous answer's tokens are new blocks: in disaggregated serving the prefill engine
never sees the output, so only the previous *prompt* can be reused there. A session ends after a geometric
number of turns, or earlier at the first turn whose prompt plus output would pass ``max_context_tokens``.

* shared-prefix (SharedPrefixParams): chatbot or API traffic behind a few long system prompts; one turn.
* multi-turn (MultiTurnParams): conversations, a user thinking between turns; no shared context.
* agentic (AgenticParams): agent loops over a few long shared contexts (a code base, a manual): short
  outputs (tool calls), each step appending a tool result and resubmitting after a short delay.

Turn k+1 arrives ``output_tokens * answer_s_per_token + gap`` after turn k (the answer streaming at a
nominal speed, then an exponential think or tool time): open loop, the generator cannot know when the
answer really ends. Sessions arrive as a Poisson process at ``rate_rps / E[requests per session]``, so the
long-run request rate is ``rate_rps``; E[...] is estimated (fixed seed, the family's pool of contexts) for the
families with more than one turn. The rate ramps up over the first session lifetimes (tens of seconds)
from the session rate to ``rate_rps``, as sessions accumulate.

Determinism: every quantity but the pool's context lengths (session arrivals, context picks, first messages,
appended messages, outputs, turn counts, gaps, SLO classes) draws from its own stream ``[seed, STREAM]``, in
fixed chunks, session after session. The requests for ``n`` are the first ``n`` (by arrival) of one unbounded
sequence, so a larger ``n`` only adds later requests. Block ids are ``base + counter``: the counter numbers
the run's blocks in the order they are made, the base puts the family (bits 58-61) and a 26-bit salt of the
seed (bits 32-57) above it, so ids are deterministic for (family, seed, rate, n), distinct between the
families (and, but for a 2**-26 chance, between seeds), disjoint from a Mooncake trace's small ids and below
2**62.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from calroute.errors import ConfigError
from calroute.types import PREFIX_BLOCK_TOKENS, RequestSpec, SloClass
from calroute.workload.families import LengthDist
from calroute.workload.prefix_params import (
    PREFIX_FAMILIES,
    PrefixFamilyParams,
    SessionShape,
    default_params,
    whole_blocks,
)

# Distinct from families.py's streams (1-5) and traces.py's (11, 12).
_ARRIVAL_STREAM = 21
_CONTEXT_LENGTH_STREAM = 22
_CONTEXT_PICK_STREAM = 23
_FIRST_STREAM = 24
_APPEND_STREAM = 25
_OUTPUT_STREAM = 26
_TURNS_STREAM = 27
_GAP_STREAM = 28
_SLO_STREAM = 29

# The seed of a family's structure (its pool of shared contexts): the same for every run's seed.
_STRUCTURE_SEED = 0
# Fixed, so the requests-per-session estimate is a constant of the family and its context pool.
_ESTIMATE_SEED = 20_261_202
_ESTIMATE_SESSIONS = 4_000
_CHUNK = 1024  # values drawn at a time from a stream; fixed, so a stream's sequence never depends on n

_FAMILY_SHIFT = 58
_SALT_SHIFT = 32
_SALT_BITS = 26
_COUNTER_LIMIT = 1 << _SALT_SHIFT


def _zipf_cdf(n: int, exponent: float) -> npt.NDArray[np.float64]:
    weights = np.arange(1, n + 1, dtype=np.float64) ** -exponent
    cdf: npt.NDArray[np.float64] = np.cumsum(weights / weights.sum())
    return cdf


def block_id_base(family: str, seed: int) -> int:
    """The first block id of ``family``'s run with ``seed`` (see the module docstring)."""
    tag = PREFIX_FAMILIES.index(family) + 1
    salt = int(np.random.SeedSequence([seed, tag]).generate_state(1, np.uint32)[0]) >> (32 - _SALT_BITS)
    return (tag << _FAMILY_SHIFT) | (salt << _SALT_SHIFT)


class _Stream:
    """One random stream's values, one at a time, drawn ``_CHUNK`` at a time so the sequence of values never
    depends on how many are used."""

    __slots__ = ("_rng", "_draw", "_values", "_next")

    def __init__(
        self, seed: int, stream: int, draw: Callable[[np.random.Generator, int], npt.NDArray[np.generic]]
    ) -> None:
        self._rng = np.random.default_rng([seed, stream])
        self._draw = draw
        self._values: list[float] = []
        self._next = 0

    def next(self) -> float:
        if self._next == len(self._values):
            self._values = self._draw(self._rng, _CHUNK).tolist()
            self._next = 0
        value = self._values[self._next]
        self._next += 1
        return value


def _lengths(dist: LengthDist) -> Callable[[np.random.Generator, int], npt.NDArray[np.generic]]:
    return dist.sample


def _session_model(
    shape: SessionShape, context_tokens: npt.NDArray[np.int64], cdf: npt.NDArray[np.float64]
) -> tuple[float, float]:
    """(E[requests per session], a burn-in in seconds) for this run's contexts, from fixed-seed sessions.

    E[requests] sums over turns t P(the geometric count passes t) times P(no turn up to t passes the
    context cap). The burn-in is twice the longest session span (first to last turn) seen.
    """
    if shape.mean_turns == 1.0:
        return 1.0, 0.0
    assert shape.append is not None
    rng = np.random.default_rng(_ESTIMATE_SEED)
    m = _ESTIMATE_SESSIONS
    p_stop = 1.0 / shape.mean_turns
    # Turns beyond this carry under 1e-6 of the geometric's mass.
    turns = max(2, math.ceil(math.log(1e-6) / math.log1p(-p_stop)))
    start = shape.first.sample(rng, m)
    if len(context_tokens):
        picks = np.minimum(np.searchsorted(cdf, rng.random(m), side="right"), len(context_tokens) - 1)
        start = start + context_tokens[picks]
    outputs = shape.output.sample(rng, m * turns).reshape(m, turns)
    appends = shape.append.sample(rng, m * turns).reshape(m, turns)
    growth = np.cumsum(outputs[:, :-1] + appends[:, 1:], axis=1)
    contexts = start[:, None] + np.concatenate((np.zeros((m, 1), dtype=np.int64), growth), axis=1)
    alive = np.logical_and.accumulate(contexts + outputs <= shape.max_context_tokens, axis=1)
    survival = (1.0 - p_stop) ** np.arange(turns)
    mean_requests = float(np.dot(alive.mean(axis=0), survival))

    gaps_s = outputs[:, :-1] * shape.answer_s_per_token + rng.exponential(shape.mean_gap_s, (m, turns - 1))
    counts = np.minimum(rng.geometric(p_stop, m), alive.sum(axis=1))
    since_start_s = np.concatenate((np.zeros((m, 1)), np.cumsum(gaps_s, axis=1)), axis=1)
    spans_s = since_start_s[np.arange(m), counts - 1]
    return mean_requests, 2.0 * float(spans_s.max())


def _check_args(family: str, rate_rps: float, n_requests: int, seed: int, tight_fraction: float) -> None:
    if family not in PREFIX_FAMILIES:
        raise ConfigError(f"unknown prefix family {family!r}; known: {', '.join(PREFIX_FAMILIES)}")
    if not (math.isfinite(rate_rps) and rate_rps > 0):
        raise ConfigError(f"rate_rps must be a positive finite number, got {rate_rps}")
    if n_requests < 0:
        raise ConfigError(f"n_requests must be >= 0, got {n_requests}")
    if seed < 0:
        raise ConfigError(f"seed must be >= 0, got {seed}")
    if not 0.0 <= tight_fraction <= 1.0:
        raise ConfigError(f"tight_fraction must be in [0, 1], got {tight_fraction}")


# arrival, session, turn, prompt, output, blocks, answer blocks
_Row = tuple[float, int, int, int, int, tuple[int, ...], tuple[int, ...]]


def _rows(
    family: str, rate_rps: float, n_requests: int, seed: int, params: PrefixFamilyParams | None
) -> list[_Row]:
    if params is None:
        params = default_params(family)
    elif type(params) is not type(default_params(family)):
        raise ConfigError(
            f"{family} takes {type(default_params(family)).__name__}, not {type(params).__name__}"
        )
    shape = params.shape()
    block = PREFIX_BLOCK_TOKENS
    base = block_id_base(family, seed)
    counter = 0

    contexts: list[tuple[int, ...]] = []
    context_tokens = np.zeros(0, dtype=np.int64)
    cdf = np.ones(0, dtype=np.float64)
    if shape.context is not None:
        # The pool is the family's definition, the same for every seed (a seed varies arrivals and samples):
        # drawn per seed, it made seeds different workloads (shared-prefix's expected context per request
        # ranged from 5.0k to 9.8k tokens over seeds 0-19). Seed 0's pool, as before.
        rng = np.random.default_rng([_STRUCTURE_SEED, _CONTEXT_LENGTH_STREAM])
        drawn = shape.context.sample(rng, shape.n_contexts)
        for tokens in drawn.tolist():
            n_blocks = whole_blocks(tokens)
            contexts.append(tuple(range(base + counter, base + counter + n_blocks)))
            counter += n_blocks
        context_tokens = np.array([len(c) * block for c in contexts], dtype=np.int64)
        cdf = _zipf_cdf(shape.n_contexts, shape.zipf_exponent)
    mean_requests, burn_in_s = _session_model(shape, context_tokens, cdf)
    session_rate_rps = rate_rps / mean_requests

    arrivals = _Stream(seed, _ARRIVAL_STREAM, lambda rng, k: rng.exponential(1.0, k))
    picks = _Stream(seed, _CONTEXT_PICK_STREAM, lambda rng, k: rng.random(k))
    firsts = _Stream(seed, _FIRST_STREAM, _lengths(shape.first))
    appends = _Stream(seed, _APPEND_STREAM, _lengths(shape.append or shape.first))
    outputs = _Stream(seed, _OUTPUT_STREAM, _lengths(shape.output))
    p_stop = 1.0 / shape.mean_turns
    turn_counts = _Stream(seed, _TURNS_STREAM, lambda rng, k: rng.geometric(p_stop, k))
    gaps = _Stream(seed, _GAP_STREAM, lambda rng, k: rng.exponential(1.0, k))

    rows: list[_Row] = []
    pending_s: list[float] = []  # a heap of the arrivals not yet known to be among the first n
    settled = 0
    # Sessions start from -burn_in_s and their requests before 0 are dropped, so the request rate is
    # already rate_rps at 0 rather than ramping up as sessions accumulate.
    start_s = -burn_in_s
    session = 0
    while settled < n_requests:
        start_s += arrivals.next() / session_rate_rps
        # Every later request arrives at or after start_s: the ones before it are final.
        while pending_s and pending_s[0] < start_s:
            heapq.heappop(pending_s)
            settled += 1
        if settled >= n_requests:
            break
        blocks: list[int] = []
        if contexts:
            u = picks.next()
            blocks.extend(contexts[min(int(np.searchsorted(cdf, u, side="right")), len(contexts) - 1)])
        prompt_tokens = len(blocks) * block + int(firsts.next())
        turns = int(turn_counts.next())
        t_s = start_s
        answer: range = range(0)
        for turn in range(turns):
            output_tokens = int(outputs.next())
            if turn and prompt_tokens + output_tokens > shape.max_context_tokens:
                break  # a first turn always fits (SessionShape checks its maxima)
            blocks.extend(answer)  # the previous answer's whole blocks, named when it was generated
            fresh = prompt_tokens // block - len(blocks)
            blocks.extend(range(base + counter, base + counter + fresh))
            counter += fresh
            # the blocks this prompt and its answer fill whole: the next turn's prompt repeats both
            n_answer = (prompt_tokens + output_tokens) // block - len(blocks)
            answer = range(base + counter, base + counter + n_answer)
            counter += n_answer
            if t_s >= 0.0:
                rows.append((t_s, session, turn, prompt_tokens, output_tokens, tuple(blocks), tuple(answer)))
                heapq.heappush(pending_s, t_s)
            if turn + 1 < turns:
                prompt_tokens += output_tokens + int(appends.next())
                t_s += output_tokens * shape.answer_s_per_token + gaps.next() * shape.mean_gap_s
        session += 1
        if counter >= _COUNTER_LIMIT:
            raise ConfigError(f"{family}: more than {_COUNTER_LIMIT} blocks in one run")

    rows.sort(key=lambda row: row[:3])
    del rows[n_requests:]
    return rows


def generate_prefix_family(
    family: str,
    rate_rps: float,
    n_requests: int,
    seed: int,
    tight_fraction: float = 0.5,
    params: PrefixFamilyParams | None = None,
) -> list[RequestSpec]:
    """The first ``n_requests`` requests (by arrival, ids ``r000000`` on) of ``family`` at ``rate_rps``.

    ``params`` overrides the family's defaults (its type must match the family).
    """
    _check_args(family, rate_rps, n_requests, seed, tight_fraction)
    rows = _rows(family, rate_rps, n_requests, seed, params)
    tight = np.random.default_rng([seed, _SLO_STREAM]).random(len(rows)) < tight_fraction
    return [
        RequestSpec(f"r{i:06d}", t_s, p, o, SloClass.TIGHT if is_tight else SloClass.LOOSE, b, a)
        for i, ((t_s, _, _, p, o, b, a), is_tight) in enumerate(zip(rows, tight.tolist(), strict=True))
    ]


def session_turns(
    family: str, rate_rps: float, n_requests: int, seed: int, params: PrefixFamilyParams | None = None
) -> list[tuple[int, int]]:
    """(session, turn) of each request ``generate_prefix_family`` makes with these arguments, in its order.

    Sessions are numbered in the order they start, from before the run's start (the burn-in), so a session
    seen from a turn > 0 on began before time 0.
    """
    _check_args(family, rate_rps, n_requests, seed, 0.5)
    return [(row[1], row[2]) for row in _rows(family, rate_rps, n_requests, seed, params)]
