"""The phases: unloaded, the sustainable-rate ramp, the added TTFT at a fixed rate."""

from __future__ import annotations

import asyncio
import json
import math
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.overhead.bench import Bench
from benchmarks.overhead.client import (
    Outcome,
    as_columns,
    new_session,
    proxy_late_timers,
    run_schedule,
    run_sequential,
)
from benchmarks.overhead.cpu import cores_text, cpu_summary
from benchmarks.overhead.method import (
    ACHIEVED_MIN,
    BOOTSTRAP_SAMPLES,
    COARSE_FACTOR,
    FINE_FACTOR,
    LAG_LIMIT_S,
    LOOP_LATE_S,
    MAX_RATE,
    MAX_REDO,
    ROUND_OTHERS_LIMIT_CORES,
    ROUND_OTHERS_PEAK_LIMIT_CORES,
    START_RATE,
    STEP_OTHERS_LIMIT_CORES,
    STEP_OTHERS_PEAK_LIMIT_CORES,
    WARMUP_S,
    T,
)
from benchmarks.overhead.stats import added_ttft, errors_of, ok_ttfts, pct
from calroute import aio
from calroute.results.stats import bootstrap_quantile_diff
from calroute.workload.arrivals import poisson_arrivals, poisson_arrivals_within


def rotated(items: list[T], k: int) -> list[T]:
    return items[k % len(items) :] + items[: k % len(items)]


