"""marginal_cost: the paper's router (section III-A). Price every candidate by the request's expected
marginal completion time on it, in seconds, and take the cheapest in each pool independently.

    cost_dec(d) = sigma(s) * (w_b_dec * backlog_s(d) + w_s * o_hat * tau_dec * (1 + rho * press_after(d)))
                  + w_q * queue(d)
    cost_pre(p) = sigma(s) * (w_b * backlog_s(p) + w_s * prompt * tau_pre)
                  + (w_q + w_cobatch * prompt * tau_pre) * queue(p)

backlog_s is the ledger's estimate in *observed* seconds, never priced with tau: with a wrong tau the two
terms disagree in units and the size term is mis-weighted, which is why calibration matters.
press_after(d) = (max(kv_used, kv_committed) + prompt + o_hat) / kv_capacity: the KV pressure after this
request joins, from the larger of the engine's sampled usage and the ledger's committed footprint. With
``shared_kv`` (the default) both are counted as the engine's cache holds them: a block the engine's streams
share is in its KV once (vLLM's block pool; the ledger's active blocks give ``active_shared_tokens``), and the
request adds only the prompt past its leading run among them (``active_overlap_tokens``). Counting every
prompt whole priced the decode engine serving a hot prefix as nearly full; it was the emptiest in fact, and
on shared-prefix the requests sent elsewhere filled the other engines' KV until pulls waited and the
prefill engines' held KV blocked their queues (docs/prefix.md).
queue(d) is the in-flight count; w_q is a small tie-breaker.

The w_cobatch term is the rest of a prefill's *marginal* cost: the time it adds to other requests. A prefill
engine batches every prompt waiting for it into its next iteration, so a new prompt delays each request
that will share that iteration by its own prefill time. The ledger cannot tell waiting requests from
running ones (which are not delayed), so queue(p) overcounts; the delayed ones are counted at weight 1
whatever their SLO class, which undercounts tight ones. Pricing only the request's own wait
sent a long prompt to the engine with the fewest pending tokens even when that meant delaying five short ones
behind it. ``w_cobatch=0`` drops the term (the paper's prefill price).

One deliberate departure from the paper: the decode backlog weight w_b_dec is 0, not w_b. A prefill engine
is a FCFS queue, so a new prompt waits for the backlog ahead of it; a decode engine batches continuously,
so a new request joins the running batch at the next step and waits behind nobody until the KV budget is
full, which press_after prices. Charging decode instances their remaining seconds sends requests away from
an engine finishing one long generation and onto one crowded with short ones. ``w_b_dec=1`` gives the
paper's policy back. docs/policies.md has what each change measured.

step_curve=True prices a decode instance with the calibrated step curve instead of the (1 + rho * press)
inflation: the request's own decode time there is o_hat * step_s(in_flight + 1, kv_after), with step_s =
base + per_seq * batch + per_ctx * context from the calibration, and rho now prices only the part of
kv_after beyond the KV budget (the request would wait for room). rho * press is not calibrated: with
rho = 1 a full KV cache doubles the price, where the calibrated A40 curve adds about a fifth, and a stream
costs nothing however many there are. So the KV price balances tokens and not streams, and
each stream on an engine delays a new request's first token.

Prefix reuse (calroute's fifth admission-time feature, docs/prefix.md): a prompt's tokens that an engine
already holds are prefill seconds not spent there. ``cached(p)`` is the router's prefix index's count for
the request at p, so the prefill price and the co-batch term count only ``prompt - cached(p)`` tokens, and
the backlog they are weighed against is the ledger's, also in computed tokens. On the decode side the
NixlConnector pulls only the blocks the decode engine does not hold, so each decode candidate is also
charged ``sigma * w_s * transfer_s(prompt - cached(d))`` from the calibrated transfer model (a constant
across candidates when none holds anything, so it moves nothing then).

A prompt computed at p also displaces as many tokens of p's cache, and some of them a later request would
have hit: that recompute is part of this request's marginal cost. ``reuse(p)``, the index's evicted-reuse
ratio for p (the share of p's recent evictions that a later request sent to p asked for again), prices it:
``sigma * w_evict * reuse(p) * (prompt - cached(p)) * tau_pre``. On traffic without reuse the ratio is 0 and
the term vanishes; where prefixes recur, it keeps each prefix where it is instead of copying it to every
engine, which the request's own saving alone did not (docs/prefix.md has what it measured).

Local prefill (``local_prefill``, off by default: issue 37, docs/local-prefill.md): every request can also
go to a decode engine alone, which prefills the prompt in its own steps (RouteDecision.local). Its price on
decode candidate d, in the same seconds as the remote path's:

    cost_local(d) = cost_dec(d) without the pull
                    + sigma * (w_b * ahead(d) + w_s * compute(d) * tau_pre (+ the eviction price at d))
                    + w_local * stall(d) * queue(d)

with compute(d) = prompt - cached(d) (the decode engine's own cache: a conversation's previous turn it
decoded) and ahead(d) the local prefills queued there (the ledger's pending prefill tokens). The last term is
the delay the prefill adds to every stream running there, which a prefill engine spares them, priced for what
it risks: with s = compute(d) * tau_pre, stall(d) = s * s / (s + stall_tolerance_s), nearly nothing for a
prefill much shorter than the tolerance (a stream's TPOT target absorbs it), s for a long one. Priced linearly
(``stall_tolerance_s=0``), short prompts on chat traffic were kept off busy decode engines that had room for
them, and lost 70 points to a threshold decider. The remote
path costs cost_pre(p*) + cost_dec(d*) + the pull; the cheaper path is taken (reason ``cheaper_local`` or
``cheaper_remote``).

Feature switches remove one admission-time feature at a time (the paper's ablation, section V-G):
use_output_length=False prices every request at ``fallback_output_tokens``; use_kv_pressure=False drops the
(1 + rho * press) factor; use_slo=False sets sigma to 1 for every class; use_prompt_length=False drops the
prompt from the prefill price and from the KV footprint; use_prefix_cache=False prices every prompt as if
computed from scratch (the paper's router).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from calroute.costmodel.calibration import Calibration
from calroute.policies.base import argmin_rotating, check, healthy
from calroute.policies.search_space import tunable
from calroute.types import (
    Admission,
    ClusterView,
    PicklesByConstructor,
    RouteDecision,
    SloClass,
    local_decision,
)

# RouteDecision.reason, with local_prefill: the path priced cheaper
CHEAPER_LOCAL = "cheaper_local"
CHEAPER_REMOTE = "cheaper_remote"


@dataclass(frozen=True)
class Params(PicklesByConstructor):
    # Weight of the committed backlog (seconds). 0.26 and w_evict 1.16 were found together by `calroute tune
    # --workload all --search w_b,w_evict` (they were 1 and 2.61): no family worse on held-out seeds at three
    # operating points, ahead on mixed-bursty and the prefix families (docs/tuning.md, "Current figures").
    w_b: float = field(default=0.26, metadata=tunable(0.0, 4.0))
    # Weight of the backlog on decode instances. 0 by default, unlike the paper: see the module docstring.
    w_b_dec: float = field(default=0.0, metadata=tunable(0.0, 2.0))
    # Weight of the request's own priced work (seconds). Scaling every weight together changes no decision,
    # so w_s's range is narrow and log-scaled: it sets the others' scale, the search need not.
    w_s: float = field(default=1.0, metadata=tunable(0.25, 4.0, log=True))
    w_q: float = field(default=1e-3, metadata=tunable(1e-5, 0.1, log=True))  # s per in-flight request
    # Weight of the delay this prompt adds to the requests in flight on a prefill engine: see the docstring.
    w_cobatch: float = field(default=1.0, metadata=tunable(0.0, 4.0))
    rho: float = field(default=1.0, metadata=tunable(0.0, 4.0))  # KV pressure's inflation of decode work
    sigma_tight: float = field(default=2.0, metadata=tunable(0.5, 8.0, log=True))  # load amplifier, tight SLO
    sigma_loose: float = field(default=1.0, metadata=tunable(0.25, 4.0, log=True))
    use_output_length: bool = True
    use_kv_pressure: bool = True
    use_slo: bool = True
    use_prompt_length: bool = True
    use_prefix_cache: bool = True
    # Weight of the eviction price: a prompt computed on an engine displaces that many tokens of its cache,
    # each wanted back with the engine's evicted-reuse ratio. See the module docstring; tuned with w_b.
    w_evict: float = field(default=1.16, metadata=tunable(0.0, 4.0))
    fallback_output_tokens: int = 256  # the price of every request when output length is not used
    # Price decode with the calibrated step curve after admission instead of tau_dec x (1 + rho x press):
    # see the module docstring.
    step_curve: bool = False
    # Count a decode engine's KV as its cache holds it: the blocks its streams share once, and of the request
    # only what it does not share with them (the ledger's active blocks): see the module docstring.
    shared_kv: bool = True
    # Price a third path for every request, its decode engine alone, prefilling the prompt in its own steps
    # (no prefill queue, no transfer), and take it where it is cheaper: see the module docstring.
    local_prefill: bool = False
    # Weight of the delay a local prefill adds to each stream running on its decode engine (seconds per
    # second of prefill per stream), as w_cobatch weighs a prefill's delay to its co-batched prompts.
    w_local: float = field(default=1.0, metadata=tunable(0.0, 4.0))
    # The stall a running stream absorbs at little risk to its TPOT target: the streams' price of a local
    # prefill of s seconds is w_local * s * s / (s + stall_tolerance_s) each (0: s each, linear). 0.3 was
    # picked among 0, 0.3, 0.5 and 1 on seeds 20-23, apart from the experiment's (docs/local-prefill.md).
    stall_tolerance_s: float = field(default=0.3, metadata=tunable(0.0, 2.0))

    def __post_init__(self) -> None:
        weights = ("w_b", "w_b_dec", "w_s", "w_q", "w_cobatch", "rho", "w_evict", "w_local")
        for name in (*weights, "stall_tolerance_s"):
            check(getattr(self, name) >= 0, f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("sigma_tight", "sigma_loose"):
            check(getattr(self, name) > 0, f"{name} must be > 0, got {getattr(self, name)}")
        check(
            self.fallback_output_tokens >= 1,
            f"fallback_output_tokens must be >= 1, got {self.fallback_output_tokens}",
        )


class MarginalCost:
    name: ClassVar[str] = "marginal_cost"
    reads_engine_samples: ClassVar[bool] = True

    def __init__(self, params: Params, calibration: Calibration) -> None:
        self.params = params
        # the router has the ledger count active sequences' blocks only for a policy that reads them
        self.reads_active_blocks = params.shared_kv and params.use_prefix_cache
        self.tau_pre_s = calibration.tau_pre_s
        self.tau_dec_s = calibration.tau_dec_s
        self.step = calibration.decode
        self.transfer_s = calibration.transfer_s
        # Calibration.transfer_s's terms, for route() to price a pull without two calls per candidate
        self._pull_latency_s = calibration.transfer.latency_s
        self._pull_bytes_per_token = calibration.kv_bytes_per_token
        self._pull_bytes_per_s = calibration.transfer.bandwidth_bytes_per_s

    def route(self, adm: Admission, view: ClusterView) -> RouteDecision:
        # Params read into locals, and plain loops: a generator or comprehension would turn those locals into
        # slower closure cells. The simulator routes tens of thousands of requests per second. The cost
        # expressions are the module docstring's, in the same float order.
        pr = self.params
        pre = healthy(view.prefill, "prefill")
        dec = healthy(view.decode, "decode")
        if pr.use_slo:
            sigma = pr.sigma_tight if adm.slo_class is SloClass.TIGHT else pr.sigma_loose
        else:
            sigma = 1.0
        prompt = adm.prompt_tokens if pr.use_prompt_length else 0
        o_hat = adm.predicted_output_tokens if pr.use_output_length else pr.fallback_output_tokens
        rho = pr.rho if pr.use_kv_pressure else 0.0
        w_b, w_b_dec, w_q = pr.w_b, pr.w_b_dec, pr.w_q

        tau_pre_s = self.tau_pre_s
        w_s, w_evict, w_cobatch = pr.w_s, pr.w_evict, pr.w_cobatch
        prefix = pr.use_prefix_cache
        costs = []
        for s in pre:
            cached = s.cached_tokens
            compute = prompt - cached if prefix and cached else prompt
            if compute < 0:
                compute = 0
            own_pre_s = w_s * compute * tau_pre_s
            if prefix and s.evicted_reuse_ratio:
                own_pre_s += w_evict * s.evicted_reuse_ratio * compute * tau_pre_s
            per_queued_s = w_q + w_cobatch * compute * tau_pre_s
            costs.append(sigma * (w_b * s.backlog_s + own_pre_s) + per_queued_s * s.in_flight)
        pre_costs = tuple(costs)
        pull = False
        if prefix:
            for s in dec:
                if s.cached_tokens:
                    pull = True
                    break
        sigma_w_s = sigma * w_s
        pull_latency_s, pull_bytes, pull_bytes_per_s = (
            self._pull_latency_s,
            self._pull_bytes_per_token,
            self._pull_bytes_per_s,
        )
        own_dec_s = w_s * o_hat * self.tau_dec_s
        footprint = prompt + o_hat
        shared = self.reads_active_blocks
        local = pr.local_prefill
        stay: list[float] = []  # the decode costs without the pull: a local prefill pulls nothing
        costs = []
        if pr.step_curve:
            own_tokens = w_s * o_hat
            base_s, per_seq_s, per_ctx_s = self.step.base_s, self.step.per_seq_s, self.step.per_ctx_token_s
            for s in dec:
                used, committed = s.kv_used_tokens, s.kv_committed_tokens
                if shared:
                    committed -= s.active_shared_tokens
                kv = (committed if committed > used else used) + footprint
                if shared:
                    kv -= s.active_overlap_tokens
                step_s = base_s + per_seq_s * (s.in_flight + 1) + per_ctx_s * kv
                over = kv - s.kv_capacity_tokens
                cliff = rho * over / s.kv_capacity_tokens if over > 0 else 0.0
                cost = (
                    sigma * (w_b_dec * s.backlog_s + own_tokens * step_s * (1.0 + cliff)) + w_q * s.in_flight
                )
                if local:
                    stay.append(cost)
                if pull:
                    # the seconds to pull the prompt's KV that the candidate lacks: Calibration.transfer_s
                    # written out, the same arithmetic
                    left = prompt - s.cached_tokens
                    if left > 0:
                        cost += sigma_w_s * (pull_latency_s + left * pull_bytes / pull_bytes_per_s)
                costs.append(cost)
        else:
            for s in dec:
                used, committed = s.kv_used_tokens, s.kv_committed_tokens
                if shared:
                    committed -= s.active_shared_tokens
                kv = (committed if committed > used else used) + footprint
                if shared:
                    kv -= s.active_overlap_tokens
                cost = (
                    sigma * (w_b_dec * s.backlog_s + own_dec_s * (1.0 + rho * kv / s.kv_capacity_tokens))
                    + w_q * s.in_flight
                )
                if local:
                    stay.append(cost)
                if pull:
                    # the seconds to pull the prompt's KV that the candidate lacks: Calibration.transfer_s
                    # written out, the same arithmetic
                    left = prompt - s.cached_tokens
                    if left > 0:
                        cost += sigma_w_s * (pull_latency_s + left * pull_bytes / pull_bytes_per_s)
                costs.append(cost)
        dec_costs = tuple(costs)
        p = argmin_rotating(pre_costs, view.seq)
        d = argmin_rotating(dec_costs, view.seq)
        if not local:
            return RouteDecision(pre[p].instance_id, dec[d].instance_id, pre_costs, dec_costs)
        # The remote path's price: the prefill, the decode, and the pull, which dec_costs leave out when no
        # candidate holds any of the prompt (a constant across them then, not across paths).
        remote = pre_costs[p] + dec_costs[d]
        if not pull:
            remote += sigma_w_s * (pull_latency_s + prompt * pull_bytes / pull_bytes_per_s)
        w_local = pr.w_local
        tolerance_s = pr.stall_tolerance_s
        costs = []
        for i in range(len(dec)):
            s = dec[i]
            cached = s.cached_tokens
            compute = prompt - cached if prefix and cached else prompt
            if compute < 0:
                compute = 0
            compute_s = compute * tau_pre_s
            own_s = w_s * compute_s
            if prefix and s.evicted_reuse_ratio:
                own_s += w_evict * s.evicted_reuse_ratio * compute_s
            # behind the local prefills already queued there; every stream there waits out this one
            ahead_s = s.pending_prefill_tokens * tau_pre_s
            stall_s = compute_s * compute_s / (compute_s + tolerance_s) if tolerance_s > 0.0 else compute_s
            costs.append(stay[i] + sigma * (w_b * ahead_s + own_s) + w_local * stall_s * s.in_flight)
        local_costs = tuple(costs)
        k = argmin_rotating(local_costs, view.seq)
        if local_costs[k] < remote:
            return local_decision(dec[k].instance_id, CHEAPER_LOCAL, local_costs)
        return RouteDecision(
            pre[p].instance_id, dec[d].instance_id, pre_costs, dec_costs, False, CHEAPER_REMOTE
        )
