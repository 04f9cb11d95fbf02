"""The targets' verdicts and the printed table."""

from __future__ import annotations

import math
from typing import Any

from benchmarks.overhead.cpu import cores_text
from benchmarks.overhead.method import FINE_FACTOR, PARTS
from benchmarks.overhead.stats import verdict


def targets(result: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for at in result.get("at_rate", []):
        cr = at["modes"].get("calroute", {})
        key = f"at {at['rate']:.1f} req/s"
        rounds = len(cr.get("rounds", []))
        if "rounds_compared" in cr and cr["rounds_compared"] * 2 < rounds:
            why = f"not judged: only {cr['rounds_compared']} of {rounds} rounds undisturbed in both modes"
            out[f"added p50 < 1 ms {key}"] = out[f"added p99 < 5 ms {key}"] = why
        elif "added_p50_ms" in cr:
            out[f"added p50 < 1 ms {key}"] = verdict(cr["added_p50_ms"], cr["added_p50_ci95_ms"], 1.0)
            out[f"added p99 < 5 ms {key}"] = verdict(cr["added_p99_ms"], cr["added_p99_ci95_ms"], 5.0)
    ramp_ = result.get("ramp", {})
    if "vllm-router" in ramp_ and "calroute" in ramp_:
        mine, theirs = ramp_["calroute"]["sustained_rps"] or 0.0, ramp_["vllm-router"]["sustained_rps"] or 0.0
        where = f"calroute {mine:.1f} vs vllm-router {theirs:.1f} req/s"
        if mine > 0 and theirs > 0:
            where += (
                f" ({math.log(mine / theirs) / math.log(FINE_FACTOR):+.1f} fine steps of x{FINE_FACTOR:.3f})"
            )
        out["sustainable rate >= vllm-router's"] = f"{'met' if mine >= theirs else 'missed'}: {where}"
    elif "calroute" in ramp_:
        out["sustainable rate >= vllm-router's"] = "not measured: vllm-router unavailable"
    return out


def print_table(result: dict[str, Any]) -> None:
    cfg = result["config"]
    print(
        f"proxy overhead: {cfg['prefill']}P+{cfg['decode']}D emulated, {cfg['prompt_tokens']}-token prompts, "
        f"{cfg['output_tokens']} output tokens, {cfg['cpus']} CPUs; {cfg['vllm_router']}"
    )
    print("\nunloaded (sequential requests):")
    print(
        f"{'mode':>12} {'n':>5} {'err':>4} {'TTFT p50':>9} {'p90':>8} {'p99':>8} "
        f"{'added p50':>10} {'added p99':>10}"
    )
    for m, u in result.get("unloaded", {}).items():
        line = f"{m:>12} {u['requests']:5d} {u['errors']:4d} {u['ttft_p50_ms']:9.2f} {u['ttft_p90_ms']:8.2f}"
        line += f" {u['ttft_p99_ms']:8.2f}"
        if "added_p50_ms" in u:
            lo, hi = u["added_p50_ci95_ms"]
            line += f" {u['added_p50_ms']:+10.2f} {u['added_p99_ms']:+10.2f}  (p50 CI {lo:+.2f} .. {hi:+.2f})"
        print(line)
    if "ramp" in result:
        print(f"\nsustainable rate (p99 TTFT bound {result['ttft_bound_ms']:.0f} ms):")
        for m, r in result["ramp"].items():
            best = r["sustained_rps"]
            # the step that ended the search: failed, and failed again on its retry
            stops = [st for st in r["steps"] if st.get("retry") and not st["sustained"]]
            last = stops[-1] if stops else None
            line = f"{m:>12} {'-' if best is None else f'{best:.1f}':>7} req/s"
            line += f", handoff warnings {r['handoff_warnings']}"
            line += f", disturbed steps set aside {len(r.get('disturbed_steps_set_aside', []))}"
            if last is not None:
                line += f"; stopped at {last['rate']:.1f}: {last['why_not']}"
                line += f" (cores e/p/c/o {cores_text(last['cpu'])})"
            print(line)
    for at in result.get("at_rate", []):
        print(f"\nTTFT at {at['rate']:.1f} req/s (ms; CI: 95 % bootstrap):")
        print(
            f"{'mode':>12} {'n':>5} {'err':>4} {'p50':>8} {'p99':>8} {'added p50 (CI)':>27} "
            f"{'added p99 (CI)':>27} {'p50 x':>6} {'p99 x':>6} {'lag99':>6}  cpu ms/req e/p/c, others cores"
        )
        for m, r in at["modes"].items():
            line = (
                f"{m:>12} {r['requests']:5d} {r['errors']:4d} {r['ttft_p50_ms']:8.2f} {r['ttft_p99_ms']:8.2f}"
            )
            if "added_p50_ms" in r:
                for q in (50, 99):
                    lo, hi = r[f"added_p{q}_ci95_ms"]
                    line += f" {r[f'added_p{q}_ms']:+8.2f} ({lo:+7.2f}, {hi:+7.2f})"
                line += f" {r['ratio_p50']:6.3f} {r['ratio_p99']:6.3f}"
            else:
                line += f" {'(baseline)':>27} {'':>27} {'':>6} {'':>6}"
            c = r["cpu"]
            cpu = "/".join(f"{c[f'{k}_cpu_ms_per_req']:.2f}" for k in PARTS[:3])
            aside = len(r.get("disturbed_rounds_set_aside", []))
            if "rounds_compared" in r:
                aside_note = f", rounds compared {r['rounds_compared']}/{len(r['rounds'])}"
            else:
                aside_note = (
                    f", disturbed rounds {sum(x.get('disturbed', False) for x in r.get('rounds', []))}"
                )
            peaks = [x["others_peak_cores"] for x in r.get("rounds", []) if "others_peak_cores" in x]
            peak = f" (window peak {max(peaks):.2f})" if peaks else ""
            p50s = [x["ttft_p50_ms"] for x in r.get("rounds", [])]
            spread = f"; round p50s {min(p50s):.1f} .. {max(p50s):.1f}" if p50s else ""
            added = [x["added_p50_ms"] for x in r.get("rounds", []) if "added_p50_ms" in x]
            if added:
                spread += f", round added p50s {min(added):+.2f} .. {max(added):+.2f}"
            print(
                line
                + f" {r['send_lag_p99_ms']:6.1f}  {cpu}, {c['others_cores']:.2f}{peak}; set aside {aside}"
                + aside_note
                + spread
            )
    print("\ntargets:")
    for k, v in result.get("targets", {}).items():
        print(f"  {k}: {v}")
    print(
        f"load average at start {result.get('load_average_at_start')}, "
        f"at end {result.get('load_average_at_end')}"
    )
    print(
        f"calroute sources: {cfg.get('calroute_sources_at_start')} at start, "
        f"{result.get('calroute_sources_at_end')} at end"
    )
