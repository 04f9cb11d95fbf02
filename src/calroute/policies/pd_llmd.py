"""pd_llmd: llm-d's ``prefix-based-pd-decider``. The decode pod is picked first; a remote prefill is added
only when the prompt's tokens not cached on that pod are at least ``nonCachedTokens``.

llm-d/llm-d-inference-scheduler @ 520af47 (2026-05-17; the repository is now the "llm-d Router"),
``pkg/epp/framework/plugins/scheduling/profilehandler/disagg/``:

- ``disagg_profile_handler.go`` (``Handler.Pick``): the decode profile runs first, then the prefill profile
  only if the prefill decider approves the decode profile's first endpoint;
- ``prefix_based_pd_decider.go`` lines 99-149 (``disaggregate``): no disaggregation when ``nonCachedTokens``
  is 0 or the prompt is shorter than it; otherwise ``hit = MatchBlocks x BlockSizeTokens`` on the decode pod
  (``PrefixCacheMatchInfo`` from the approximate prefix producer) and it disaggregates when
  ``prompt - hit >= nonCachedTokens`` (``nonCached < threshold`` keeps it local: line 143). The README and
  docs/disaggregation.md say "longer than", and "shorter or equal" keeps it local; this module follows the
  code.

Defaults: the plugin's own is ``nonCachedTokens: 0`` (lines 53-55), which *disables* disaggregation: every
request stays on its decode pod (here reason ``pd_disabled``; ``aggregated`` is that rule on cache_aware).
The P/D sample configuration (``deploy/config/pd-epp-config.yaml`` line 15, also
``deploy/config/sim-pd-epp-config.yaml``) sets 16, this module's default; docs/disaggregation.md shows 8 and
the README's example 512 (``--param pd_llmd.non_cached_tokens=512``).

The hit is capped by the producer's match window: ``hashPrompt`` truncates the prompt to
``maxPrefixBlocksToMatch`` blocks, 256 x 16 tokens = 4,096 by default
(``pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix/hashing.go`` lines 63-65,
``types.go``), so a prompt longer than the window never counts as more cached than 4,096 tokens and a long one
disaggregates however much of it is cached. ``window_tokens`` is that window (0: the whole prompt), the same
as prefix_scorer_mix's.

Reason codes: ``uncached_below_threshold`` (local: fewer uncached tokens than the threshold),
``uncached_above_threshold`` (disaggregated: at least the threshold), ``pd_disabled`` (local: the threshold
is 0). The inner policy defaults to ``prefix_scorer_mix`` (llm-d's scorers; its decode pick is llm-d's decode
profile). Not modelled: llm-d counts prompt tokens as characters / 4 (calroute's prompts are in tokens); a
missing match-info attribute, which keeps llm-d local; the ``promptTokens`` gate added later (a minimum prompt
length, llm-d-router PR #933); with an approximate index, llm-d records the placement of a request kept local
on its decode pod only, where calroute's index records what the router does (routing/). Our own code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from calroute.policies.base import check
from calroute.policies.decider import Decider, DeciderParams, member, uncached_tokens
from calroute.policies.search_space import tunable_int
from calroute.types import Admission, ClusterView, RouteDecision

BELOW = "uncached_below_threshold"
ABOVE = "uncached_above_threshold"
DISABLED = "pd_disabled"


@dataclass(frozen=True)
class Params(DeciderParams):
    inner: str = "prefix_scorer_mix"
    # llm-d's nonCachedTokens: 16 in its P/D sample config; 0 disables disaggregation (llm-d's plugin default)
    non_cached_tokens: int = field(default=16, metadata=tunable_int(1, 8192, log=True))
    # the prefix producer's match window: maxPrefixBlocksToMatch 256 x 16-token blocks (0: the whole prompt)
    window_tokens: int = 4096

    def __post_init__(self) -> None:
        check(self.non_cached_tokens >= 0, f"non_cached_tokens must be >= 0, got {self.non_cached_tokens}")
        check(self.window_tokens >= 0, f"window_tokens must be >= 0, got {self.window_tokens}")
        super().__post_init__()


class PdLlmd(Decider):
    name: ClassVar[str] = "pd_llmd"

    params: Params

    def decide(self, adm: Admission, view: ClusterView, d: RouteDecision) -> RouteDecision:
        threshold = self.params.non_cached_tokens
        if threshold == 0:
            return self.local(d, DISABLED)
        cached = member(view.decode, d.decode_id).cached_tokens
        window = self.params.window_tokens
        if 0 < window < cached:
            cached = window
        if uncached_tokens(adm.prompt_tokens, cached) < threshold:
            return self.local(d, BELOW)
        return self.remote(d, ABOVE)
