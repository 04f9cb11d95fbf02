"""The per-request record: one schema for simulated and live runs, written as JSONL.

Times are seconds since the start of the run. A record is written once, when its request reaches a
terminal status, so a file holds exactly one line per admitted request.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from json.encoder import encode_basestring_ascii as _quote  # json.dumps of a str, minus its overhead
from pathlib import Path
from typing import IO, Final

from calroute.errors import ConfigError
from calroute.types import RequestStatus, SloClass, SlottedValue

_COMPILED: Final = not __file__.endswith(".py")  # this module, built by setup.py
_MEMO_MAX: Final = 1024
_FAST_US_LIMIT: Final = float(2**40)  # about 12.7 days, in microseconds
_DIGITS3: Final = tuple(f"{i:03d}" for i in range(1000))  # "000" .. "999"
_DIGITS3_STRIPPED: Final = tuple(d.rstrip("0") for d in _DIGITS3)  # "1" for 100; only [0] is empty

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
    "cached_tokens",
    "priced_prompt_tokens",
    "predicted_cached_tokens",
    "prompt_estimated",
    "local_prefill",
    "path_reason",
)
# Fields that records written before them lack; read as their defaults (priced_prompt_tokens: prompt_tokens).
_LATER_FIELDS: Final = {
    "cached_tokens": 0,
    "priced_prompt_tokens": None,
    "predicted_cached_tokens": 0,
    "prompt_estimated": False,
    "local_prefill": False,
    "path_reason": "",
}


class RequestRecord(SlottedValue):
    """One request's outcome. A slotted class with ``Final`` fields rather than a NamedTuple: compiled
    (setup.py), it is built and read natively, once per simulated request."""

    _fields = RECORD_FIELDS
    __slots__ = RECORD_FIELDS

    def __init__(
        self,
        *,  # by keyword only: fifteen fields, several of the same type
        request_id: str,
        slo_class: SloClass,
        prompt_tokens: int,
        target_output_tokens: int,  # what the workload asked for (max_tokens with ignore_eos)
        predicted_output_tokens: int,
        output_tokens: int,  # what was generated
        policy: str,
        prefill_id: str | None,
        decode_id: str | None,
        arrival_s: float,
        prefill_done_s: float | None,
        first_token_s: float | None,
        last_token_s: float | None,
        status: RequestStatus,
        error: str | None = None,
        cached_tokens: int = 0,  # prompt tokens the prefill engine served from its prefix cache
        # What the router priced at admission: the prompt's length (None: prompt_tokens, as in the simulator,
        # where the two are one) and the tokens its prefix index expected the chosen prefill engine to hold;
        # prompt_estimated: that length was estimated from characters (a live prompt with no tokenizer).
        # prompt_tokens and cached_tokens are what the engine reported, where it did.
        priced_prompt_tokens: int | None = None,
        predicted_cached_tokens: int = 0,
        prompt_estimated: bool = False,
        # The path: the decode engine prefilled the prompt itself (prefill_id is then decode_id), and why
        # the router chose the path it did (RouteDecision.reason; empty: it always disaggregates).
        local_prefill: bool = False,
        path_reason: str = "",
    ) -> None:
        self.request_id: Final = request_id
        self.slo_class: Final = slo_class
        self.prompt_tokens: Final = prompt_tokens
        self.target_output_tokens: Final = target_output_tokens
        self.predicted_output_tokens: Final = predicted_output_tokens
        self.output_tokens: Final = output_tokens
        self.policy: Final = policy
        self.prefill_id: Final = prefill_id
        self.decode_id: Final = decode_id
        self.arrival_s: Final = arrival_s
        self.prefill_done_s: Final = prefill_done_s
        self.first_token_s: Final = first_token_s
        self.last_token_s: Final = last_token_s
        self.status: Final = status
        self.error: Final = error
        self.cached_tokens: Final = cached_tokens
        self.priced_prompt_tokens: Final[int] = (
            prompt_tokens if priced_prompt_tokens is None else priced_prompt_tokens
        )
        self.predicted_cached_tokens: Final = predicted_cached_tokens
        self.prompt_estimated: Final = prompt_estimated
        self.local_prefill: Final = local_prefill
        self.path_reason: Final = path_reason

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

    Fast paths give the same string at a fraction of the cost (float formatting is most of writing a
    record). repr of round()'s double is the ".6f" decimal of x minus trailing zeros (one digit kept after
    the point) for 1e-4 <= x < 1e9: that decimal has at most 15 significant digits, so it is the shortest
    string that reads back as round()'s double. Compiled (setup.py), building it from whole microseconds
    is cheaper still; interpreted, it is dearer than ".6f".
    """
    if type(x) is float and 1e-4 <= x < 1e9:
        if _COMPILED:
            s = _time_from_micros(x)
            if s is not None:
                return s
        s = f"{x:.6f}".rstrip("0")
        return s + "0" if s[-1] == "." else s
    # float(): an int time prints as a float, as the compiled build (setup.py) prints it
    return "null" if x is None else repr(round(float(x), 6))


