"""The per-request record: one schema for simulated and live runs, written as JSONL.

Times are seconds since the start of the run. A record is written once, when its request reaches a
terminal status, so a file holds exactly one line per admitted request.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from json.encoder import encode_basestring_ascii as _quote  # json.dumps of a str, minus its overhead
from pathlib import Path
from typing import IO, NamedTuple

from calroute.errors import ConfigError
from calroute.types import RequestStatus, SloClass

RECORD_FIELDS: tuple[str, ...] = (
    "request_id",
    "slo_class",
    "prompt_tokens",
    "target_output_tokens",
    "predicted_output_tokens",
    "output_tokens",
    "policy",
    "prefill_id",
    "decode_id",
    "arrival_s",
    "prefill_done_s",
    "first_token_s",
    "last_token_s",
    "status",
    "error",
)


class RequestRecord(NamedTuple):
    request_id: str
    slo_class: SloClass
    prompt_tokens: int
    target_output_tokens: int  # what the workload asked for (max_tokens with ignore_eos)
    predicted_output_tokens: int
    output_tokens: int  # what was generated
    policy: str
    prefill_id: str | None
    decode_id: str | None
    arrival_s: float
    prefill_done_s: float | None
    first_token_s: float | None
    last_token_s: float | None
    status: RequestStatus
    error: str | None = None

    @property
    def ttft_s(self) -> float | None:
        if self.first_token_s is None:
            return None
        return self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """Mean gap after the first token; 0 for a one-token output (no gap to miss)."""
        if self.first_token_s is None or self.last_token_s is None:
            return None
        if self.output_tokens < 2:
            return 0.0
        return (self.last_token_s - self.first_token_s) / (self.output_tokens - 1)


def _time(x: float | None) -> str:
    """repr(round(float(x), 6)), or null: microsecond resolution keeps files readable, and the rounding is
    deterministic, so files stay byte-identical.

    Fast path, the same string at half the cost: format ".6f" rounds the binary value to 6 decimals exactly as
    round() does. For 1e-4 <= x < 1e9 that decimal has at most 15 significant digits, so it is the shortest
    string that reads back as round()'s double (which is what repr prints), and repr would print it in
    fixed notation; only trailing zeros differ, and repr keeps one digit after the point.
    """
    if type(x) is float and 1e-4 <= x < 1e9:
        s = f"{x:.6f}".rstrip("0")
        return s + "0" if s[-1] == "." else s
    # float(): an int time prints as a float, as the compiled build (setup.py) prints it
    return "null" if x is None else repr(round(float(x), 6))


def _line(rec: RequestRecord) -> str:
    """One JSON object and its newline, keys in RECORD_FIELDS order.

    Formatted by hand: json.dumps of a dict is 3x slower, and writing the simulator's records is a good
    share of its time. Strings go through the same C escaper json.dumps uses; StrEnum members format as
    their values.
    """
    rid, slo, prompt, target, predicted, out, policy, pre, dec, arr, pdone, first, last, status, err = rec
    return (
        f'{{"request_id":{_quote(rid)},"slo_class":"{slo}","prompt_tokens":{prompt},'
        f'"target_output_tokens":{target},"predicted_output_tokens":{predicted},"output_tokens":{out},'
        f'"policy":{_quote(policy)},"prefill_id":{"null" if pre is None else _quote(pre)},'
        f'"decode_id":{"null" if dec is None else _quote(dec)},"arrival_s":{_time(arr)},'
        f'"prefill_done_s":{_time(pdone)},"first_token_s":{_time(first)},"last_token_s":{_time(last)},'
        f'"status":"{status}","error":{"null" if err is None else _quote(err)}}}\n'
    )


def record_to_json(rec: RequestRecord) -> str:
    """One JSON object, keys in RECORD_FIELDS order."""
    return _line(rec)[:-1]


def record_from_json(line: str) -> RequestRecord:
    try:
        d = json.loads(line)
        missing = [f for f in RECORD_FIELDS if f not in d]
        if missing:
            raise ConfigError(f"record is missing fields {missing}")
        return RequestRecord(
            request_id=str(d["request_id"]),
            slo_class=SloClass(d["slo_class"]),
            prompt_tokens=int(d["prompt_tokens"]),
            target_output_tokens=int(d["target_output_tokens"]),
            predicted_output_tokens=int(d["predicted_output_tokens"]),
            output_tokens=int(d["output_tokens"]),
            policy=str(d["policy"]),
            prefill_id=d["prefill_id"],
            decode_id=d["decode_id"],
            arrival_s=float(d["arrival_s"]),
            prefill_done_s=d["prefill_done_s"],
            first_token_s=d["first_token_s"],
            last_token_s=d["last_token_s"],
            status=RequestStatus(d["status"]),
            error=d["error"],
        )
    except (ValueError, TypeError, KeyError) as e:
        raise ConfigError(f"bad request record {line[:200]!r}: {e}") from e


class RecordWriter:
    """Appends records to a JSONL stream; flushes every ``flush_every`` records so a crash loses little."""

    def __init__(self, stream: IO[str], flush_every: int = 1) -> None:
        self._stream = stream
        self._flush_every = flush_every
        self._pending = 0
        self.count = 0

    def write(self, rec: RequestRecord) -> None:
        self._stream.write(_line(rec))
        self.count += 1
        self._pending += 1
        if self._pending >= self._flush_every:
            self._stream.flush()
            self._pending = 0

    def flush(self) -> None:
        self._stream.flush()
        self._pending = 0


def read_records(path: Path) -> Iterator[RequestRecord]:
    with path.open() as f:
        for line in f:
            if line.strip():
                yield record_from_json(line)
