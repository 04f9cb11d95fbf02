"""prefix_scorer_mix: llm-d's default scheduling profile, a weighted sum of a prefix-cache score, a queue
score and a KV-cache score per candidate, the highest total wins, in each pool.

llm-d's router (EPP) filters, scores and picks: each scorer gives every candidate a value in [0, 1], the
profile multiplies each by its weight, and the max-score picker takes the highest sum. The default profile
that the InferencePool Helm chart writes when the user gives none (``default-plugins.yaml``,
kubernetes-sigs/gateway-api-inference-extension ``config/charts/inferencepool/templates/epp-config.yaml``
@ 139eec8; Red Hat's llm-d docs describe the same default, queue 2 and prefix cache 3) is:

- ``prefix-cache-scorer``, weight 3: the prompt's blocks the router's index expects the candidate to hold,
  over the prompt's blocks, both within the match window (below);
- ``queue-scorer``, weight 2: the waiting queue, min-max normalised over the pool, ``(max - q) / (max - min)``
  (1 for every candidate when the queues are equal);
- ``kv-cache-utilization-scorer``, weight 2: ``1 - KV used / KV capacity``.

The prefix score, as llm-d's approximate producer computes it (llm-d/llm-d-inference-scheduler
``pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix/`` @ 520af47, the code
gateway-api-inference-extension kept until 1748e82; the scorer ``pkg/epp/framework/plugins/scheduling/
scorer/prefix/plugin.go``):

- ``hashPrompt`` (hashing.go) hashes the prompt's *characters* (a chat's messages as JSON) in chained blocks
  of ``blockSizeTokens x averageCharactersPerToken`` characters, 16 x 4 = 64 by default (``autoTune``, on by
  default, takes the block size from the engine's metrics instead), and truncates the input to
  ``maxPrefixBlocksToMatch`` = 256 blocks first (types.go): 16,384 characters, 4,096 tokens at llm-d's own
  four characters a token and vLLM's 16-token GPU block. The score is the matched blocks over the hashed
  blocks, both within that window: a prompt sharing its first 4,096 tokens scores 1 however long it is.
  Here, in tokens: ``min(cached_tokens, window_tokens) / min(prompt_tokens, window_tokens)``
  (``window_tokens`` = 4,096; 0, the whole prompt). llm-d's ``maxPrefixTokensToMatch`` sets the same
  window in tokens.
- The index (indexer.go) is fed by the router's own placements (``PreRequest``), an LRU per server bounded
  by the engine's KV blocks (``autoTune``), else 31,250 entries: ``source = "approximate"`` (the default)
  matches this policy against the router's placements alone, whatever else the run's index hears
  (routing/router.py: an index of its own where the run's hears KV events). ``source = "precise"`` matches
  it against the run's index, the engines' KV events where the run has them (``calroute simulate
  --prefix-source precise``, a live cluster with KV-event endpoints): llm-d's ``precise-prefix-cache-scorer``.
- Which pods it learns: ``PreRequest`` records the primary profile's pod (the decode pod: the P/D handler's
  primary profile is its decode profile) and, since gateway-api-inference-extension 5d4b32f ("prefill aware
  prefix plugin", 2026-01-09), the pod of the profile named ``prefill`` when it ran; before, the decode pod
  alone. Here both pools learn every placement, as now.

The queue is the engine's sampled ``waiting`` and the utilisation its sampled ``kv_used_tokens /
kv_capacity_tokens``, up to one poll old, as in llm-d. Ties rotate with ``seq`` where llm-d's picker breaks
them at random.

P/D: llm-d runs a decode profile first and then, if its decider approves, a prefill profile; each profile
has its own filters and weights. Its P/D sample config (llm-d-inference-scheduler
``deploy/config/pd-epp-config.yaml`` @ 520af47) weighs the prefix scorer 2 in both profiles beside the queue
scorer at 1, with ``maxPrefixBlocksToMatch`` 256 and ``lruCapacityPerServer`` 31,250. What is modelled here:
both pools scored with the same (default) profile, always disaggregated; ``--param
prefix_scorer_mix.w_prefix=2 --param prefix_scorer_mix.w_queue=1 --param prefix_scorer_mix.w_kv=0`` is
the P/D sample's weights. Left out: the P/D decider (skip the prefill pod when the uncached part is
short), the prefix-cache-affinity filter, the characters-to-tokens estimate itself (calroute's prompts are
in tokens), and every other plugin. Our own code, from the sources cited (docs/prefix.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from calroute.policies.base import argmin_rotating, check, healthy
from calroute.policies.queue_kv import scores as load_scores
from calroute.policies.search_space import tunable, tunable_int
from calroute.types import Admission, ClusterView, InstanceState, RouteDecision

SOURCES = ("approximate", "precise")


@dataclass(frozen=True)
class Params:
    w_prefix: float = field(default=3.0, metadata=tunable(0.0, 10.0))
    w_queue: float = field(default=2.0, metadata=tunable(0.0, 10.0))
    w_kv: float = field(default=2.0, metadata=tunable(0.0, 10.0))
    # llm-d's match window: maxPrefixBlocksToMatch 256 x 16-token blocks (0: the whole prompt)
    window_tokens: int = field(default=4096, metadata=tunable_int(512, 65536, log=True))
    # approximate: the router's placements alone (llm-d's default); precise: the run's index (KV events)
    source: str = "approximate"

    def __post_init__(self) -> None:
        check(self.w_prefix >= 0, f"w_prefix must be >= 0, got {self.w_prefix}")
        check(self.w_queue >= 0, f"w_queue must be >= 0, got {self.w_queue}")
        check(self.w_kv >= 0, f"w_kv must be >= 0, got {self.w_kv}")
        check(self.w_prefix + self.w_queue + self.w_kv > 0, "w_prefix, w_queue and w_kv cannot all be 0")
        check(self.window_tokens >= 0, f"window_tokens must be >= 0, got {self.window_tokens}")
        check(self.source in SOURCES, f"source must be one of {', '.join(SOURCES)}, got {self.source!r}")


def prefix_score(s: InstanceState, prompt_tokens: int, window_tokens: int = 0) -> float:
    """The share of the prompt's first ``window_tokens`` (0: all of it) the candidate is expected to hold,
    in [0, 1]."""
    if prompt_tokens <= 0 or s.cached_tokens <= 0:
        return 0.0
    if 0 < window_tokens < prompt_tokens:
        prompt_tokens = window_tokens
    return min(1.0, s.cached_tokens / prompt_tokens)


def scores(pool: list[InstanceState], prompt_tokens: int, params: Params) -> tuple[float, ...]:
    """Each candidate's weighted score, higher is better."""
    load = load_scores(pool, params.w_queue, params.w_kv)
    w, window = params.w_prefix, params.window_tokens
    return tuple(w * prefix_score(s, prompt_tokens, window) + x for s, x in zip(pool, load, strict=True))


class PrefixScorerMix:
    """Highest weighted score in each pool; the decision's scores are the negated totals (lower is better)."""

    name: ClassVar[str] = "prefix_scorer_mix"
    reads_engine_samples: ClassVar[bool] = True

    def __init__(self, params: Params) -> None:
        self.params = params
        # what the router matches it against (routing/router.py): its own placements, or the run's index
        self.prefix_source: str | None = "approximate" if params.source == "approximate" else None

    def route(self, adm: Admission, view: ClusterView) -> RouteDecision:
        pre = healthy(view.prefill, "prefill")
        dec = healthy(view.decode, "decode")
        pre_keys = tuple(-x for x in scores(pre, adm.prompt_tokens, self.params))
        dec_keys = tuple(-x for x in scores(dec, adm.prompt_tokens, self.params))
        p = argmin_rotating(pre_keys, view.seq)
        d = argmin_rotating(dec_keys, view.seq)
        return RouteDecision(pre[p].instance_id, dec[d].instance_id, pre_keys, dec_keys)
