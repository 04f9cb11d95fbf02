"""The event kernel: time order, priority then FIFO on ties, no scheduling into the past."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from calroute.sim.kernel import LATE, NORMAL, URGENT, Kernel


@pytest.mark.parametrize("written_heap", [False, True])
def test_events_run_in_time_then_priority_then_fifo_order(written_heap: bool) -> None:
    k = Kernel(written_heap)
    log: list[tuple[float, str]] = []

    def note(tag: str) -> None:
        log.append((k.now_s, tag))

    k.at(2.0, note, "late-2", LATE)
    k.at(1.0, note, "normal-1a", NORMAL)
    k.at(2.0, note, "urgent-2", URGENT)
    k.at(1.0, note, "normal-1b", NORMAL)
    k.at(0.5, note, "first", NORMAL)
    k.run()
    assert log == [(0.5, "first"), (1.0, "normal-1a"), (1.0, "normal-1b"), (2.0, "urgent-2"), (2.0, "late-2")]
    assert k.events_processed == 5 and k.pending() == 0


@pytest.mark.parametrize("written_heap", [False, True])
def test_callbacks_can_schedule_more_work(written_heap: bool) -> None:
    k = Kernel(written_heap)
    seen: list[float] = []

    def tick(n: int) -> None:
        seen.append(k.now_s)
        if n:
            k.at(k.now_s + 0.25, tick, n - 1)

    k.at(0.0, tick, 3)
    k.run()
    assert seen == [0.0, 0.25, 0.5, 0.75]


@pytest.mark.parametrize("written_heap", [False, True])
def test_scheduling_in_the_past_is_refused(written_heap: bool) -> None:
    k = Kernel(written_heap)
    k.at(1.0, lambda _: k.at(0.5, lambda _: None))
    with pytest.raises(ValueError, match="before now"):
        k.run()


@pytest.mark.parametrize("written_heap", [False, True])
def test_an_unknown_priority_is_refused(written_heap: bool) -> None:
    with pytest.raises(ValueError, match="priority"):
        Kernel(written_heap).at(1.0, lambda _: None, priority=3)


def _run_plan(
    plan: list[tuple[int, int, int]], reference: bool, written_heap: bool = False
) -> list[tuple[float, int, int]]:
    """Runs ``plan`` (events, some scheduling children when they run) on the Kernel or, with ``reference``,
    on a list scanned for the least (time, priority, sequence) at every step; returns what ran, in order."""
    k = Kernel(written_heap)
    pending: list[tuple[float, int, int, int]] = []
    ran: list[tuple[float, int, int]] = []
    scheduled = 0

    def schedule(time_s: float, priority: int, children: int) -> None:
        nonlocal scheduled
        event = (time_s, priority, scheduled, children)
        if reference:
            pending.append(event)
        else:
            k.at(time_s, run, event, priority)
        scheduled += 1

    def run(event: tuple[float, int, int, int]) -> None:
        time_s, priority, seq, children = event
        ran.append((time_s, priority, seq))
        for c in range(children):
            schedule(time_s + c * 0.5, (priority + c) % 3, 0)

    for time_units, priority, children in plan:
        schedule(time_units * 0.25, priority, children)
    if reference:
        while pending:
            event = min(pending)
            pending.remove(event)
            run(event)
    else:
        k.run()
        assert k.pending() == 0 and k.events_processed == scheduled
    return ran


@given(
    st.lists(
        st.tuples(st.integers(0, 6), st.sampled_from([URGENT, NORMAL, LATE]), st.integers(0, 3)),
        max_size=60,
    )
)
def test_both_heaps_run_events_as_a_full_scan_would(plan: list[tuple[int, int, int]]) -> None:
    want = _run_plan(plan, reference=True)
    assert _run_plan(plan, reference=False, written_heap=False) == want
    assert _run_plan(plan, reference=False, written_heap=True) == want
