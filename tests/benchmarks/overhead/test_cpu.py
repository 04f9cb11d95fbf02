"""CPU accounting and the others' window peak (benchmarks/overhead/cpu.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from benchmarks.overhead.cpu import CpuMeter, peak_others_cores


@pytest.mark.parametrize(
    ("samples", "min_window_s", "peak"),
    [
        ([], 0.0, 0.0),
        ([(0.0, 10.0, 5.0)], 0.0, 0.0),
        # two cores busy with our own processes only: no others
        ([(0.0, 10.0, 5.0), (0.5, 11.0, 6.0), (1.0, 12.0, 7.0)], 0.0, 0.0),
        # one whole core of others in the second window only; the mean over the round would be 0.5
        ([(0.0, 10.0, 5.0), (0.5, 10.5, 5.5), (1.0, 11.5, 6.0)], 0.0, 1.0),
        # a tenth of a core of others throughout
        ([(0.0, 0.0, 0.0), (1.0, 0.6, 0.5), (2.0, 1.2, 1.0)], 0.0, 0.1),
        # a last window of 10 ms with one tick in it reads as a core: too short to judge
        ([(0.0, 0.0, 0.0), (0.5, 0.3, 0.3), (0.51, 0.31, 0.3)], 0.25, 0.0),
        ([(0.0, 0.0, 0.0), (0.5, 0.3, 0.3), (0.51, 0.31, 0.3)], 0.0, 1.0),
    ],
)
def test_the_peak_is_the_busiest_window_of_the_others(
    samples: list[tuple[float, float, float]], min_window_s: float, peak: float
) -> None:
    assert peak_others_cores(samples, min_window_s) == pytest.approx(peak)


@pytest.fixture
def burner() -> Iterator[subprocess.Popen[bytes]]:
    """A process in a group of its own that keeps one core busy for two seconds."""
    spin = "import time\nend = time.monotonic() + 2.0\nwhile time.monotonic() < end: pass"
    proc = subprocess.Popen(
        [sys.executable, "-c", spin],
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_a_busy_process_outside_our_groups_shows_as_the_others_peak(
    burner: subprocess.Popen[bytes],
) -> None:
    meter = CpuMeter(engine_pgids=(), proxy_pgid=None, window_s=0.2)
    time.sleep(0.2)
    meter.start()
    time.sleep(1.0)
    used = meter.stop()
    assert meter.others_peak_cores > 0.5
    assert used["engines"] == 0.0


def test_a_busy_process_in_an_engine_group_counts_as_the_engines(burner: subprocess.Popen[bytes]) -> None:
    meter = CpuMeter(engine_pgids=(burner.pid,), proxy_pgid=None, window_s=0.2)
    time.sleep(0.2)
    meter.start()
    time.sleep(1.0)
    used = meter.stop()
    assert used["engines"] > 0.5
