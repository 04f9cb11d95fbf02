"""pd_vllm_router: vllm-router's P/D bypass, ``pd_uncached_token_threshold``: the decode worker is picked
first; when the prompt's tokens it does not hold are at most the threshold, the request goes to it alone.

Source: vllm-project/router pull request #130 ("feat: add KV events-aware precise cache routing for P/D
disaggregation", https://github.com/vllm-project/router/pull/130, opened 2026-03-28, open when read): the
``kv_aware`` policy (``src/policies/kv_aware.rs``: the worker with the longest run of the prompt's blocks in
the KV-event index, the least loaded when none holds any) and, in ``VllmPDRouter``, the bypass::

    1. select the decode worker (highest prefix score)
    2. uncached_tokens = total_tokens - cached_blocks x block_size
    3. uncached_tokens <= pd_uncached_token_threshold: send to the decode worker alone
    4. else: select a prefill worker and run the two-stage P/D flow

configured as ``kv_events.pd_uncached_token_threshold`` (``--pd-uncached-token-threshold``). Its published
value is the PR's example configuration's, 256, this module's default; no default in code was found. Status:
the PR lists wiring the bypass into ``process_vllm_request`` as future work, the stored upstream
``src/routers/http/vllm_pd_router.rs`` (@ 079da2e) has no bypass path, and a fork with the same option
(bet0x/vllm-router, its v0.12 and v0.13 release notes) calls the threshold "plumbed through but currently
reserved". So this is the rule as published, not as any release runs it. Note the boundary: at the threshold
the request stays local (``<=``), where llm-d disaggregates at its threshold (pd_llmd).

Reason codes: ``uncached_below_threshold`` (local: at most the threshold uncached) and
``uncached_above_threshold`` (disaggregated: more). The inner policy defaults to ``cache_aware``, calroute's
model of vllm-router's cache-aware policy (``src/policies/cache_aware.rs``): vllm-router's own policy, and
matched like kv_aware against the run's prefix index (the engines' KV events where the run hears them: it
sets no ``prefix_source``). kv_aware itself, the best match whatever the load, is close to
``--param pd_vllm_router.inner_params=cache_threshold=0,balance_abs_threshold=100000`` (a match of any length
wins; the load never counts as imbalanced). Our own code.
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


@dataclass(frozen=True)
class Params(DeciderParams):
    inner: str = "cache_aware"
    # at most this many uncached prompt tokens on the chosen decode engine: it prefills them itself
    uncached_token_threshold: int = field(default=256, metadata=tunable_int(1, 8192, log=True))

    def __post_init__(self) -> None:
        check(
            self.uncached_token_threshold >= 0,
            f"uncached_token_threshold must be >= 0, got {self.uncached_token_threshold}",
        )
        super().__post_init__()


class PdVllmRouter(Decider):
    name: ClassVar[str] = "pd_vllm_router"

    params: Params

    def decide(self, adm: Admission, view: ClusterView, d: RouteDecision) -> RouteDecision:
        cached = member(view.decode, d.decode_id).cached_tokens
        if uncached_tokens(adm.prompt_tokens, cached) <= self.params.uncached_token_threshold:
            return self.local(d, BELOW)
        return self.remote(d, ABOVE)
