"""Goodput: good requests (both targets of their class met) over all offered."""

from __future__ import annotations

import pytest

from calroute.costmodel.calibration import SloTargets
from calroute.results.metrics import is_good, summarize
from calroute.results.records import RequestRecord
from calroute.types import RequestStatus, SloClass

SLO = SloTargets(tight_ttft_s=0.2, tight_tpot_s=0.04, loose_factor=3.0)


def rec(
    ttft: float,
    tpot: float,
    slo: SloClass = SloClass.TIGHT,
    status: RequestStatus = RequestStatus.OK,
    out: int = 11,
    prompt: int = 100,
) -> RequestRecord:
    first = 10.0 + ttft
    return RequestRecord(
        request_id="r",
        slo_class=slo,
        prompt_tokens=prompt,
        target_output_tokens=out,
        predicted_output_tokens=out,
        output_tokens=out,
        policy="p",
        prefill_id="p0",
        decode_id="d0",
        arrival_s=10.0,
        prefill_done_s=10.05,
        first_token_s=first,
        last_token_s=first + tpot * (out - 1),
        status=status,
    )


@pytest.mark.parametrize(
    ("r", "good"),
    [
        (rec(0.19, 0.039), True),
        (rec(0.21, 0.01), False),  # TTFT missed
        (rec(0.1, 0.041), False),  # TPOT missed
        (rec(0.5, 0.1, SloClass.LOOSE), True),  # within 3x
        (rec(0.61, 0.1, SloClass.LOOSE), False),
        (rec(0.1, 0.0, out=1), True),  # one token: no TPOT to miss
        (rec(0.1, 0.01, status=RequestStatus.FAILED), False),
    ],
)
def test_is_good(r: RequestRecord, good: bool) -> None:
    assert is_good(r, SLO) is good


# SLO_PER_TOKEN: the same targets plus 1 ms per prompt token (tight), loose 3x that.
SLO_PER_TOKEN = SloTargets(tight_ttft_s=0.2, tight_tpot_s=0.04, loose_factor=3.0, tight_ttft_s_per_token=1e-3)
# An explicit loose class: its own fixed part, allowance and TPOT, not 3x the tight ones.
SLO_LOOSE = SloTargets(
    tight_ttft_s=0.2,
    tight_tpot_s=0.04,
    tight_ttft_s_per_token=1e-3,
    loose_ttft_s=0.5,
    loose_tpot_s=0.05,
    loose_ttft_s_per_token=2e-3,
)


@pytest.mark.parametrize(
    ("r", "slo", "good"),
    [
        # a 4,000-token prompt served in 3 s: bad against the fixed 0.2 s, good against 0.2 + 4 s
        (rec(3.0, 0.01, prompt=4000), SLO, False),
        (rec(3.0, 0.01, prompt=4000), SLO_PER_TOKEN, True),
        (rec(4.21, 0.01, prompt=4000), SLO_PER_TOKEN, False),  # its own target missed
        (rec(0.21, 0.01, prompt=0), SLO_PER_TOKEN, False),  # no prompt: the fixed part alone
        (rec(0.29, 0.01, prompt=100), SLO_PER_TOKEN, True),  # a short prompt gets a little more
        (rec(12.5, 0.1, SloClass.LOOSE, prompt=4000), SLO_PER_TOKEN, True),  # 3 x (0.2 + 4)
        (rec(12.7, 0.1, SloClass.LOOSE, prompt=4000), SLO_PER_TOKEN, False),
        (rec(3.0, 0.041, prompt=4000), SLO_PER_TOKEN, False),  # TPOT does not grow
        (rec(8.5, 0.05, SloClass.LOOSE, prompt=4000), SLO_LOOSE, True),  # 0.5 + 8
        (rec(8.6, 0.05, SloClass.LOOSE, prompt=4000), SLO_LOOSE, False),
        (rec(1.0, 0.051, SloClass.LOOSE, prompt=4000), SLO_LOOSE, False),
    ],
)
def test_each_request_meets_the_ttft_target_of_its_own_prompt(
    r: RequestRecord, slo: SloTargets, good: bool
) -> None:
    assert is_good(r, slo) is good


def test_goodput_judges_each_request_by_its_own_prompt() -> None:
    short, long = rec(0.15, 0.01, prompt=100), rec(3.0, 0.01, prompt=4000)
    assert summarize([short, long], SLO).good == 1
    assert summarize([short, long], SLO_PER_TOKEN).good == 2


def test_summary_counts_rejected_requests_against_goodput() -> None:
    rejected = rec(0, 0).replace(status=RequestStatus.REJECTED, first_token_s=None, last_token_s=None)
    s = summarize([rec(0.1, 0.01), rec(0.3, 0.01), rejected, rec(0.1, 0.01)], SLO)
    assert (s.requests, s.completed, s.good) == (4, 3, 2)
    assert s.goodput == 0.5
    assert s.status_counts == {"ok": 3, "rejected": 1}
    assert s.ttft_p50_s == pytest.approx(0.1)
    assert s.ttft_p99_s is not None and 0.29 < s.ttft_p99_s <= 0.3


def test_empty_summary() -> None:
    s = summarize([], SLO)
    assert s.requests == 0 and s.goodput == 0.0 and s.ttft_p99_s is None


def test_admissible_goodput_counts_the_inadmissible_apart() -> None:
    from dataclasses import replace as _replace

    from calroute.results.metrics import RunSummary

    s = RunSummary(10, 8, 6, 0.6, None, None, None, None, 1.0, 6.0, {"ok": 8, "rejected": 2})
    assert s.inadmissible == 2 and s.admissible_goodput == 6 / 8
    assert _replace(s, status_counts={"ok": 10}).admissible_goodput == 0.6


def test_the_share_kept_local_counts_every_request_its_decode_engine_prefilled() -> None:
    from calroute.results.tables import RunRow, markdown_table

    local = rec(0.1, 0.01).replace(local_prefill=True, prefill_id="d0", path_reason="cheaper_local")
    s = summarize([local, rec(0.1, 0.01), local.replace(status=RequestStatus.FAILED), rec(0.1, 0.01)], SLO)
    assert s.local_share == 0.5
    assert "| kept local |" in markdown_table([RunRow("p", 0, s)])
    assert "kept local" not in markdown_table([RunRow("p", 0, summarize([rec(0.1, 0.01)], SLO))])


def test_tpot_misses_are_counted_among_completed_requests_whatever_their_ttft() -> None:
    s = summarize([rec(0.1, 0.05), rec(0.5, 0.05), rec(0.1, 0.01), rec(0.1, 0.1, SloClass.LOOSE)], SLO)
    # 0.04 tight, 0.12 loose: two tight misses (one also past its TTFT), the loose one within its target
    assert s.tpot_miss_ratio == 0.5
