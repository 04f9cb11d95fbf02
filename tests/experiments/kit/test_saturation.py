"""Saturation search on a known goodput curve."""

from __future__ import annotations

import pytest

from calroute.errors import ConfigError
from calroute.experiments.kit.saturation import find_saturation


@pytest.mark.parametrize("knee", [0.3, 2.0, 17.0, 250.0])
def test_finds_the_crossing_of_a_falling_curve(knee: float) -> None:
    def goodput(rate: float) -> float:
        return 1.0 if rate <= knee else max(0.0, 1.0 - (rate - knee) / knee)

    res = find_saturation(goodput, target=0.85, rel_tol=0.01)
    crossing = knee * 1.15
    assert res.rate_rps == pytest.approx(crossing, rel=0.01)
    assert res.probes[0].rate_rps == 1.0


def test_reports_every_probe() -> None:
    seen: list[float] = []
    res = find_saturation(lambda r: 1.0 / r, target=0.5, on_probe=lambda p: seen.append(p.rate_rps))
    assert seen == [p.rate_rps for p in res.probes]
    assert res.rate_rps == pytest.approx(2.0, rel=0.03)


@pytest.mark.parametrize(("kw", "message"), [({"target": 1.0}, "target"), ({"start_rps": 0}, "start")])
def test_bad_arguments(kw: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        find_saturation(lambda r: 0.5, **kw)  # type: ignore[arg-type]


def test_never_good_is_an_error() -> None:
    with pytest.raises(ConfigError, match="goodput is 0"):
        find_saturation(lambda r: 0.0)


def test_an_unreachable_target_becomes_relative_to_the_low_load_goodput() -> None:
    """A workload that misses some SLOs by physics: 0.7 at best, collapsing above 5 req/s."""

    def goodput(rate: float) -> float:
        return 0.7 if rate <= 5 else max(0.0, 0.7 * (1 - (rate - 5) / 5))

    res = find_saturation(goodput, target=0.85, start_rps=20.0, rel_tol=0.01)
    assert res.relative and res.target == pytest.approx(0.85 * 0.7)
    assert res.rate_rps == pytest.approx(5 * 1.15, rel=0.02)