def _time_from_micros(x: float) -> str | None:
    """_time(x) for 1e-4 <= x < 1e9 built from whole microseconds, or None where they cannot be trusted.

    Below 2**40 microseconds, x * 1e6 is within 2**-13 of the exact product, so rounding it to an integer
    gives ".6f"'s digits unless the product lies within 1e-3 of a half: those few get None.
    """
    us = x * 1e6
    if us >= _FAST_US_LIMIT:
        return None
    whole = int(us)  # us > 0: truncation is floor
    frac = us - whole
    if 0.499 < frac < 0.501:
        return None
    n = whole + 1 if frac > 0.5 else whole
    seconds = n // 1_000_000
    micros = n - seconds * 1_000_000
    if micros == 0:
        return f"{seconds}.0"
    # The six zero-padded digits without trailing zeros, from two table reads: str() of an int and a strip
    # cost more than the rest of this function.
    milli = micros // 1000
    rest = micros - milli * 1000
    if rest == 0:
        return f"{seconds}.{_DIGITS3_STRIPPED[milli]}"
    return f"{seconds}.{_DIGITS3[milli]}{_DIGITS3_STRIPPED[rest]}"


# The common enum values as JSON, picked by identity: formatting a StrEnum member builds a new str each time,
# and hashing one (a dict key) runs Python code.
_TIGHT_JSON: Final = '"tight"'
_LOOSE_JSON: Final = '"loose"'
_OK_JSON: Final = '"ok"'


def _slo_json(slo: SloClass) -> str:
    if slo is SloClass.TIGHT:
        return _TIGHT_JSON
    return _LOOSE_JSON if slo is SloClass.LOOSE else _quote(str(slo))


def _status_json(status: RequestStatus) -> str:
    return _OK_JSON if status is RequestStatus.OK else _quote(str(status))


def _memo_quote(s: str, memo: dict[str, str]) -> str:
    """_quote(s), remembered: policy and instance ids repeat on every record (a bounded memo)."""
    q = memo.get(s)
    if q is None:
        q = _quote(s)
        if len(memo) < _MEMO_MAX:
            memo[s] = q
    return q


def _line(rec: RequestRecord, memo: dict[str, str]) -> str:
    """One JSON object and its newline, keys in RECORD_FIELDS order (``memo``: see _memo_quote).

    Formatted by hand: json.dumps of a dict is 3x slower, and writing the simulator's records is a good
    share of its time. Strings go through the same C escaper json.dumps uses; StrEnum members are
    written as their values.
    """
    pre, dec, err = rec.prefill_id, rec.decode_id, rec.error
    return (
        f'{{"request_id":{_quote(rec.request_id)},"slo_class":{_slo_json(rec.slo_class)},'
        f'"prompt_tokens":{rec.prompt_tokens},"target_output_tokens":{rec.target_output_tokens},'
        f'"predicted_output_tokens":{rec.predicted_output_tokens},"output_tokens":{rec.output_tokens},'
        f'"policy":{_memo_quote(rec.policy, memo)},'
        f'"prefill_id":{"null" if pre is None else _memo_quote(pre, memo)},'
        f'"decode_id":{"null" if dec is None else _memo_quote(dec, memo)},"arrival_s":{_time(rec.arrival_s)},'
        f'"prefill_done_s":{_time(rec.prefill_done_s)},"first_token_s":{_time(rec.first_token_s)},'
        f'"last_token_s":{_time(rec.last_token_s)},"status":{_status_json(rec.status)},'
        f'"error":{"null" if err is None else _quote(err)},"cached_tokens":{rec.cached_tokens},'
        f'"priced_prompt_tokens":{rec.priced_prompt_tokens},'
        f'"predicted_cached_tokens":{rec.predicted_cached_tokens},'
        f'"prompt_estimated":{"true" if rec.prompt_estimated else "false"},'
        f'"local_prefill":{"true" if rec.local_prefill else "false"},'
        f'"path_reason":{_memo_quote(rec.path_reason, memo)}}}\n'
    )


def record_to_json(rec: RequestRecord) -> str:
    """One JSON object, keys in RECORD_FIELDS order."""
    return _line(rec, {})[:-1]


def _bool(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value


def record_from_json(line: str) -> RequestRecord:
    try:
        d = json.loads(line)
        missing = [f for f in RECORD_FIELDS if f not in d and f not in _LATER_FIELDS]
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
            cached_tokens=int(d.get("cached_tokens", 0)),
            priced_prompt_tokens=None if (priced := d.get("priced_prompt_tokens")) is None else int(priced),
            predicted_cached_tokens=int(d.get("predicted_cached_tokens", 0)),
            prompt_estimated=_bool(d.get("prompt_estimated", False), "prompt_estimated"),
            local_prefill=_bool(d.get("local_prefill", False), "local_prefill"),
            path_reason=str(d.get("path_reason", "")),
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
        self._quoted: dict[str, str] = {}

    def write(self, rec: RequestRecord) -> None:
        self._stream.write(_line(rec, self._quoted))
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
