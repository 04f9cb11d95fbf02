"""The parameters of the prefix families (workload/prefix_families.py has the model they parametrize): each
family is an instance of one session model, ``SessionShape``, with its own defaults, documented on its class.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from calroute.errors import ConfigError
from calroute.types import PREFIX_BLOCK_TOKENS
from calroute.workload.families import LengthDist

PREFIX_FAMILIES = ("shared-prefix", "multi-turn", "agentic")


@dataclass(frozen=True)
class SessionShape:
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
        return 0 if self.context is None else whole_blocks(self.context.max_tokens) * PREFIX_BLOCK_TOKENS


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

    def shape(self) -> SessionShape:
        if self.n_prompts < 1:
            raise ConfigError(f"n_prompts must be >= 1, got {self.n_prompts}")
        return SessionShape(
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

    def shape(self) -> SessionShape:
        return SessionShape(
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

    def shape(self) -> SessionShape:
        if self.n_contexts < 1:
            raise ConfigError(f"n_contexts must be >= 1, got {self.n_contexts}")
        return SessionShape(
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


def whole_blocks(tokens: int) -> int:
    return max(1, round(tokens / PREFIX_BLOCK_TOKENS))
