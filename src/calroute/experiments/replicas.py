"""More than one router (issue 38): what N routers, each with its own ledger and prefix index, lose against
one, with and without sharing their bookings, and what the herd mitigation recovers (sim/replicas.py,
sim/herd.py, docs/replicas.md). The simulator only: a live backend would run its variants as one router.

Each workload (mixed-bursty, shared-prefix, multi-turn) and policy (marginal_cost, and Dynamo's block cost
kv_overlap_cost as the peer) is one cell on 2P+4D, at the rate where one router with that policy crosses
0.85 goodput on the run's own seeds (its approximate prefix source: the runner's search). Its variants:
N in {1, 2, 4, 8} routers behind a round-robin balancer, alone (no sharing) or sharing their bookings
``SHARE_DELAY_S`` late, on both prefix sources (approximate: each router's own placements; precise: every
engine's KV events; mixed-bursty shares no prefix, so one source); each with the herd mitigation
(NearBest, ``NEAR_BEST`` of the spread) beside it; on the prefix workloads the session-affinity and random
balancers at N = 4; and a share-delay sweep at N = 4.

The report gives, per cell and source, every N's goodput and P99 TTFT and their paired differences to
N = 1 (interval, median of the per-seed differences, verdict: a loss only where the interval excludes zero
and the median agrees); the herd (of the pairs of admissions less than one share delay apart, the share that
picked the same decode engine, across routers and within one); the mitigation's paired effect; the
balancers' and the delays'.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from calroute.experiments.kit.cells import Cell, CellResult
from calroute.experiments.kit.report import fmt
from calroute.experiments.kit.sim_backend import ReplicaVariant, group_stats_path
from calroute.experiments.prefix import COLLAPSED, verdict
from calroute.report import plots
from calroute.results.stats import paired_difference
from calroute.sim.replicas import GroupStats

WORKLOADS = ("mixed-bursty", "shared-prefix", "multi-turn")
POLICIES = ("marginal_cost", "kv_overlap_cost")
ROUTERS = (1, 2, 4, 8)
SOURCES = ("approximate", "precise")
# A booking's way to the other replicas over a broker (NATS, ZMQ): about the engines' KV events' delay.
SHARE_DELAY_S = 0.01
DELAYS_S = (0.0, 0.001, 0.05)  # the sweep at N = 4, beside SHARE_DELAY_S
NEAR_BEST = 0.3  # NearBest's tolerance: the lower 30 % of the candidates' spread of scores
SWEEP_ROUTERS = 4
HERD_COUNTS = (
    "cross_pairs",
    "cross_same_decode",
    "cross_same_prefill",
    "own_pairs",
    "own_same_decode",
    "own_same_prefill",
)


def label(
    policy: str,
    source: str,
    routers: int,
    shared: bool = False,
    near_best: bool = False,
    balancer: str = "round_robin",
    delay_s: float = SHARE_DELAY_S,
) -> str:
    parts = [policy, source, f"N{routers}"]
    if routers > 1:
        parts.append("shared" if shared else "alone")
        if shared and delay_s != SHARE_DELAY_S:
            parts.append(f"{1e3 * delay_s:g}ms")
    if balancer != "round_robin":
        parts.append(balancer)
    if near_best:
        parts.append("near_best")
    return "-".join(parts)


def _variant(
    policy: str,
    source: str,
    routers: int,
    shared: bool = False,
    near_best: bool = False,
    balancer: str = "round_robin",
    delay_s: float = SHARE_DELAY_S,
) -> ReplicaVariant:
    return ReplicaVariant(
        label(policy, source, routers, shared, near_best, balancer, delay_s),
        policy,
        routers=routers,
        balancer=balancer,
        share_delay_s=delay_s if shared and routers > 1 else None,
        near_best=NEAR_BEST if near_best else None,
        prefix_source=source,
    )


def variants(policy: str, sources: tuple[str, ...], quick: bool) -> tuple[ReplicaVariant, ...]:
    counts = ROUTERS[:2] if quick else ROUTERS
    out = []
    for source in sources:
        for near in (False, True):
            for n in counts:
                for shared in (False, True) if n > 1 else (False,):
                    out.append(_variant(policy, source, n, shared, near))
        n = counts[-1] if quick else SWEEP_ROUTERS
        if len(sources) > 1:  # prompts with blocks: where a session balancer has something to go by
            balancers = ("session",) if quick else ("session", "random")
            out += [_variant(policy, source, n, False, balancer=b) for b in balancers]
            if not quick:
                out.append(_variant(policy, source, n, True, balancer="session"))
        if not quick and source == sources[-1]:  # the delays on the source the engines publish
            out += [_variant(policy, source, n, True, delay_s=d) for d in DELAYS_S]
    return tuple(out)


def sources_of(workload: str) -> tuple[str, ...]:
    # without block ids there is no prefix index: the two sources would be the same runs
    return ("approximate",) if workload == "mixed-bursty" else SOURCES


class Replicas:
    name = "replicas"
    title = "N routers: what each router's own ledger and prefix index lose against one router, 2P+4D"

    def cells(self, quick: bool) -> list[Cell]:
        workloads = ("shared-prefix",) if quick else WORKLOADS
        policies = POLICIES[:1] if quick else POLICIES
        return [
            Cell(
                f"{workload}-{policy}",
                2,
                4,
                workload,
                variants(policy, sources_of(workload), quick),
                saturate_on=(policy,),
                tags={"workload": workload, "policy": policy, "sources": list(sources_of(workload))},
                saturate_on_run_seeds=True,
            )
            for workload in workloads
            for policy in policies
        ]

    def report(self, results: list[CellResult], exp_dir: Path) -> str:
        herd = herd_stats(results, exp_dir)
        parts = [f"## {self.title}\n", _intro(), _summary(results)]
        for c in results:
            parts.append(f"\n### {c.tags['workload']}, {c.tags['policy']} ({c.rate_rps:.2f} req/s)\n")
            parts.append(_cell_table(c, herd.get(c.cell_key, {}), exp_dir))
            parts.append(_mitigation_table(c, herd.get(c.cell_key, {})))
            parts.append(_others_table(c))
        return "\n".join(parts) + "\n"


def _intro() -> str:
    return (
        "Goodput differences in points against one router (N1) on the same source, paired by seed (one "
        "arrival trace); a loss only where the 95 % interval excludes zero and the median of the per-seed "
        "differences agrees. Alone: each router knows its own bookings only; shared: every router's "
        "admissions, prefill completions, first tokens and completions reach the others' ledgers "
        f"{1e3 * SHARE_DELAY_S:g} ms later (a prefix index is never shared: approximate is each router's own "
        "placements, precise every engine's KV events). Herd: of the pairs of admissions less than one share "
        "delay apart, the share that picked the same decode engine, made by two routers / by one (chance: 1 "
        f"in 4). near_best: each router draws each pool's engine among the candidates in the lowest "
        f"{100 * NEAR_BEST:.0f} % of the spread of the policy's scores (sim/herd.py). The rate is one "
        "router's saturation on the approximate source; the precise source runs at the same rate.\n"
    )


def _runs(c: CellResult, lab: str) -> list[Any]:
    return sorted((r for r in c.runs if r.label == lab), key=lambda r: r.seed)


def _versus(c: CellResult, lab: str, base: str) -> tuple[str, str]:
    ours, theirs = c.goodputs(lab), c.goodputs(base)
    if lab == base or not ours or len(ours) != len(theirs):
        return "-", ""
    word, _, median, d = verdict(ours, theirs)
    return f"{d.mean:+.1f} [{d.low:+.1f}, {d.high:+.1f}] ({median:+.1f}) n={d.n}", word


def _ttft_versus(c: CellResult, lab: str, base: str) -> str:
    """P99 TTFT of ``lab`` minus ``base``'s, in ms, paired by seed: mean [95 %] (median)."""
    ours = {r.seed: r.summary.ttft_p99_s for r in _runs(c, lab)}
    theirs = {r.seed: r.summary.ttft_p99_s for r in _runs(c, base)}
    seeds = [s for s in sorted(ours.keys() & theirs.keys()) if ours[s] is not None and theirs[s] is not None]
    if lab == base or not seeds:
        return "-"
    a = [1e3 * float(ours[s] or 0.0) for s in seeds]
    b = [1e3 * float(theirs[s] or 0.0) for s in seeds]
    d = paired_difference(a, b)
    median = statistics.median(x - y for x, y in zip(a, b, strict=True))
    return f"{d.mean:+.0f} [{d.low:+.0f}, {d.high:+.0f}] ({median:+.0f})"


