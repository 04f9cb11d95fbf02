"""Calibration files: round trip, validation with field names, the derivation rule."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from calroute.costmodel.calibration import (
    REF_PROMPT_TOKENS,
    Calibration,
    DecodeCurve,
    PrefillCurve,
    SloTargets,
    TransferModel,
    derive_calibration,
)
from calroute.errors import CalibrationError
from calroute.types import SloClass


def test_save_and_load_round_trip(calibration: Calibration, tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    calibration.save(path)
    assert Calibration.load(path) == calibration
    assert json.loads(path.read_text())["schema_version"] == 1


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("tau_dec_s"), "missing field 'tau_dec_s'"),
        (lambda d: d.__setitem__("tau_pre_s", -1), "tau_pre_s must be > 0"),
        (lambda d: d["decode"].__setitem__("base_s", 0), "decode.base_s must be > 0"),
        (lambda d: d["slo"].__setitem__("loose_factor", 0.5), "loose_factor must be >= 1"),
        (lambda d: d["prefill"].__setitem__("typo", 1), "bad field"),
        (lambda d: d.__setitem__("schema_version", 99), "schema_version 99"),
    ],
)
def test_bad_files_name_the_field(
    calibration: Calibration, tmp_path: Path, mutate: object, message: str
) -> None:
    d = json.loads(calibration.to_json())
    mutate(d)  # type: ignore[operator]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    with pytest.raises(CalibrationError, match=message):
        Calibration.load(path)


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(CalibrationError, match="cannot read"):
        Calibration.load(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text("{nope")
    with pytest.raises(CalibrationError, match="not JSON"):
        Calibration.load(tmp_path / "x.json")
    (tmp_path / "y.json").write_text("[1]")
    with pytest.raises(CalibrationError, match="JSON object"):
        Calibration.load(tmp_path / "y.json")


def test_derivation_rule() -> None:
    prefill = PrefillCurve(base_s=0.01, per_token_s=1e-4)
    decode = DecodeCurve(base_s=0.02, per_seq_s=1e-3, per_ctx_token_s=0.0)
    transfer = TransferModel(latency_s=0.001, bandwidth_bytes_per_s=1e9)
    cal = derive_calibration(prefill, decode, transfer, 1000, {"source": "test"})
    assert cal.tau_pre_s == pytest.approx((0.01 + 1e-4 * REF_PROMPT_TOKENS) / REF_PROMPT_TOKENS)
    assert cal.tau_dec_s == pytest.approx(0.02 + 32e-3)
    unloaded = 0.01 + 1e-4 * 1024 + (0.001 + 1024 * 1000 / 1e9) + 0.021
    assert cal.slo.tight_ttft_s == pytest.approx(2 * unloaded)
    assert cal.slo.tight_tpot_s == pytest.approx(2 * cal.tau_dec_s)
    assert cal.slo.ttft_s(SloClass.LOOSE) == pytest.approx(3 * cal.slo.ttft_s(SloClass.TIGHT))
    assert cal.slo.tpot_s(SloClass.LOOSE) == pytest.approx(3 * cal.slo.tpot_s(SloClass.TIGHT))


def test_slo_targets_validate() -> None:
    with pytest.raises(CalibrationError, match="tight_tpot_s"):
        SloTargets(tight_ttft_s=1.0, tight_tpot_s=0.0)
    assert replace(SloTargets(0.1, 0.01), loose_factor=1.0).ttft_s(SloClass.LOOSE) == 0.1
