"""The idle perfect-cache ceiling: an upper bound on the goodput of any routing of a list of requests.

For requests (a workload's RequestSpecs) and the engines of a hardware profile, the ceiling is the fraction
of requests that meet their SLO targets when each runs alone, on an idle prefill and decode engine pair, with
every prefix block that an earlier request (in arrival order) named already in the prefill engine's cache.
It is made with the simulator itself, not a formula: one run of a 1P+1D cluster whose KV capacity is
unbounded, routed by round_robin (there is no choice to make), on the requests re-timed so that each
arrives after the one before it has certainly finished. The engines' caches (kvcache/pool.py) then hold
every block named by an earlier request, for nothing is ever evicted. The decode engine's is filled
beforehand with every block that two or more requests name (below).

Why no routing policy, on any cluster of these engines (the profile's curves and limits), beats it in the
simulator's model (sim/prefill.py, sim/decode.py), request by request: whatever is good on a cluster is good
here.

- Admission: a request is refused when prompt + output exceed the engines' limit (min(max_model_len,
  kv_capacity_tokens)); the ceiling keeps that limit as its model length, so it refuses the same requests,
  and they count as not good (``inadmissible`` counts them; ``admissible_goodput`` leaves them out).
- Prefill hits are at most what earlier requests named. A prefill engine looks a prompt up in its cache when
  it first schedules it, and schedules its queue first come first served (the head waits for KV rather than
  being overtaken); a request joins an engine's queue when it arrives. So whatever its engine holds when it
  is looked up was cached by requests that arrived before it (named by them), and maybe since evicted.
  Here every such block is held.
- Prefill time grows with the uncached tokens. A prompt of P tokens with C cached costs, summed over its
  chunks, iterations x base + per_token x (P - C) + attn x (P^2 - C^2) / 2 (the attention term telescopes
  over any chunking), and at least ceil((P - C) / max_batched_tokens) iterations; on a cluster the
  iterations it shares also carry other prompts' tokens, and it waits for the queue and for KV. Alone with
  the most hits, it pays the least.
- The pull to the decode engine costs latency + bytes / bandwidth for the prompt past the decode engine's own
  hit. On a cluster that hit may hold blocks a *later* request named (one that overtook it, on a faster
  prefill engine or while its own long prompt was still being chunked, and was pulled to the same decode
  engine first), but only blocks another request named: a decode engine caches what it pulled. So here the
  decode engine holds every block two or more admissible requests name: the most a request could hit there.
- Decode steps take base + per_seq x batch + per_ctx_token x (context in the batch): alone, the batch is one
  and the context its own, the least any step can cost; on a cluster it also waits for a step boundary,
  for KV, and may be preempted and recomputed. With unbounded KV nothing waits or is preempted here.

- A request its decode engine prefills itself (RouteDecision.local, a path every policy may take) pays no
  pull and no prefill iteration's base: its prompt past the decode engine's hit is computed in that engine's
  steps (sim/decode.py), beside whatever else runs there. So each request also runs alone *locally*, on a
  decode engine whose cache holds every block two or more admissible requests name, answers' blocks
  (RequestSpec.answer_blocks) counted with prompts': the most a decode engine could hold of it. The ceiling
  keeps, request by request, the better of the two paths (the lower TTFT; TPOT is the same alone).

So TTFT and TPOT are each at their least here, and the targets are the request's own (its class and prompt).
The ceiling is loose, not a prediction of what a router reaches: every request gets an idle engine pair and
the best cache, together, which no cluster under load gives them all.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from calroute.costmodel.profiles import HardwareProfile
from calroute.experiments.kit.paths import portable_workload
from calroute.kvcache.pool import RequestBlocks
from calroute.results.metrics import SummaryAccumulator
from calroute.results.records import RequestRecord
from calroute.routing.build import build_router
from calroute.routing.ledger import Ledger
from calroute.routing.seeds import RouterSeeds
from calroute.sim.simulator import ClusterShape, ClusterSim
from calroute.types import RequestSpec, RequestStatus
from calroute.workload.source import workload_source

# KV capacity of the ceiling's engines, in tokens: more than any run's requests could fill.
UNBOUNDED_KV_TOKENS = 10**12
SHAPE = ClusterShape(1, 1)
LOCAL_SHAPE = ClusterShape(0, 1)  # the local path: a decode engine alone
LABEL = "ceiling"
# What a kept ceiling was computed by: changed with the ceiling's construction, so none computed otherwise is
# reused (/2: the decode engine held every block two requests name; /3: the local path too).
MODEL = "idle-perfect-cache/3"


@dataclass(frozen=True)
class Ceiling:
    requests: int
    goodput: float  # good requests over all of them
    admissible_goodput: float  # good requests over those an engine could take
    inadmissible: int  # requests past the engines' length limit (or malformed): no engine takes them


def ceiling_profile(profile: HardwareProfile) -> HardwareProfile:
    """The profile's engines with unbounded KV, refusing what the profile's engines refuse: their limit on a
    request's length, min(max_model_len, kv_capacity_tokens), becomes the model length."""
    lim = profile.limits
    return replace(
        profile,
        limits=replace(lim, kv_capacity_tokens=UNBOUNDED_KV_TOKENS, max_model_len=lim.max_request_tokens),
    )


def _admissible(r: RequestSpec, limit: int) -> bool:
    # as ClusterSim admits (sim/simulator.py)
    return r.prompt_tokens >= 1 and r.output_tokens >= 1 and r.prompt_tokens + r.output_tokens <= limit