def _p99_ttft(c: CellResult, lab: str) -> float | None:
    values = [r.summary.ttft_p99_s for r in _runs(c, lab) if r.summary.ttft_p99_s is not None]
    return statistics.fmean(values) if values else None


def _summary(results: list[CellResult]) -> str:
    rows = [
        "| workload | policy | source | N1 goodput | N4 alone - N1 | verdict | N4 shared - N1 | verdict "
        "| N8 alone - N1 | N8 shared - N1 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in results:
        for source in c.tags.get("sources", SOURCES):
            policy = c.tags["policy"]
            base = label(policy, source, 1)
            if base not in c.labels():
                continue
            n4a = _versus(c, label(policy, source, 4), base)
            n4s = _versus(c, label(policy, source, 4, True), base)
            n8a = _versus(c, label(policy, source, 8), base)
            n8s = _versus(c, label(policy, source, 8, True), base)
            rows.append(
                f"| {c.tags['workload']} | {policy} | {source} | {fmt(c.mean_goodput(base))} "
                f"| {n4a[0]} | {n4a[1]} | {n4s[0]} | {n4s[1]} | {n8a[0]} {n8a[1]} | {n8s[0]} {n8s[1]} |"
            )
    return "\n### Summary: N routers against one\n\n" + "\n".join(rows) + "\n"


def _herd_cell(stats: dict[str, Any] | None) -> str:
    if not stats:
        return "-"
    cross = stats["cross_same_decode"] / stats["cross_pairs"] if stats["cross_pairs"] else None
    own = stats["own_same_decode"] / stats["own_pairs"] if stats["own_pairs"] else None
    return f"{fmt(cross, 2)} / {fmt(own, 2)}"


def _cell_table(c: CellResult, herd: dict[str, Any], exp_dir: Path) -> str:
    policy = c.tags["policy"]
    rows = [
        "| source | N | sharing | goodput mean (median) | collapsed | P99 TTFT (s) "
        "| goodput - N1: mean [95 %] (median) | verdict | P99 TTFT - N1 (ms) | herd: across / within |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    counts = [n for n in ROUTERS if any(label(policy, s, n) in c.labels() for s in SOURCES)]
    lines: dict[str, list[float]] = {}
    for source in c.tags.get("sources", SOURCES):
        base = label(policy, source, 1)
        for shared in (False, True):
            labs = [label(policy, source, n, shared) for n in counts]
            if all(lab in c.labels() for lab in labs):
                lines[f"{source}, {'shared' if shared else 'alone'}"] = [c.mean_goodput(lab) for lab in labs]
        for n in counts:
            for shared in (False, True) if n > 1 else (False,):
                lab = label(policy, source, n, shared)
                if lab not in c.labels():
                    continue
                g = c.goodputs(lab)
                word = _versus(c, lab, base)
                rows.append(
                    f"| {source} | {n} | {'shared' if shared else ('-' if n == 1 else 'alone')} "
                    f"| {fmt(statistics.fmean(g))} ({fmt(statistics.median(g))}) "
                    f"| {sum(x < COLLAPSED for x in g)} | {fmt(_p99_ttft(c, lab), 2)} "
                    f"| {word[0]} | {word[1]} | {_ttft_versus(c, lab, base)} | {_herd_cell(herd.get(lab))} |"
                )
    png = plots.lines(
        exp_dir / f"{c.cell_key}-routers.png",
        counts,
        lines,
        "routers",
        "goodput",
        f"{c.cell_key}: goodput against the number of routers",
        hline=0.85,
    )
    return "\n".join(rows) + f"\n\n![{png}](replicas/{png})\n"


def _mitigation_table(c: CellResult, herd: dict[str, Any]) -> str:
    policy = c.tags["policy"]
    rows = [
        "| source | N | sharing | near_best - plain: mean [95 %] (median) | verdict | herd plain "
        "| herd near_best |",
        "|---|---|---|---|---|---|---|",
    ]
    for source in c.tags.get("sources", SOURCES):
        for n in ROUTERS:
            for shared in (False, True) if n > 1 else (False,):
                plain, near = label(policy, source, n, shared), label(policy, source, n, shared, True)
                if near not in c.labels():
                    continue
                word = _versus(c, near, plain)
                rows.append(
                    f"| {source} | {n} | {'shared' if shared else '-'} | {word[0]} | {word[1]} "
                    f"| {_herd_cell(herd.get(plain))} | {_herd_cell(herd.get(near))} |"
                )
    head = "\nThe herd's mitigation (near_best) against the same routers without it:\n\n"
    return head + "\n".join(rows) + "\n"


def _others_table(c: CellResult) -> str:
    """The balancers and the share delays, against round-robin routers sharing at SHARE_DELAY_S."""
    policy = c.tags["policy"]
    rows = [
        "| variant | goodput mean | - the round-robin routers: mean [95 %] (median) | verdict |",
        "|---|---|---|---|",
    ]
    for source in c.tags.get("sources", SOURCES):
        for lab in c.labels():
            if not lab.startswith(f"{policy}-{source}-") or lab.endswith("near_best"):
                continue
            parts = lab.removeprefix(f"{policy}-{source}-").split("-")
            if len(parts) < 3:
                continue
            base = label(policy, source, int(parts[0][1:]), parts[1] == "shared")
            word = _versus(c, lab, base)
            rows.append(f"| {lab} | {fmt(c.mean_goodput(lab))} | {word[0]} | {word[1]} |")
    if len(rows) == 2:
        return ""
    head = (
        "\nBalancers (session: a prompt's first block picks its router; random) and share delays, against "
        f"round-robin routers alike otherwise (sharing at {1e3 * SHARE_DELAY_S:g} ms):\n\n"
    )
    return head + "\n".join(rows) + "\n"


def herd_stats(results: list[CellResult], exp_dir: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """Per cell and variant, the herd's counts summed over the seeds, from the runs' GroupStats beside their
    records (sim_backend.run_sim); kept in ``herd.json`` so that a report made without the records (copied
    results) still has them."""
    store = exp_dir / "herd.json"
    saved: dict[str, dict[str, dict[str, Any]]] = json.loads(store.read_text()) if store.exists() else {}
    changed = False
    for c in results:
        cell = saved.setdefault(c.cell_key, {})
        for lab in c.labels():
            runs = _runs(c, lab)
            paths = [
                group_stats_path(exp_dir / "records" / c.cell_key / f"{lab}-seed{r.seed}.jsonl") for r in runs
            ]
            if not all(p.exists() for p in paths):
                continue  # one router (no GroupStats), or the records are gone: what herd.json kept
            stats = [GroupStats.from_dict(json.loads(p.read_text())).herd for p in paths]
            totals: dict[str, Any] = {"window_s": stats[0].window_s, "seeds": [r.seed for r in runs]}
            for key in HERD_COUNTS:
                totals[key] = sum(getattr(h, key) for h in stats)
            if cell.get(lab) != totals:
                cell[lab] = totals
                changed = True
    if changed:
        store.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    return saved