def unloaded(bench: Bench, modes: list[str], requests: int, rounds: int) -> dict[str, dict[str, Any]]:
    """Sequential requests (one at a time), in rounds with the mode order rotated."""
    per_round = max(1, requests // rounds)
    outs: dict[str, list[Outcome]] = {m: [] for m in modes}

    async def one(mode: str) -> list[Outcome]:
        with bench.serving(mode) as target:
            async with new_session() as s:
                return (await run_sequential(s, target, per_round + 2, bench.salts))[2:]  # 2 warm-ups

    for k in range(rounds):
        for mode in rotated(modes, k):
            outs[mode] += aio.run(one(mode))
    res = {}
    for mode in modes:
        t = ok_ttfts(outs[mode])
        e2e = [o.done_s - o.scheduled_s for o in outs[mode] if o.error is None]
        res[mode] = {
            "requests": len(outs[mode]),
            "errors": len(errors_of(outs[mode])),
            "first_errors": errors_of(outs[mode])[:3],
            "ttft_p50_ms": pct(t, 50) * 1e3,
            "ttft_p90_ms": pct(t, 90) * 1e3,
            "ttft_p99_ms": pct(t, 99) * 1e3,
            "e2e_p50_ms": pct(e2e, 50) * 1e3,
        }
        if mode != "direct":
            base = ok_ttfts(outs["direct"])
            brng = np.random.default_rng(0)
            for q in (50, 99):
                res[mode][f"added_p{q}_ms"] = (pct(t, q) - pct(base, q)) * 1e3
                lo, hi = bootstrap_quantile_diff(t, base, q, brng, samples=BOOTSTRAP_SAMPLES)
                res[mode][f"added_p{q}_ci95_ms"] = [lo * 1e3, hi * 1e3]
    return res


def summarize_step(
    outs: list[Outcome], t0: float, rate: float, duration_s: float, e2e0_s: float, bound_s: float
) -> dict[str, Any]:
    errs = errors_of(outs)
    done = [o for o in outs if o.error is None]
    t = ok_ttfts(outs)
    last = max((o.done_s for o in done), default=t0)
    span = max(duration_s, last - t0 - e2e0_s)
    offered = len(outs) / duration_s
    achieved = len(done) / span
    p99 = pct(t, 99)
    reasons = []
    if errs:
        reasons.append(f"{len(errs)} errors (first: {errs[0]})")
    if achieved < ACHIEVED_MIN * offered:
        reasons.append(f"achieved {achieved:.1f} < {ACHIEVED_MIN:.0%} of offered {offered:.1f}")
    if not p99 < bound_s:
        reasons.append(f"p99 TTFT {p99 * 1e3:.0f} ms over the {bound_s * 1e3:.0f} ms bound")
    return {
        "rate": rate,
        "requests": len(outs),
        "offered_rps": offered,
        "achieved_rps": achieved,
        "errors": len(errs),
        "ttft_p50_ms": pct(t, 50) * 1e3,
        "ttft_p99_ms": p99 * 1e3,
        "send_lag_p99_ms": pct([o.sent_s - o.scheduled_s for o in outs], 99) * 1e3,
        "sustained": not reasons,
        "why_not": "; ".join(reasons),
    }


@dataclass
class RampState:
    """One mode's search for its highest sustained rate."""

    mode: str
    rate: float = START_RATE
    factor: float = COARSE_FACTOR
    best: float | None = None
    failed_at: float = math.inf
    retrying: bool = False
    done: bool = False
    steps: list[dict[str, Any]] = field(default_factory=list)
    redos: int = 0  # disturbed runs of the current step
    disturbed: list[dict[str, Any]] = field(default_factory=list)

    def record(self, res: dict[str, Any]) -> None:
        res["retry"] = self.retrying
        self.steps.append(res)
        if res["sustained"]:
            self.best, self.retrying = self.rate, False
            self.rate *= self.factor
        elif not self.retrying:
            self.retrying = True  # once more at the same rate: one bad step on a shared VM may be noise
            return
        else:
            self.retrying = False
            self.failed_at = min(self.failed_at, self.rate)
            if self.factor == COARSE_FACTOR and self.best is not None:
                self.factor = FINE_FACTOR
                self.rate = self.best * self.factor
            else:
                self.done = True
        if self.rate > MAX_RATE or self.rate >= self.failed_at * 0.999:
            self.done = True


def step_arrivals(seed: int, rate: float, duration_s: float, retry: bool) -> list[float]:
    """A ramp step's arrival schedule: the same for every mode at a given rate and try (common random
    numbers). Near saturation, p99 TTFT depends on the arrivals' bursts more than on anything else, so
    with a schedule of its own each mode's last steps were a draw of its own luck."""
    rng = np.random.default_rng([seed, round(rate * 1e3), int(retry)])
    return [float(t) for t in poisson_arrivals_within(rate, duration_s, rng)]


def ramp(
    bench: Bench, modes: list[str], duration_s: float, e2e0_s: dict[str, float], bound_s: float, seed: int
) -> dict[str, dict[str, Any]]:
    """Every mode's rate search, interleaved: each round runs the next step of every mode not yet done,
    each step with its proxy started afresh, so slow drifts in the machine's load hit all modes alike."""
    states = [RampState(m) for m in modes]
    warnings = {m: 0 for m in modes}

    async def step(st: RampState) -> dict[str, Any]:
        arrivals = step_arrivals(seed, st.rate, duration_s, st.retrying)
        with bench.serving(st.mode) as target:
            async with new_session() as s:  # the proxy's first requests, and ours, are not measured
                await run_sequential(s, target, 3, bench.salts)
            meter = bench.meter(target)
            async with new_session() as s:
                meter.start()
                outs, t0 = await run_schedule(s, target, arrivals, bench.salts)
                used = meter.stop()
        res = summarize_step(outs, t0, st.rate, duration_s, e2e0_s[st.mode], bound_s)
        res["cpu"] = cpu_summary(used, len(outs)) | {"others_peak_cores": meter.others_peak_cores}
        await asyncio.sleep(0.5)
        return res

    k = 0
    while not all(st.done for st in states):
        for st in rotated(states, k):
            if st.done:
                continue
            before = bench.handoff_warnings()
            res = aio.run(step(st))
            warnings[st.mode] += bench.handoff_warnings() - before
            disturbed = (
                not res["sustained"]
                and (
                    res["cpu"]["others_cores"] > STEP_OTHERS_LIMIT_CORES
                    or res["cpu"]["others_peak_cores"] > STEP_OTHERS_PEAK_LIMIT_CORES
                )
                and st.redos < MAX_REDO
            )
            note = " (disturbed: run again)" if disturbed else " (retry)" if st.retrying else ""
            print(f"  {st.mode:>11} {_step_line(res)}{note}", file=sys.stderr, flush=True)
            if disturbed:
                st.redos += 1
                st.disturbed.append(res)
            else:
                st.redos = 0
                st.record(res)
        k += 1
    return {
        st.mode: {
            "steps": st.steps,
            "sustained_rps": st.best,
            "handoff_warnings": warnings[st.mode],
            "disturbed_steps_set_aside": st.disturbed,
        }
        for st in states
    }


def _step_line(r: dict[str, Any]) -> str:
    return (
        f"rate {r['rate']:7.1f}: offered {r['offered_rps']:7.1f} achieved {r['achieved_rps']:7.1f} "
        f"p50 {r['ttft_p50_ms']:7.1f} p99 {r['ttft_p99_ms']:7.1f} ms lag99 {r['send_lag_p99_ms']:6.1f} ms "
        f"cores e/p/c/o {cores_text(r['cpu'])} "
        f"{'ok' if r['sustained'] else 'FAIL ' + r['why_not']}"
    )


def fixed_rate(
    bench: Bench, modes: list[str], rate: float, requests: int, rounds: int, seed: int
) -> dict[str, Any]:
    """TTFT of each mode at one rate, interleaved in rounds; added p50/p99 against ``direct``.

    Every mode gets the same arrival schedule in a round (common random numbers), so request i of a
    mode and request i of ``direct`` make a pair; the added-TTFT interval resamples those pairs."""
    rng = np.random.default_rng([seed, 1])  # a stream of its own: the intervals below draw from ``seed``
    per_round = max(1, requests // rounds)
    schedules = [
        (
            poisson_arrivals_within(rate, WARMUP_S, rng).tolist(),
            poisson_arrivals(rate, per_round, rng).tolist(),
        )
        for _ in range(rounds)
    ]
    outs: dict[str, list[list[Outcome]]] = {m: [] for m in modes}
    warnings: dict[str, int] = {m: 0 for m in modes}
    cpu: dict[str, dict[str, float]] = {m: {} for m in modes}
    set_aside: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    round_stats: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}

    async def one(mode: str, k: int) -> tuple[list[Outcome], dict[str, float], float, float | None]:
        warmup, arrivals = schedules[k]
        with bench.serving(mode) as target:
            meter = bench.meter(target)
            async with new_session() as s:
                await run_schedule(s, target, warmup, bench.salts)
                late0 = await proxy_late_timers(s, target, LOOP_LATE_S)
                meter.start()
                got, _ = await run_schedule(s, target, arrivals, bench.salts)
                used = meter.stop()
                late1 = await proxy_late_timers(s, target, LOOP_LATE_S)
        await asyncio.sleep(0.5)
        late = None if late0 is None or late1 is None else late1 - late0
        return got, used, meter.others_peak_cores, late

    for k in range(rounds):
        for mode in rotated(modes, k):
            for attempt in range(MAX_REDO + 1):
                before = bench.handoff_warnings()
                got, used, peak, late = aio.run(one(mode, k))
                warnings[mode] += bench.handoff_warnings() - before
                others = cpu_summary(used, len(got))["others_cores"]
                lag = pct([o.sent_s - o.scheduled_s for o in got], 99)
                t = ok_ttfts(got)
                line = (
                    f"  rate {rate:.1f} round {k + 1}/{rounds} {mode}: p50 {pct(t, 50) * 1e3:.1f} "
                    f"p99 {pct(t, 99) * 1e3:.1f} ms, lag99 {lag * 1e3:.1f} ms, others {others:.2f} cores "
                    f"(peak {peak:.2f})" + ("" if late is None else f", proxy loop late > 20 ms {late:.0f}")
                )
                disturbed = (
                    others > ROUND_OTHERS_LIMIT_CORES
                    or peak > ROUND_OTHERS_PEAK_LIMIT_CORES
                    or lag > LAG_LIMIT_S
                )
                again = disturbed and attempt < MAX_REDO
                with (bench.log_dir / "requests.jsonl").open("a") as log:
                    head = {"rate": rate, "round": k + 1, "mode": mode, "attempt": attempt + 1}
                    head |= {"others_cores": others, "others_peak_cores": peak, "proxy_loop_late": late}
                    head |= {"disturbed": disturbed, "counted": not again}
                    log.write(json.dumps(head | as_columns(got)) + "\n")
                if again:
                    print(line + " (disturbed: run again)", file=sys.stderr, flush=True)
                    set_aside[mode].append(
                        {
                            "round": k + 1,
                            "others_cores": others,
                            "others_peak_cores": peak,
                            "send_lag_p99_ms": lag * 1e3,
                            "ttft_p50_ms": pct(t, 50) * 1e3,
                            "ttft_p99_ms": pct(t, 99) * 1e3,
                        }
                    )
                    continue
                print(line + (" (disturbed: left out)" if disturbed else ""), file=sys.stderr, flush=True)
                outs[mode].append(got)
                round_stats[mode].append(
                    {
                        "round": k + 1,
                        "ttft_p50_ms": pct(t, 50) * 1e3,
                        "ttft_p99_ms": pct(t, 99) * 1e3,
                        "send_lag_p99_ms": lag * 1e3,
                        "others_cores": others,
                        "others_peak_cores": peak,
                        "proxy_loop_late": late,
                        "disturbed": disturbed,
                    }
                )
                for key, v in used.items():
                    cpu[mode][key] = cpu[mode].get(key, 0.0) + v
                break
    brng = np.random.default_rng(seed)
    res: dict[str, Any] = {"rate": rate, "modes": {}}
    for mode in modes:
        every = [o for got in outs[mode] for o in got]
        t = ok_ttfts(every)
        row: dict[str, Any] = {
            "requests": len(every),
            "errors": len(errors_of(every)),
            "first_errors": errors_of(every)[:3],
            "handoff_warnings": warnings[mode],
            "ttft_p50_ms": pct(t, 50) * 1e3,
            "ttft_p99_ms": pct(t, 99) * 1e3,
            "send_lag_p99_ms": pct([o.sent_s - o.scheduled_s for o in every], 99) * 1e3,
            "cpu": cpu_summary(cpu[mode], len(every)),
            "disturbed_rounds_set_aside": set_aside[mode],
            "rounds": round_stats[mode],
        }
        if mode != "direct":
            row.update(added_ttft(outs[mode], row["rounds"], outs["direct"], round_stats["direct"], brng))
        res["modes"][mode] = row
    return res
