"""The per-request record: one schema for simulated and live runs, written as JSONL.

Times are seconds since the start of the run. A record is written once, when its request reaches a
terminal status, so a file holds exactly one line per admitted request.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
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
    # Microsecond resolution keeps files readable; rounding is deterministic so files stay byte-identical.
    return "null" if x is None else repr(round(x, 6))


def _str(x: str | None) -> str:
    return "null" if x is None else json.dumps(x)


def record_to_json(rec: RequestRecord) -> str:
    """One JSON object, keys in RECORD_FIELDS order (formatted by hand: json.dumps of a dict is 3x slower)."""
    return (
        f'{{"request_id":{json.dumps(rec.request_id)},"slo_class":"{rec.slo_class.value}",'
        f'"prompt_tokens":{rec.prompt_tokens},"target_output_tokens":{rec.target_output_tokens},'
        f'"predicted_output_tokens":{rec.predicted_output_tokens},"output_tokens":{rec.output_tokens},'
        f'"policy":{json.dumps(rec.policy)},"prefill_id":{_str(rec.prefill_id)},"decode_id":{_str(rec.decode_id)},'
        f'"arrival_s":{_time(rec.arrival_s)},"prefill_done_s":{_time(rec.prefill_done_s)},'
        f'"first_token_s":{_time(rec.first_token_s)},"last_token_s":{_time(rec.last_token_s)},'
        f'"status":"{rec.status.value}","error":{_str(rec.error)}}}'
    )


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
        self._stream.write(record_to_json(rec))
        self._stream.write("\n")
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
