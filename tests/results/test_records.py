"""The record schema: JSONL round trip, derived latencies, clear errors on bad lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from calroute.errors import ConfigError
from calroute.results.records import (
    RECORD_FIELDS,
    RecordWriter,
    RequestRecord,
    read_records,
    record_from_json,
    record_to_json,
)
from calroute.types import RequestStatus, SloClass

times = st.one_of(st.none(), st.floats(0, 1e6, allow_nan=False).map(lambda x: round(x, 6)))
records = st.builds(
    RequestRecord,
    request_id=st.text(min_size=1, max_size=20),
    slo_class=st.sampled_from(SloClass),
    prompt_tokens=st.integers(0, 100_000),
    target_output_tokens=st.integers(0, 10_000),
    predicted_output_tokens=st.integers(0, 10_000),
    output_tokens=st.integers(0, 10_000),
    policy=st.sampled_from(["round_robin", "marginal_cost"]),
    prefill_id=st.one_of(st.none(), st.just("prefill-0")),
    decode_id=st.one_of(st.none(), st.just("decode-3")),
    arrival_s=st.floats(0, 1e6, allow_nan=False).map(lambda x: round(x, 6)),
    prefill_done_s=times,
    first_token_s=times,
    last_token_s=times,
    status=st.sampled_from(RequestStatus),
    error=st.one_of(st.none(), st.text(max_size=50)),
    local_prefill=st.booleans(),
    path_reason=st.sampled_from(["", "cheaper_local", "uncached_below_threshold"]),
)


def record(**fields: Any) -> RequestRecord:
    """A loose request that never reached an engine, but for ``fields``."""
    base: dict[str, Any] = dict(
        request_id="a",
        slo_class=SloClass.LOOSE,
        prompt_tokens=1,
        target_output_tokens=1,
        predicted_output_tokens=1,
        output_tokens=1,
        policy="p",
        prefill_id=None,
        decode_id=None,
        arrival_s=0.0,
        prefill_done_s=None,
        first_token_s=None,
        last_token_s=None,
        status=RequestStatus.OK,
    )
    return RequestRecord(**{**base, **fields})


@given(records)
def test_round_trip(rec: RequestRecord) -> None:
    line = record_to_json(rec)
    assert list(json.loads(line)) == list(RECORD_FIELDS)
    assert record_from_json(line) == rec


def test_derived_latencies() -> None:
    rec = record(
        slo_class=SloClass.TIGHT,
        prompt_tokens=10,
        target_output_tokens=5,
        predicted_output_tokens=5,
        output_tokens=5,
        prefill_id="prefill-0",
        decode_id="decode-0",
        arrival_s=1.0,
        prefill_done_s=1.1,
        first_token_s=1.2,
        last_token_s=1.6,
    )
    assert rec.ttft_s == pytest.approx(0.2)
    assert rec.tpot_s == pytest.approx(0.1)
    assert rec.replace(output_tokens=1).tpot_s == 0.0
    assert rec.replace(first_token_s=None).ttft_s is None


def test_writer_and_reader(tmp_path: Path) -> None:
    recs = [
        record(request_id=f"r{i}", arrival_s=float(i), status=RequestStatus.REJECTED, error="x")
        for i in range(5)
    ]
    path = tmp_path / "r.jsonl"
    with path.open("w") as f:
        w = RecordWriter(f, flush_every=2)
        for r in recs:
            w.write(r)
        assert w.count == 5
    assert list(read_records(path)) == recs


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "bad request record"),
        ('{"request_id": "a"}', "missing fields"),
        (
            record_to_json(record()).replace('"ok"', '"weird"'),
            "weird",
        ),
        (record_to_json(record()).replace('"local_prefill":false', '"local_prefill":1'), "local_prefill"),
    ],
)
def test_bad_lines_are_errors(line: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        record_from_json(line)


@given(
    st.one_of(
        st.floats(allow_nan=False, allow_infinity=False),
        st.floats(0, 1e10),
        st.integers(0, 10**15).map(lambda n: n / 1e6),  # exact 6-decimal values: halfway and carry cases
        st.integers(0, 10**13).map(lambda n: (n + 0.5) / 1e6),
    )
)
def test_time_is_repr_of_round_to_the_microsecond(x: float) -> None:
    """_time's formatting fast path must give exactly what repr(round(x, 6)) gives (files are compared
    byte for byte across versions)."""
    from calroute.results.records import _time, _time_from_micros

    assert _time(x) == repr(round(x, 6))
    if 1e-4 <= x < 1e9:  # the compiled build's path (tests run the sources)
        fast = _time_from_micros(x)
        assert fast is None or fast == repr(round(x, 6))


def test_time_edge_cases() -> None:
    from calroute.results.records import _time

    for x in (0.0, -0.0, 1e-4, 0.0001, 9.99999e-5, 0.00009999995, 5.0, 0.5, 999999999.9999996, 1e9, -2.5):
        assert _time(x) == repr(round(x, 6)), x
    assert _time(None) == "null"
    assert _time(3) == "3.0"  # a time is a float, whichever build formats it (tests/sim/test_compiled.py)