def alone_s(profile: HardwareProfile, r: RequestSpec) -> float:
    """More than request ``r`` takes alone on an idle engine pair of ``profile``, from arrival to last token:
    its prefill with nothing cached, its whole prompt pulled, and every decode step at its last step's
    context (the curves' terms are all >= 0)."""
    cal = profile.calibration
    pre, dec = cal.prefill, cal.decode
    p, o = r.prompt_tokens, r.output_tokens
    iterations = math.ceil(p / profile.limits.max_batched_tokens)
    prefill_s = iterations * pre.base_s + pre.per_token_s * p + pre.attn_s_per_token2 * p * p / 2
    decode_s = o * dec.step_s(1, p + o)
    return prefill_s + cal.transfer_s(p) + decode_s


def one_at_a_time(profile: HardwareProfile, requests: Sequence[RequestSpec]) -> list[RequestSpec]:
    """The requests in their order, each arriving after the one before it has certainly finished: spaced by
    twice ``alone_s`` and a second (the run checks that none overlapped)."""
    out = []
    t = 0.0
    for r in requests:
        out.append(r._replace(arrival_s=t))
        t += 2 * alone_s(profile, r) + 1.0
    return out


def perfect_cache_ceiling(
    profile: HardwareProfile,
    requests: Sequence[RequestSpec],
    on_record: Callable[[RequestRecord], None] | None = None,
    paths: tuple[str, ...] = ("remote", "local"),
) -> Ceiling:
    """The idle perfect-cache ceiling of ``requests`` (sorted by arrival) on ``profile``'s engines, judged by
    its calibration's SLO targets (the caller's: a profile with the run's SLO spec applied). ``on_record``
    sees, request by request, the record of the better path (its arrival re-timed); ``paths``: the paths
    tried, the remote one (a prefill engine, then a pull) and the local one (the decode engine alone)."""
    hw = ceiling_profile(profile)
    timed = one_at_a_time(profile, requests)
    runs = []
    if "remote" in paths:
        runs.append(_alone(hw, SHAPE, "round_robin", timed, [r.prefix_blocks for r in timed]))
    if "local" in paths:
        # answers' blocks count as named by their request: an engine that decoded one holds them
        chains = [r.prefix_blocks + r.answer_blocks for r in timed]
        runs.append(_alone(hw, LOCAL_SHAPE, "aggregated", timed, chains))
    if not runs:
        raise ValueError(f"paths must name remote, local or both, got {paths!r}")
    acc = SummaryAccumulator(hw.calibration.slo)
    for r in timed:
        best = min((run[r.request_id] for run in runs), key=_ttft_or_inf)
        acc.add(best)
        if on_record is not None:
            on_record(best)
    s = acc.summary()
    return Ceiling(s.requests, s.goodput, s.admissible_goodput, s.inadmissible)


def _ttft_or_inf(rec: RequestRecord) -> float:
    return rec.ttft_s if rec.status is RequestStatus.OK and rec.ttft_s is not None else math.inf


def _alone(
    hw: HardwareProfile,
    shape: ClusterShape,
    policy: str,
    timed: list[RequestSpec],
    named_by: list[tuple[int, ...]],
) -> dict[str, RequestRecord]:
    """Each of the ``timed`` requests alone on ``shape`` (routed by ``policy``: no choice to make), its decode
    engine's cache holding every block that two or more admissible requests name (``named_by``, in order)."""
    limit = hw.limits.max_request_tokens
    instances = shape.instances(hw.limits.kv_capacity_tokens)
    router = build_router(
        policy,
        {},
        hw.calibration,
        Ledger(instances, hw.calibration),
        seeds=RouterSeeds.of_run(0),
    )
    sim = ClusterSim(hw, shape, router, LABEL)
    # The decode engine holds every block two or more admissible requests name: the most any request could hit
    # there. A block id stands for its prefix, so the blocks of a prompt that another one names too lead it.
    chains = [c for r, c in zip(timed, named_by, strict=True) if c and _admissible(r, limit)]
    named = Counter(b for c in chains for b in set(c))
    for dec in sim.decode.values():
        pool = dec.pool
        for chain in chains:
            n = 0
            while n < len(chain) and named[chain[n]] > 1:
                n += 1
            if n:
                rb = RequestBlocks()
                pool.admit(rb, chain, 0, n * pool.block_tokens, n * pool.block_tokens)
                pool.cache(rb, chain, n)
                pool.free(rb)
    records: dict[str, RequestRecord] = {}
    sim.run(timed, lambda rec: records.__setitem__(rec.request_id, rec))
    for before, after in zip(timed, timed[1:], strict=False):
        end = records[before.request_id].last_token_s
        if end is not None and end >= after.arrival_s:
            raise RuntimeError(
                f"ceiling: request {before.request_id!r} still ran when {after.request_id!r} arrived "
                f"({end:.3f} s >= {after.arrival_s:.3f} s): the spacing (one_at_a_time) is too short"
            )
    return records


def run_ceiling(
    profile: HardwareProfile,
    workload: str,
    requests: int,
    rate_rps: float,
    seed: int,
    trace_windows: int = 1,
) -> Ceiling:
    """The ceiling of one simulated run's requests: the trace the simulator backend replays for this workload,
    request count, rate and seed (sim_backend.run_sim), judged by ``profile``'s SLO targets."""
    source = workload_source(portable_workload(workload), requests, trace_windows=trace_windows)
    return perfect_cache_ceiling(profile, source.requests(rate_rps, seed))
