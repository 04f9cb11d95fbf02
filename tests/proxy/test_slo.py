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


# Per-token targets: tight 1 ms per prompt token, loose 3 ms; the explicit loose class: fixed part 0.3 s.
SLO_PER_TOKEN = SloTargets(tight_ttft_s=0.2, tight_tpot_s=0.04, loose_factor=3.0, tight_ttft_s_per_token=1e-3)
SLO_LOOSE = SloTargets(tight_ttft_s=0.2, tight_tpot_s=0.04, loose_ttft_s=0.3)
PER_TOKEN = "x-calroute-slo-ttft-ms-per-token"


@pytest.mark.parametrize(
    ("targets", "headers", "default", "want"),
    [
        # the paper's targets have no allowance: the header cannot choose a class and the default stands
        (SLO, {PER_TOKEN: "0.5"}, SloClass.TIGHT, SloClass.TIGHT),
        (SLO, {PER_TOKEN: "0.5"}, SloClass.LOOSE, SloClass.LOOSE),
        (SLO, {PER_TOKEN: "0.5", "x-llm-d-slo-ttft-ms": "200"}, SloClass.LOOSE, SloClass.TIGHT),
        # below the geometric mean of 1 and 3 ms per token (1.73): tight
        (SLO_PER_TOKEN, {PER_TOKEN: "1.5"}, SloClass.LOOSE, SloClass.TIGHT),
        (SLO_PER_TOKEN, {PER_TOKEN: "0"}, SloClass.LOOSE, SloClass.TIGHT),
        (SLO_PER_TOKEN, {PER_TOKEN: "2"}, SloClass.TIGHT, SloClass.LOOSE),
        # the TTFT header is compared with the fixed parts: explicit loose 0.3 s, the mean 0.245 s
        (SLO_LOOSE, {"x-llm-d-slo-ttft-ms": "240"}, SloClass.LOOSE, SloClass.TIGHT),
        (SLO_LOOSE, {"x-llm-d-slo-ttft-ms": "250"}, SloClass.TIGHT, SloClass.LOOSE),
    ],
)
def test_targets_vote_against_the_classes_same_targets(
    targets: SloTargets, headers: dict[str, str], default: SloClass, want: SloClass
) -> None:
    assert slo_class(headers, targets, default) is want


@pytest.mark.parametrize(
    ("value", "message"), [("-1", "non-negative"), ("inf", "non-negative"), ("x", PER_TOKEN)]
)
def test_a_bad_per_token_header_is_refused_by_name(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        slo_class({PER_TOKEN: value}, SLO, SloClass.LOOSE)
