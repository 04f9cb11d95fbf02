"""The event kernel: time order, priority then FIFO on ties, no scheduling into the past."""

from __future__ import annotations

import pytest

from calroute.sim.kernel import LATE, NORMAL, URGENT, Kernel


def test_events_run_in_time_then_priority_then_fifo_order() -> None:
    k = Kernel()
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


def test_callbacks_can_schedule_more_work() -> None:
    k = Kernel()
    seen: list[float] = []

    def tick(n: int) -> None:
        seen.append(k.now_s)
        if n:
            k.at(k.now_s + 0.25, tick, n - 1)

    k.at(0.0, tick, 3)
    k.run()
    assert seen == [0.0, 0.25, 0.5, 0.75]


def test_scheduling_in_the_past_is_refused() -> None:
    k = Kernel()
    k.at(1.0, lambda _: k.at(0.5, lambda _: None))
    with pytest.raises(ValueError, match="before now"):
        k.run()
