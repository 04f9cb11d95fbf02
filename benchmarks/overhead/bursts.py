"""Where a round's added TTFT came from: spread over the round, or one burst (a stall of the machine).

Reads the requests.jsonl that ``proxy_overhead.py --log-dir`` keeps and, for every counted round of a
proxy and ``direct``'s round at the same rate, pairs request i with request i (the same scheduled offset)
and prints the round's added p50 and p99, how many pairs the proxy lost more than ``--over-ms`` on, and the
densest ``--window-ms`` window of those: a round whose p99 outlier is thirty requests within 50 ms,
beside a quiet client (small send lag there), is a pause that hit everything in flight at once, not the
proxy's per-request work, which would spread over the round. The same for the pairs ``direct`` lost: a
pause of the machine hits the baseline's rounds as well.

    python -m benchmarks.overhead.bursts DIR/requests.jsonl [--over-ms 50] [--window-ms 100]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

Key = tuple[float, int, str]  # rate, round, mode


@dataclass(frozen=True)
class Burst:
    over: int  # pairs one side lost by more than over_ms
    most: int  # of those, the most within one window
    at_s: float | None  # the window's start, from the round's first scheduled request
    lag_p99_ms: float | None  # the client's send lag over that window's requests, in the losing mode


@dataclass(frozen=True)
class RoundBurst:
    rate: float
    round: int
    mode: str
    added_p50_ms: float
    added_p99_ms: float
    proxy_lost: Burst
    direct_lost: Burst
    disturbed: bool
    # the most cores the rest of the machine used in a 0.5 s window of the proxy's round and of direct's
    # (None in logs written before it was sampled)
    others_peak_cores: tuple[float | None, float | None] = (None, None)
    # calroute's event-loop timers that fired over 20 ms late in its round: a stall of the proxy itself
    proxy_loop_late: float | None = None


def counted_rounds(lines: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    """The try of each (rate, round, mode) that counted (the last one)."""
    return {(r["rate"], r["round"], r["mode"]): r for r in lines if r["counted"]}


def densest(times_s: np.ndarray[Any, Any], window_s: float) -> tuple[int, int]:
    """(count, index of the first) of the window of length ``window_s`` holding most of the sorted
    ``times_s``."""
    if len(times_s) == 0:
        return 0, 0
    ends = np.searchsorted(times_s, times_s + window_s, side="right")
    counts = ends - np.arange(len(times_s))
    first = int(np.argmax(counts))
    return int(counts[first]), first


def burst(
    lost_ms: np.ndarray[Any, Any],
    at_s: np.ndarray[Any, Any],
    lag_ms: np.ndarray[Any, Any],
    over_ms: float,
    window_s: float,
) -> Burst:
    big = np.flatnonzero(lost_ms > over_ms)
    most, first = densest(at_s[big], window_s)
    where = big[first : first + most]
    return Burst(
        over=len(big),
        most=most,
        at_s=float(at_s[where[0]]) if most else None,
        lag_p99_ms=float(np.percentile(lag_ms[where], 99)) if most else None,
    )


def round_burst(direct: dict[str, Any], mode: dict[str, Any], over_ms: float, window_s: float) -> RoundBurst:
    n = min(len(direct["ttft_ms"]), len(mode["ttft_ms"]))
    ok = [i for i in range(n) if direct["ttft_ms"][i] is not None and mode["ttft_ms"][i] is not None]

    def column(row: dict[str, Any], name: str) -> np.ndarray[Any, Any]:
        return np.array([row[name][i] for i in ok], dtype=float)

    a, b = column(direct, "ttft_ms"), column(mode, "ttft_ms")
    at_s = column(mode, "scheduled_s") - mode["scheduled_s"][0]  # the same offsets in both modes
    return RoundBurst(
        rate=mode["rate"],
        round=mode["round"],
        mode=mode["mode"],
        added_p50_ms=float(np.percentile(b, 50) - np.percentile(a, 50)) if ok else float("nan"),
        added_p99_ms=float(np.percentile(b, 99) - np.percentile(a, 99)) if ok else float("nan"),
        proxy_lost=burst(b - a, at_s, column(mode, "send_lag_ms"), over_ms, window_s),
        direct_lost=burst(a - b, at_s, column(direct, "send_lag_ms"), over_ms, window_s),
        disturbed=bool(mode["disturbed"] or direct["disturbed"]),
        others_peak_cores=(mode.get("others_peak_cores"), direct.get("others_peak_cores")),
        proxy_loop_late=mode.get("proxy_loop_late"),
    )


def bursts(lines: list[dict[str, Any]], over_ms: float, window_s: float) -> list[RoundBurst]:
    rounds = counted_rounds(lines)
    out = []
    for (rate, k, mode), row in sorted(rounds.items()):
        direct = rounds.get((rate, k, "direct"))
        if mode != "direct" and direct is not None:
            out.append(round_burst(direct, row, over_ms, window_s))
    return out


def _text(b: Burst) -> str:
    if b.at_s is None or b.lag_p99_ms is None:
        return f"{b.over:4d}"
    return f"{b.over:4d} ({b.most} in {b.at_s:5.2f} s+, lag99 {b.lag_p99_ms:.1f} ms)"


def line(r: RoundBurst) -> str:
    flag = " (disturbed: left out)" if r.disturbed else ""
    mine, base = r.others_peak_cores
    if mine is not None and base is not None:
        flag = f"; others' peak {mine:.2f} / {base:.2f} cores" + flag
    if r.proxy_loop_late is not None:
        flag = f"; proxy loop late > 20 ms: {r.proxy_loop_late:.0f}" + flag
    return (
        f"{r.rate:7.1f} {r.mode:>11} round {r.round:2d}: added p50 {r.added_p50_ms:+6.2f} "
        f"p99 {r.added_p99_ms:+7.1f} ms; lost by the proxy {_text(r.proxy_lost)}, "
        f"by direct {_text(r.direct_lost)}{flag}"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("requests", type=Path, help="requests.jsonl from proxy_overhead.py --log-dir")
    p.add_argument("--over-ms", type=float, default=50.0, help="a pair counts when the proxy lost more")
    p.add_argument("--window-ms", type=float, default=100.0, help="the burst window")
    args = p.parse_args(argv)
    if not args.requests.is_file():
        p.error(f"requests: {args.requests} is not a file (--log-dir DIR writes DIR/requests.jsonl)")
    with args.requests.open() as f:
        lines = [json.loads(s) for s in f if s.strip()]
    head = f"pairs one side lost by over {args.over_ms:g} ms (the most in one {args.window_ms:g} ms window):"
    try:
        print(head)
        for r in bursts(lines, args.over_ms, args.window_ms / 1e3):
            print(line(r), flush=True)
    except BrokenPipeError:  # piped into head: stop quietly, and keep Python's exit from writing again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    main()
