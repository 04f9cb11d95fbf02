"""Workload families with prompt reuse, for prefix-cache-aware routing: shared-prefix, multi-turn, agentic.

Reuse is modelled at PREFIX_BLOCK_TOKENS (512) tokens, the block of Mooncake's traces: every request names
all the *full* blocks of its prompt in ``prefix_blocks``, each id standing for its block and everything
before it (types.RequestSpec). Two requests share exactly the leading blocks whose ids agree; the tokens
past a prompt's last full block are its own. Finer reuse (vLLM caches 16-token blocks) is not modelled: a
block a prompt shares only in part counts as not shared.

All three families are one model, a *session*: a prompt that opens with a shared context (picked with Zipf
popularity from a pool of contexts drawn once per run: the k-th of K is picked with probability proportional
to k**-zipf_exponent) or with none, then the session's own first message; then, turn after turn, the whole
previous prompt again, the previous answer and a new message. A later turn's ``prefix_blocks`` therefore
start with all of the previous turn's: its full blocks are cached on the engine that prefilled it. The
previous answer's tokens are new blocks: in disaggregated serving the prefill engine never sees the output,
so only the previous *prompt* can be reused there. A session ends after a geometric number of turns, or
earlier at the first turn whose prompt plus output would pass ``max_context_tokens``.

* shared-prefix (SharedPrefixParams): chatbot or API traffic behind a few long system prompts; one turn.
* multi-turn (MultiTurnParams): conversations, a user thinking between turns; no shared context.
* agentic (AgenticParams): agent loops over a few long shared contexts (a code base, a manual): short
  outputs (tool calls), each step appending a tool result and resubmitting after a short delay.

Turn k+1 arrives ``output_tokens * answer_s_per_token + gap`` after turn k (the answer streaming at a
nominal speed, then an exponential think or tool time): open loop, the generator cannot know when the
answer really ends. Sessions arrive as a Poisson process at ``rate_rps / E[requests per session]``, so the
long-run request rate is ``rate_rps``; E[...] is estimated (fixed seed, the run's pool of contexts) for the
families with more than one turn. The rate ramps up over the first session lifetimes (tens of seconds)
from the session rate to ``rate_rps``, as sessions accumulate.

Determinism: every quantity (session arrivals, context lengths, context picks, first messages, appended
messages, outputs, turn counts, gaps, SLO classes) draws from its own stream ``[seed, STREAM]``, in fixed
chunks, session after session. The requests for ``n`` are the first ``n`` (by arrival) of one unbounded
sequence, so a larger ``n`` only adds later requests. Block ids are ``base + counter``: the counter numbers
the run's blocks in the order they are made, the base puts the family (bits 58-61) and a 26-bit salt of the
seed (bits 32-57) above it, so ids are deterministic for (family, seed, rate, n), distinct between the
families (and, but for a 2**-26 chance, between seeds), disjoint from a Mooncake trace's small ids and
below 2**62.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from calroute.errors import ConfigError
from calroute.types import PREFIX_BLOCK_TOKENS, RequestSpec, SloClass
from calroute.workload.families import LengthDist

PREFIX_FAMILIES = ("shared-prefix", "multi-turn", "agentic")

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

# Fixed, so the requests-per-session estimate is a constant of the family and the run's context pool.
_ESTIMATE_SEED = 20_261_202
_ESTIMATE_SESSIONS = 4_000
_CHUNK = 1024  # values drawn at a time from a stream; fixed, so a stream's sequence never depends on n

_FAMILY_SHIFT = 58
_SALT_SHIFT = 32
_SALT_BITS = 26
_COUNTER_LIMIT = 1 << _SALT_SHIFT


@dataclass(frozen=True)
class _SessionShape:
    """The session model every prefix family is an instance of (see the module docstring)."""

    n_contexts: int  # 0: sessions open with their own message only
    zipf_exponent: float
    context: LengthDist | None  # tokens, rounded to whole blocks (at least one)
    first: LengthDist
    append: LengthDist | None  # None: single-turn
    output: LengthDist
    mean_turns: float
    mean_gap_s: float
    answer_s_per_token: float
    max_context_tokens: int

    def __post_init__(self) -> None:
        if self.n_contexts < 0 or (self.n_contexts > 0) != (self.context is not None):
            raise ConfigError("a family has shared contexts exactly when it has a context length")
        if not (math.isfinite(self.zipf_exponent) and self.zipf_exponent >= 0):
            raise ConfigError(f"zipf_exponent must be a finite number >= 0, got {self.zipf_exponent}")
        if not (math.isfinite(self.mean_turns) and self.mean_turns >= 1):
            raise ConfigError(f"the mean number of turns must be >= 1, got {self.mean_turns}")
        if self.mean_turns > 1 and self.append is None:
            raise ConfigError("a multi-turn family needs an appended message length")
        if not (math.isfinite(self.mean_gap_s) and self.mean_gap_s >= 0):
            raise ConfigError(f"the mean gap between turns must be >= 0 s, got {self.mean_gap_s}")
        if not (math.isfinite(self.answer_s_per_token) and self.answer_s_per_token >= 0):
            raise ConfigError(f"answer_s_per_token must be >= 0, got {self.answer_s_per_token}")
        longest_first_tokens = self.context_tokens_max + self.first.max_tokens + self.output.max_tokens
        if longest_first_tokens > self.max_context_tokens:
            # A first turn is never cut, so the longest one must fit.
            raise ConfigError(
                f"the longest first turn ({longest_first_tokens} tokens: context, first message and output "
                f"at their maxima) exceeds max_context_tokens={self.max_context_tokens}"
            )

    @property
    def context_tokens_max(self) -> int:
        return 0 if self.context is None else _whole_blocks(self.context.max_tokens) * PREFIX_BLOCK_TOKENS


@dataclass(frozen=True)
class SharedPrefixParams:
    """shared-prefix: ``n_prompts`` system prompts (lengths from ``system_prompt``, in tokens, rounded to
    whole blocks, drawn once per run), each request picking one with Zipf popularity (exponent
    ``zipf_exponent``), then its own ``suffix`` and a short ``output``. One turn; Poisson arrivals.

    At the defaults the 16 system prompts hold about 110k tokens, more than one engine's 60k of KV, so an
    engine cannot cache them all and where each request goes decides what hits.
    """

    n_prompts: int = 16
    zipf_exponent: float = 1.0
    system_prompt: LengthDist = LengthDist(6144, 0.5, 2048, 16384)
    suffix: LengthDist = LengthDist(256, 0.8, 16, 2048)
    output: LengthDist = LengthDist(96, 0.6, 8, 512)

    def shape(self) -> _SessionShape:
        if self.n_prompts < 1:
            raise ConfigError(f"n_prompts must be >= 1, got {self.n_prompts}")
        return _SessionShape(
            n_contexts=self.n_prompts,
            zipf_exponent=self.zipf_exponent,
            context=self.system_prompt,
            first=self.suffix,
            append=None,
            output=self.output,
            mean_turns=1.0,
            mean_gap_s=0.0,
            answer_s_per_token=0.0,
            max_context_tokens=32_768,
        )


@dataclass(frozen=True)
class MultiTurnParams:
    """multi-turn: conversations arriving as a Poisson process. A session opens with its own
    ``first_message`` (system prompt and first question); each later turn resubmits the previous prompt,
    the previous answer (``output``) and a new ``user_message``, ``output * answer_s_per_token`` plus an
    exponential think time (mean ``mean_think_s``) after the previous turn. Turns per session: geometric
    with mean ``mean_turns``, cut where prompt plus output would pass ``max_context_tokens`` (32,768: the
    default profile's max_model_len, so no request is rejected).
    """

    first_message: LengthDist = LengthDist(1024, 0.8, 64, 8192)
    user_message: LengthDist = LengthDist(256, 0.8, 8, 4096)
    output: LengthDist = LengthDist(256, 0.7, 16, 1024)
    mean_turns: float = 6.0
    mean_think_s: float = 3.0
    answer_s_per_token: float = 0.02
    max_context_tokens: int = 32_768

    def shape(self) -> _SessionShape:
        return _SessionShape(
            n_contexts=0,
            zipf_exponent=0.0,
            context=None,
            first=self.first_message,
            append=self.user_message,
            output=self.output,
            mean_turns=self.mean_turns,
            mean_gap_s=self.mean_think_s,
            answer_s_per_token=self.answer_s_per_token,
            max_context_tokens=self.max_context_tokens,
        )


@dataclass(frozen=True)
class AgenticParams:
    """agentic: agent tasks arriving as a Poisson process, each over one of ``n_contexts`` long shared
    contexts (lengths from ``context``, rounded to whole blocks, drawn once per run; picked with Zipf
    popularity, exponent ``zipf_exponent``) plus its own ``task``. Each step asks for a short ``output`` (a
    tool call); the next step appends the call and its ``tool_result`` and resubmits
    ``output * answer_s_per_token`` plus an exponential tool time (mean ``mean_tool_s``) later. Steps per
    task: geometric with mean ``mean_steps``, cut at ``max_context_tokens``.

    At the defaults the 12 contexts hold about 105k tokens, more than one engine's 60k of KV, and a step's
    prompt is about 12k tokens on average: longer contexts (24k) leave a 60k-token engine room for too few
    requests at once to serve more than a trickle.
    """

    n_contexts: int = 12
    zipf_exponent: float = 1.0
    context: LengthDist = LengthDist(8192, 0.4, 4096, 16384)
    task: LengthDist = LengthDist(256, 0.6, 32, 2048)
    tool_result: LengthDist = LengthDist(384, 0.9, 16, 4096)
    output: LengthDist = LengthDist(64, 0.7, 8, 512)
    mean_steps: float = 8.0
    mean_tool_s: float = 1.0
    answer_s_per_token: float = 0.02
    max_context_tokens: int = 32_768

    def shape(self) -> _SessionShape:
        if self.n_contexts < 1:
            raise ConfigError(f"n_contexts must be >= 1, got {self.n_contexts}")
        return _SessionShape(
            n_contexts=self.n_contexts,
            zipf_exponent=self.zipf_exponent,
            context=self.context,
            first=self.task,
            append=self.tool_result,
            output=self.output,
            mean_turns=self.mean_steps,
            mean_gap_s=self.mean_tool_s,
            answer_s_per_token=self.answer_s_per_token,
            max_context_tokens=self.max_context_tokens,
        )


PrefixFamilyParams = SharedPrefixParams | MultiTurnParams | AgenticParams


def default_params(family: str) -> PrefixFamilyParams:
    """The defaults of a prefix family (what ``--workload NAME`` runs)."""
    if family == "shared-prefix":
        return SharedPrefixParams()
    if family == "multi-turn":
        return MultiTurnParams()
    if family == "agentic":
        return AgenticParams()
    raise ConfigError(f"unknown prefix family {family!r}; known: {', '.join(PREFIX_FAMILIES)}")


def _whole_blocks(tokens: int) -> int:
    return max(1, round(tokens / PREFIX_BLOCK_TOKENS))


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
    shape: _SessionShape, context_tokens: npt.NDArray[np.int64], cdf: npt.NDArray[np.float64]
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


_Row = tuple[float, int, int, int, int, tuple[int, ...]]  # arrival, session, turn, prompt, output, blocks


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
        drawn = shape.context.sample(np.random.default_rng([seed, _CONTEXT_LENGTH_STREAM]), shape.n_contexts)
        for tokens in drawn.tolist():
            n_blocks = _whole_blocks(tokens)
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
        for turn in range(turns):
            output_tokens = int(outputs.next())
            if turn and prompt_tokens + output_tokens > shape.max_context_tokens:
                break  # a first turn always fits (_SessionShape checks its maxima)
            fresh = prompt_tokens // block - len(blocks)
            blocks.extend(range(base + counter, base + counter + fresh))
            counter += fresh
            if t_s >= 0.0:
                rows.append((t_s, session, turn, prompt_tokens, output_tokens, tuple(blocks)))
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
        RequestSpec(f"r{i:06d}", t_s, p, o, SloClass.TIGHT if is_tight else SloClass.LOOSE, b)
        for i, ((t_s, _, _, p, o, b), is_tight) in enumerate(zip(rows, tight.tolist(), strict=True))
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
