"""The SLO class from a request's headers, table-driven."""

from __future__ import annotations

import pytest

from calroute.costmodel.calibration import SloTargets
from calroute.proxy.slo import slo_class
from calroute.types import SloClass

SLO = SloTargets(tight_ttft_s=0.2, tight_tpot_s=0.04, loose_factor=3.0)


@pytest.mark.parametrize(
    ("headers", "want"),
    [
        ({}, SloClass.LOOSE),
        ({"x-calroute-slo": "tight"}, SloClass.TIGHT),
        ({"x-calroute-slo": " LOOSE "}, SloClass.LOOSE),
        ({"x-llm-d-slo-ttft-ms": "200"}, SloClass.TIGHT),
        ({"x-llm-d-slo-ttft-ms": "600"}, SloClass.LOOSE),
        ({"x-llm-d-slo-ttft-ms": "600", "x-llm-d-slo-tpot-ms": "30"}, SloClass.TIGHT),
        ({"x-llm-d-slo-tpot-ms": "120"}, SloClass.LOOSE),
    ],
)
def test_slo_class_from_headers(headers: dict[str, str], want: SloClass) -> None:
    assert slo_class(headers, SLO, SloClass.LOOSE) is want


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"x-calroute-slo": "medium"}, "x-calroute-slo"),
        ({"x-llm-d-slo-ttft-ms": "fast"}, "x-llm-d-slo-ttft-ms"),
        ({"x-llm-d-slo-tpot-ms": "-3"}, "positive"),
        ({"x-llm-d-slo-tpot-ms": "nan"}, "positive"),
    ],
)
def test_bad_slo_headers(headers: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        slo_class(headers, SLO, SloClass.LOOSE)
