"""The in-flight ledger: committed work in observed seconds, fed by request events."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calroute.costmodel.calibration import Calibration
from calroute.costmodel.profiles import get_profile
from calroute.errors import ConfigError
from calroute.routing.ledger import Ledger
from calroute.types import InstanceSpec, Role

SPECS = [
    InstanceSpec("p0", Role.PREFILL, 60_000),
    InstanceSpec("p1", Role.PREFILL, 60_000),
    InstanceSpec("d0", Role.DECODE, 60_000),
    InstanceSpec("d1", Role.DECODE, 60_000),
]


def states(ledger: Ledger, now: float) -> dict[str, tuple[int, float, int]]:
    v = ledger.view(now)
    return {s.instance_id: (s.in_flight, s.backlog_s, s.kv_committed_tokens) for s in v.prefill + v.decode}


def test_admit_commits_work_priced_with_the_prior_until_observed(calibration: Calibration) -> None:
    led = Ledger(SPECS, calibration)
    led.admit("a", "p0", "d1", 1000, 100, now_s=0.0)
    s = states(led, 0.0)
    assert s["p0"] == (1, pytest.approx(1000 * calibration.tau_pre_s), 1000)
    assert s["d1"] == (1, pytest.approx(100 * calibration.tau_dec_s), 1100)
    assert s["p1"] == (0, 0.0, 0) and s["d0"] == (0, 0.0, 0)
    assert led.view(0.0).seq == 1


def test_prefill_rate_is_observed_busy_time_per_token(calibration: Calibration) -> None:
    led = Ledger(SPECS, calibration)
    led.admit("a", "p0", "d0", 1000, 10, now_s=0.0)
    led.prefill_done("a", now_s=0.5)  # 0.5 s for 1000 tokens: 0.5 ms per token, not tau_pre
    led.admit("b", "p0", "d0", 2000, 10, now_s=1.0)
    assert led.backlog_s("p0", 1.0) == pytest.approx(2000 * 0.5e-3)
    # p1 has seen nothing yet: it borrows its pool's observation rather than the prior
    led.admit("c", "p1", "d0", 100, 10, now_s=1.0)
    assert led.backlog_s("p1", 1.0) == pytest.approx(100 * 0.5e-3)


def test_idle_time_is_not_counted_as_prefill_work(calibration: Calibration) -> None:
    led = Ledger(SPECS, calibration)
    led.admit("a", "p0", "d0", 1000, 10, now_s=0.0)
    led.prefill_done("a", now_s=0.1)
    led.admit("b", "p0", "d0", 1000, 10, now_s=10.0)  # 9.9 s idle in between
    led.prefill_done("b", now_s=10.1)
    assert led.backlog_s("p0", 10.1) == 0.0
    led.admit("c", "p0", "d0", 1000, 10, now_s=11.0)
    assert led.backlog_s("p0", 11.0) == pytest.approx(0.1, rel=1e-9)


def test_decode_backlog_runs_down_after_first_token_and_never_below_zero(calibration: Calibration) -> None:
    led = Ledger(SPECS, calibration)
    tpot = calibration.tau_dec_s
    led.admit("a", "p0", "d0", 100, 101, now_s=0.0)
    led.first_token("a", now_s=1.0)
    assert led.backlog_s("d0", 1.0) == pytest.approx(100 * tpot)
    assert led.backlog_s("d0", 1.0 + 50 * tpot) == pytest.approx(50 * tpot)
    assert led.backlog_s("d0", 1.0 + 200 * tpot) == 0.0  # the prediction ran out: clamped, not negative
    led.done("a", now_s=1.0 + 300 * tpot, output_tokens=301)
    assert states(led, 100.0)["d0"] == (0, 0.0, 0)


def test_observed_tpot_replaces_the_prior(calibration: Calibration) -> None:
    led = Ledger(SPECS, calibration)
    led.admit("a", "p0", "d0", 100, 11, now_s=0.0)
    led.first_token("a", now_s=1.0)
    led.done("a", now_s=2.0, output_tokens=11)  # TPOT 0.1 s
    led.admit("b", "p0", "d0", 100, 50, now_s=3.0)
    assert led.backlog_s("d0", 3.0) == pytest.approx(50 * 0.1)
    led.admit("c", "p0", "d1", 100, 50, now_s=3.0)
    assert led.backlog_s("d1", 3.0) == pytest.approx(50 * 0.1)  # pool-wide until d1 has its own


def test_failed_requests_release_everything_and_teach_nothing(calibration: Calibration) -> None:
    led = Ledger(SPECS, calibration)
    led.admit("a", "p0", "d0", 100, 11, now_s=0.0)
    led.first_token("a", now_s=1.0)
    led.done("a", now_s=50.0, output_tokens=11, ok=False)
    led.admit("b", "p1", "d1", 100, 10, now_s=0.0)
    led.done("b", now_s=0.5, output_tokens=0, ok=False)  # failed during prefill
    assert all(v == (0, 0.0, 0) for v in states(led, 60.0).values())
    led.admit("c", "p0", "d0", 100, 10, now_s=60.0)
    assert led.backlog_s("d0", 60.0) == pytest.approx(10 * calibration.tau_dec_s)


def test_prefill_kv_is_released_when_the_decode_engine_pulls_it(calibration: Calibration) -> None:
    led = Ledger(SPECS, calibration)
    led.admit("a", "p0", "d0", 700, 10, now_s=0.0)
    led.prefill_done("a", now_s=0.1)
    assert states(led, 0.1)["p0"][2] == 700
    led.first_token("a", now_s=0.2)
    assert states(led, 0.2)["p0"][2] == 0


def test_samples_health_and_errors(calibration: Calibration) -> None:
    led = Ledger(SPECS, calibration)
    led.record_sample("d0", kv_used_tokens=1234, running=3, waiting=1, now_s=1.0)
    led.set_healthy("d1", False)
    v = led.view(1.25)
    d0, d1 = v.decode
    assert (d0.kv_used_tokens, d0.running, d0.waiting, d0.metrics_age_s) == (1234, 3, 1, 0.25)
    assert not d1.healthy and d1.metrics_age_s == float("inf")
    led.admit("a", "p0", "d0", 1, 1, now_s=0.0)
    with pytest.raises(ConfigError, match="already in flight"):
        led.admit("a", "p0", "d0", 1, 1, now_s=0.0)
    with pytest.raises(ConfigError, match="unique"):
        Ledger([SPECS[0], SPECS[0]], calibration)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 1),
            st.integers(0, 1),
            st.integers(1, 4000),
            st.integers(1, 800),
            st.floats(0.0, 2.0),
            st.floats(0.0, 2.0),
            st.floats(0.0, 5.0),
            st.booleans(),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_any_event_order_keeps_the_books_consistent(
    reqs: list[tuple[int, int, int, int, float, float, float, bool]],
) -> None:
    """Random overlapping requests: backlogs never negative, and everything returns to zero (the active
    sequences and their blocks too, the prompts sharing their leading blocks by parity)."""
    led = Ledger(SPECS, get_profile("a40-qwen2.5-3b").calibration)
    led.track_active_blocks(16)
    events: list[tuple[float, int, str, int]] = []
    for i, (_, _, _, _, t_pre, t_ft, t_dec, _) in enumerate(reqs):
        t0 = i * 0.1
        events += [(t0, 0, "admit", i), (t0 + t_pre, 1, "pre", i), (t0 + t_pre + t_ft, 2, "ft", i)]
        events.append((t0 + t_pre + t_ft + t_dec, 3, "done", i))
    for t, _, kind, i in sorted(events):
        p, d, prompt, out, _, _, _, ok = reqs[i]
        rid = f"r{i}"
        if kind == "admit":
            blocks = [i % 2 * 1000 + k for k in range(prompt // 16)]
            led.admit(rid, f"p{p}", f"d{d}", prompt, out, t, blocks=blocks)
        elif kind == "pre":
            led.prefill_done(rid, t)
        elif kind == "ft":
            led.first_token(rid, t)
        else:
            led.done(rid, t, out, ok)
        for s in led.view(t).prefill + led.view(t).decode:
            assert s.backlog_s >= 0 and s.in_flight >= 0 and s.kv_committed_tokens >= 0
            assert 0 <= s.active_shared_tokens <= s.active_tokens and s.pending_prefill_tokens >= 0
    end = max(e[0] for e in events)
    assert all(v == (0, 0.0, 0) for v in states(led, end).values())
    final = led.view(end)
    assert all((s.active_tokens, s.active_shared_tokens) == (0, 0) for s in final.prefill + final.decode)
    assert led.active_overlap([0, 1, 1000]) == {}
    assert led.in_flight_requests() == 0


def test_prefill_backlog_counts_only_the_tokens_to_compute(calibration: Calibration) -> None:
    specs = [InstanceSpec("p0", Role.PREFILL, 60_000), InstanceSpec("d0", Role.DECODE, 60_000)]
    ledger = Ledger(specs, calibration)
    ledger.admit("a", "p0", "d0", 4096, 100, 0.0, cached_tokens=3584)
    ledger.admit("b", "p0", "d0", 1000, 100, 0.0, cached_tokens=5000)  # over-reported: none to compute
    state = ledger.view(0.0).prefill[0]
    assert state.backlog_s == pytest.approx(512 * calibration.tau_pre_s)
    assert state.kv_committed_tokens == 5096  # KV holds whole prompts, cached or not
    ledger.prefill_done("a", 0.5)
    ledger.prefill_done("b", 0.5)
    # the observed rate is seconds per computed token: 0.5 s over 512 tokens
    ledger.admit("c", "p0", "d0", 1024, 100, 0.5)
    assert ledger.view(0.5).prefill[0].backlog_s == pytest.approx(1024 * 0.5 / 512)


def test_a_view_carries_the_prefix_match_for_the_request(calibration: Calibration) -> None:
    specs = [InstanceSpec("p0", Role.PREFILL, 60_000), InstanceSpec("d0", Role.DECODE, 60_000)]
    view = Ledger(specs, calibration).view(0.0, {"d0": 512})
    assert view.prefill[0].cached_tokens == 0 and view.decode[0].cached_tokens == 512


def active(ledger: Ledger, blocks: list[int] | None = None) -> dict[str, tuple[int, int, int, int]]:
    """Per engine: (pending prefill tokens, active tokens, shared tokens, overlap of ``blocks``)."""
    v = ledger.view(0.0, active_overlap=ledger.active_overlap(blocks or []))
    return {
        s.instance_id: (
            s.pending_prefill_tokens,
            s.active_tokens,
            s.active_shared_tokens,
            s.active_overlap_tokens,
        )
        for s in v.prefill + v.decode
    }


# Requests of 2048 tokens (four blocks of 512): a and b share their first three blocks, c shares nothing.
A, B, C = [1, 2, 3, 10], [1, 2, 3, 20], [7, 8, 9, 30]


@pytest.mark.parametrize(
    ("events", "want"),
    [
        # admitted: active on both engines; the prefill engine's pending tokens are the uncached ones
        ([("admit", "a", "p0", "d0", A, 512)], {"p0": (1536, 2048, 0, 1536), "d0": (0, 2048, 0, 1536)}),
        # a second sequence sharing three blocks: they count once (3 x 512 shared); the query's run: 3 blocks
        (
            [("admit", "a", "p0", "d0", A, 0), ("admit", "b", "p0", "d0", B, 0)],
            {"p0": (4096, 4096, 1536, 1536), "d0": (0, 4096, 1536, 1536)},
        ),
        # the prefill engine's sequence ends with its prefill; the decode engine's lasts until done
        (
            [("admit", "a", "p0", "d0", A, 0), ("admit", "b", "p1", "d0", B, 0), ("prefill_done", "a")],
            {"p0": (0, 0, 0, 0), "p1": (2048, 2048, 0, 1536), "d0": (0, 4096, 1536, 1536)},
        ),
        (
            [("admit", "a", "p0", "d0", A, 0), ("admit", "b", "p0", "d1", B, 0), ("first_token", "a")],
            {"p0": (2048, 2048, 0, 1536), "d0": (0, 2048, 0, 1536), "d1": (0, 2048, 0, 1536)},
        ),
        (
            [("admit", "a", "p0", "d0", A, 0), ("prefill_done", "a"), ("done", "a")],
            {"p0": (0, 0, 0, 0), "d0": (0, 0, 0, 0)},
        ),
        # a request that ends in its prefill (failed, cancelled) leaves both engines
        ([("admit", "a", "p0", "d0", A, 0), ("done", "a")], {"p0": (0, 0, 0, 0), "d0": (0, 0, 0, 0)}),
        # a sequence sharing nothing adds its tokens whole and no run
        (
            [("admit", "a", "p0", "d0", A, 0), ("admit", "c", "p0", "d0", C, 0)],
            {"p0": (4096, 4096, 0, 1536), "d0": (0, 4096, 0, 1536)},
        ),
        # the shared blocks' count falls back as their holders leave
        (
            [
                ("admit", "a", "p0", "d0", A, 0),
                ("admit", "b", "p0", "d0", B, 0),
                ("admit", "c", "p0", "d0", A[:3] + [40], 0),
                ("prefill_done", "b"),
                ("done", "b"),
            ],
            {"p0": (4096, 4096, 1536, 1536), "d0": (0, 4096, 1536, 1536)},
        ),
    ],
)
def test_active_sequences_and_their_shared_blocks(
    events: list[tuple[object, ...]], want: dict[str, tuple[int, int, int, int]], calibration: Calibration
) -> None:
    ledger = Ledger(SPECS, calibration)
    ledger.track_active_blocks(512)
    for kind, rid, *rest in events:
        if kind == "admit":
            pre, dec, blocks, cached = rest
            ledger.admit(str(rid), str(pre), str(dec), 2048, 100, 0.0, int(cached), list(blocks))  # type: ignore[call-overload]
        elif kind == "prefill_done":
            ledger.prefill_done(str(rid), 0.0)
        elif kind == "first_token":
            ledger.first_token(str(rid), 0.0)
        else:
            ledger.done(str(rid), 0.0, 10)
    got = active(ledger, [1, 2, 3, 99])  # a query sharing a's and b's first three blocks
    assert {k: v for k, v in got.items() if k in want} == want


def test_active_blocks_are_counted_only_while_tracked(calibration: Calibration) -> None:
    ledger = Ledger(SPECS, calibration)
    ledger.admit("a", "p0", "d0", 2048, 100, 0.0, blocks=A)  # not tracked: tokens only
    assert not ledger.tracks_active_blocks and ledger.active_overlap(A) is None
    assert active(ledger)["d0"] == (0, 2048, 0, 0)
    ledger.track_active_blocks(512)
    ledger.admit("b", "p0", "d0", 2048, 100, 0.0, blocks=B)
    assert active(ledger, A)["d0"] == (0, 4096, 0, 1536)  # a's blocks were never counted
    ledger.done("a", 0.0, 10)  # releases nothing it did not count
    ledger.track_active_blocks(None)
    ledger.track_active_blocks(512)  # a fresh count: b's blocks are forgotten, and never released below 0
    ledger.done("b", 0.0, 10)
    ledger.admit("c", "p0", "d0", 2048, 100, 0.0, blocks=A)
    assert active(ledger, A)["d0"] == (0, 2048, 0, 2048)
