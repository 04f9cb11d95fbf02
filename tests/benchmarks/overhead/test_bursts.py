"""Bursts in a round's added TTFT, from requests.jsonl (benchmarks/overhead/bursts.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from benchmarks.overhead.bursts import bursts, densest, line, main, round_burst

N = 200
AT_S = [0.01 * i for i in range(N)]  # one request every 10 ms, the same offsets in both modes


def row(mode: str, ttft_ms: list[float | None], rnd: int = 1, **kw: Any) -> dict[str, Any]:
    return {
        "rate": 100.0,
        "round": rnd,
        "mode": mode,
        "attempt": 1,
        "others_cores": 0.0,
        "disturbed": False,
        "counted": True,
        "scheduled_s": [1000.0 + t for t in AT_S[: len(ttft_ms)]],
        "send_lag_ms": [0.5] * len(ttft_ms),
        "ttft_ms": ttft_ms,
        **kw,
    }


def with_slow(indices: list[int], slow_ms: float = 180.0, base_ms: float = 100.0) -> list[float | None]:
    out: list[float | None] = [base_ms] * N
    for i in indices:
        out[i] = slow_ms
    return out


@pytest.mark.parametrize(
    ("times_s", "window_s", "expected"),
    [
        ([], 0.1, (0, 0)),
        ([0.0, 0.01, 0.02, 0.5, 0.55, 0.56, 0.57], 0.1, (4, 3)),
        ([0.0, 0.01, 0.02, 0.5, 0.55, 0.56, 0.57], 1.0, (7, 0)),
        ([0.0, 0.2, 0.4], 0.1, (1, 0)),
    ],
)
def test_the_densest_window(times_s: list[float], window_s: float, expected: tuple[int, int]) -> None:
    assert densest(np.array(times_s), window_s) == expected


@pytest.mark.parametrize(
    ("slow", "over", "most", "at_s"),
    [
        (list(range(100, 106)), 6, 6, 1.0),  # six in a row, 50 ms: a pause
        (list(range(0, 200, 40)), 5, 1, 0.0),  # five spread over the round: one per window
        ([], 0, 0, None),
    ],
)
def test_pairs_the_proxy_lost_are_counted_and_the_densest_window_found(
    slow: list[int], over: int, most: int, at_s: float | None
) -> None:
    r = round_burst(row("direct", with_slow([])), row("calroute", with_slow(slow)), 50.0, 0.1)
    assert (r.proxy_lost.over, r.proxy_lost.most) == (over, most)
    assert r.proxy_lost.at_s == (None if at_s is None else pytest.approx(at_s))
    assert r.direct_lost.over == 0


def test_a_pause_in_directs_round_shows_as_pairs_direct_lost() -> None:
    r = round_burst(row("direct", with_slow([50, 51, 52])), row("calroute", with_slow([])), 50.0, 0.1)
    assert (r.direct_lost.over, r.direct_lost.most, r.proxy_lost.over) == (3, 3, 0)
    assert r.direct_lost.at_s == pytest.approx(0.5)


def test_a_pair_with_a_failed_request_is_left_out() -> None:
    proxy = with_slow([10])
    proxy[11] = None  # failed: no pair
    direct = with_slow([])
    direct[12] = None
    r = round_burst(row("direct", direct), row("calroute", proxy), 50.0, 0.1)
    assert r.proxy_lost.over == 1
    assert r.added_p50_ms == pytest.approx(0.0)


def test_only_counted_tries_are_paired_and_only_with_directs_round() -> None:
    lines = [
        row("direct", with_slow([])),
        row("calroute", with_slow(list(range(20))), attempt=1, counted=False),  # set aside, run again
        row("calroute", with_slow([5]), attempt=2),
        row("calroute", with_slow([]), rnd=2),  # direct's round 2 is missing: nothing to pair with
    ]
    got = bursts(lines, 50.0, 0.1)
    assert [(b.mode, b.round, b.proxy_lost.over) for b in got] == [("calroute", 1, 1)]


def test_a_missing_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([str(tmp_path / "requests.jsonl")])
    assert "requests.jsonl is not a file" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("proxy_peak", "direct_peak", "shown"),
    [
        (0.12, 0.81, "others' peak 0.12 / 0.81 cores"),
        (None, None, None),  # a log written before the peak was sampled
    ],
)
def test_the_others_peak_of_both_rounds_is_shown_when_logged(
    proxy_peak: float | None, direct_peak: float | None, shown: str | None
) -> None:
    direct, proxy = row("direct", with_slow([])), row("calroute", with_slow([]))
    if direct_peak is not None and proxy_peak is not None:
        direct["others_peak_cores"], proxy["others_peak_cores"] = direct_peak, proxy_peak
    r = round_burst(direct, proxy, 50.0, 0.1)
    assert r.others_peak_cores == (proxy_peak, direct_peak)
    text = line(r)
    assert (shown in text) if shown else ("peak" not in text)


def test_the_proxys_late_loop_timers_are_shown_when_logged() -> None:
    proxy = row("calroute", with_slow(list(range(40, 52))), proxy_loop_late=2.0)
    r = round_burst(row("direct", with_slow([])), proxy, 50.0, 0.1)
    assert r.proxy_loop_late == 2.0
    assert "proxy loop late > 20 ms: 2" in line(r)
    assert "proxy loop late" not in line(
        round_burst(row("direct", with_slow([])), row("calroute", with_slow([])), 50.0, 0.1)
    )
