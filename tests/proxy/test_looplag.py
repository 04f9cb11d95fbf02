"""The event loop's lag (calroute/proxy/looplag.py)."""

from __future__ import annotations

import asyncio
import time

import pytest

from calroute.proxy.looplag import LoopLag


def test_a_blocked_loop_shows_as_one_late_timer() -> None:
    lags: list[float] = []

    async def main() -> None:
        lag = LoopLag(lags.append, interval_s=0.02)
        lag.start()
        await asyncio.sleep(0.05)
        time.sleep(0.3)  # a callback that holds the loop
        await asyncio.sleep(0.05)
        lag.stop()
        seen = len(lags)
        await asyncio.sleep(0.1)
        assert len(lags) == seen  # stopped: no more timers

    asyncio.run(main())
    assert max(lags) >= 0.25
    assert sum(x >= 0.25 for x in lags) == 1  # the timer is re-armed from when it fired, not from when due
    assert min(lags) >= 0.0


@pytest.mark.parametrize("interval_s", [0.0, -1.0])
def test_the_interval_must_be_positive(interval_s: float) -> None:
    with pytest.raises(ValueError, match="interval_s must be positive"):
        LoopLag(lambda _: None, interval_s)
