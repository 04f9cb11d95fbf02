"""Trace loaders for Azure LLM CSV, Mooncake JSONL, Splitwise/Vidur CSV and lengths-only CSV files.

The format is detected from the content, not the file name. Timed traces are sorted by arrival (stably),
shifted to start at 0 and optionally rescaled; lengths-only traces get seeded synthetic arrivals. Mooncake's
``hash_ids`` become the requests' ``prefix_blocks`` (full blocks only); the other formats name none.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import numpy.typing as npt

from calroute.errors import ConfigError, TraceFormatError
from calroute.types import PREFIX_BLOCK_TOKENS, RequestSpec, SloClass
from calroute.workload.arrivals import bursty_arrivals, poisson_arrivals

AZURE_CSV = "azure-csv"
MOONCAKE_JSONL = "mooncake-jsonl"
SPLITWISE_CSV = "splitwise-csv"
LENGTHS_CSV = "lengths-csv"
TRACE_FORMATS = (AZURE_CSV, MOONCAKE_JSONL, SPLITWISE_CSV, LENGTHS_CSV)
ARRIVAL_PROCESSES = ("poisson", "bursty")

_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_SPLITWISE_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
_LENGTHS_COLUMNS = ("num_prefill_tokens", "num_decode_tokens")
_MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")

# Distinct from the family generator's streams, so a trace and a family with one seed stay independent.
_ARRIVAL_STREAM = 11
_SLO_STREAM = 12

# Azure writes 7 fractional digits; datetime.fromisoformat in Python 3.11 accepts at most 6.
_EXCESS_FRACTION = re.compile(r"(\.\d{6})\d+")


@dataclass(frozen=True)
class Trace:
    """A loaded trace. ``scale_factor`` multiplies the native arrival rate (1.0 when times are untouched)."""

    requests: list[RequestSpec]
    format: str
    native_rate_rps: float | None
    scale_factor: float
    source: str
    clamped: int = 0  # rows whose prompt or output was raised to 1 token (the simulator needs both >= 1)


@dataclass
class _Columns:
    times_s: list[float] | None
    prompt_tokens: list[int]
    output_tokens: list[int]
    prefix_blocks: list[tuple[int, ...]] | None = None  # Mooncake's hash_ids, full blocks only


def _number(value: object) -> float:
    """A JSON number or numeric CSV text as a float; NaN for anything else (booleans included)."""
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return math.nan
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return math.nan


def _tokens(path: Path, line: int, column: str, value: object) -> int:
    number = _number(value)
    if not number.is_integer():  # also rejects NaN and infinities
        raise TraceFormatError(f"{path}:{line}: {column} must be an integer token count, got {value!r}")
    if number < 0:
        raise TraceFormatError(f"{path}:{line}: {column} must be >= 0, got {value!r}")
    return int(number)


def _seconds(path: Path, line: int, column: str, value: object, unit_s: float) -> float:
    number = _number(value)
    if not math.isfinite(number):
        raise TraceFormatError(f"{path}:{line}: {column} must be a finite number, got {value!r}")
    if number < 0:
        raise TraceFormatError(f"{path}:{line}: {column} must be >= 0, got {value!r}")
    return number * unit_s


def _timestamp(path: Path, line: int, value: str) -> datetime:
    try:
        return datetime.fromisoformat(_EXCESS_FRACTION.sub(r"\1", value.strip()))
    except ValueError:
        raise TraceFormatError(
            f"{path}:{line}: TIMESTAMP must look like 2023-11-16 18:17:03.9799600, got {value!r}"
        ) from None


def _read_text(path: Path) -> str:
    try:
        with path.open(encoding="utf-8-sig", newline="") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise TraceFormatError(f"{path}: not a UTF-8 text file ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise ConfigError(f"cannot read trace file {path}: {e.strerror or e}") from None


def _detect(path: Path, text: str) -> str:
    first = next((line for line in text.split("\n") if line.strip()), None)
    if first is None:
        raise TraceFormatError(f"{path}: empty trace file")
    if first.lstrip().startswith("{"):
        try:
            if isinstance(json.loads(first), dict):
                return MOONCAKE_JSONL
        except json.JSONDecodeError:
            pass
    header = {name.strip() for name in next(csv.reader([first]))}
    for fmt, columns in (
        (AZURE_CSV, _AZURE_COLUMNS),
        (SPLITWISE_CSV, _SPLITWISE_COLUMNS),
        (LENGTHS_CSV, _LENGTHS_COLUMNS),
    ):
        if set(columns) <= header:
            return fmt
    raise TraceFormatError(
        f"{path}: unrecognised trace format; expected a CSV header with {','.join(_AZURE_COLUMNS)} (Azure), "
        f"{','.join(_SPLITWISE_COLUMNS)} (Splitwise/Vidur) or {','.join(_LENGTHS_COLUMNS)} (lengths only), "
        f"or JSON Lines objects with keys {', '.join(_MOONCAKE_KEYS)} (Mooncake); "
        f"the first line is {first.strip()[:100]!r}"
    )


def _parse_csv(path: Path, text: str, fmt: str) -> _Columns:
    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(row for row in reader if any(field.strip() for field in row))
    index: dict[str, int] = {}
    for i, name in enumerate(header):
        index.setdefault(name.strip(), i)
    time_col, prompt_col, output_col = {
        AZURE_CSV: _AZURE_COLUMNS,
        SPLITWISE_CSV: _SPLITWISE_COLUMNS,
        LENGTHS_CSV: (None, *_LENGTHS_COLUMNS),
    }[fmt]
    assert prompt_col is not None and output_col is not None
    wanted = [c for c in (time_col, prompt_col, output_col) if c is not None]
    needed_fields = max(index[c] for c in wanted) + 1

    stamps: list[datetime] = []
    times_s: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    for row in reader:
        line = reader.line_num
        if not any(field.strip() for field in row):
            continue
        if len(row) < needed_fields:
            raise TraceFormatError(
                f"{path}:{line}: missing columns: {len(row)} fields, need {', '.join(wanted)} "
                f"(header has {len(header)} fields)"
            )
        prompts.append(_tokens(path, line, prompt_col, row[index[prompt_col]]))
        outputs.append(_tokens(path, line, output_col, row[index[output_col]]))
        if fmt == AZURE_CSV:
            stamps.append(_timestamp(path, line, row[index["TIMESTAMP"]]))
        elif time_col is not None:
            times_s.append(_seconds(path, line, time_col, row[index[time_col]], 1.0))

    if fmt == AZURE_CSV and stamps:
        # Differences of datetimes, not .timestamp(): naive times must not be read in the local time zone.
        try:
            first = min(stamps)
            times_s = [(stamp - first).total_seconds() for stamp in stamps]
        except TypeError:
            raise TraceFormatError(f"{path}: mixes timestamps with and without a time zone") from None
    return _Columns(None if time_col is None else times_s, prompts, outputs)


def _hash_ids(path: Path, line: int, value: object, input_length: int) -> tuple[int, ...]:
    """Mooncake's ``hash_ids`` as the prompt's full prefix blocks (RequestSpec.prefix_blocks).

    The trace names every block of the prompt, the last one too when it is partial. A partial block is not
    a prefix block: vLLM caches only full blocks, and two prompts whose last ids agree share only as many
    of that block's tokens as the shorter has, which the id cannot tell. So the ids past the prompt's full
    blocks are dropped.
    """
    if not isinstance(value, list):
        raise TraceFormatError(f"{path}:{line}: hash_ids must be a list of block ids, got {value!r}")
    for block in value:
        if isinstance(block, bool) or not isinstance(block, int) or block < 0:
            raise TraceFormatError(f"{path}:{line}: hash_ids must hold non-negative integers, got {block!r}")
    most = -(-input_length // PREFIX_BLOCK_TOKENS)
    if len(value) > most:
        raise TraceFormatError(
            f"{path}:{line}: hash_ids names {len(value)} blocks, but input_length {input_length} fills at "
            f"most {most} blocks of {PREFIX_BLOCK_TOKENS} tokens"
        )
    return tuple(value[: input_length // PREFIX_BLOCK_TOKENS])


def _parse_jsonl(path: Path, text: str) -> _Columns:
    times_s: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    blocks: list[tuple[int, ...]] = []
    for line, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as e:
            raise TraceFormatError(f"{path}:{line}: not valid JSON ({e.msg})") from None
        if not isinstance(record, dict):
            raise TraceFormatError(f"{path}:{line}: expected a JSON object, got {type(record).__name__}")
        missing = [key for key in _MOONCAKE_KEYS if key not in record]
        if missing:
            raise TraceFormatError(f"{path}:{line}: missing keys: {', '.join(missing)}")
        times_s.append(_seconds(path, line, "timestamp", record["timestamp"], 1e-3))
        prompts.append(_tokens(path, line, "input_length", record["input_length"]))
        outputs.append(_tokens(path, line, "output_length", record["output_length"]))
        hash_ids = record.get("hash_ids")
        blocks.append(() if hash_ids is None else _hash_ids(path, line, hash_ids, prompts[-1]))
    return _Columns(times_s, prompts, outputs, blocks)


def _check_args(
    seed: int,
    tight_fraction: float,
    rate_rps: float | None,
    time_scale: float | None,
    limit: int | None,
    arrival: str,
) -> None:
    if seed < 0:
        raise ConfigError(f"seed must be >= 0, got {seed}")
    if not 0.0 <= tight_fraction <= 1.0:
        raise ConfigError(f"tight_fraction must be in [0, 1], got {tight_fraction}")
    if rate_rps is not None and time_scale is not None:
        raise ConfigError("give either rate_rps or time_scale to rescale a trace, not both")
    if rate_rps is not None and not (math.isfinite(rate_rps) and rate_rps > 0):
        raise ConfigError(f"rate_rps must be a positive finite number, got {rate_rps}")
    if time_scale is not None and not (math.isfinite(time_scale) and time_scale > 0):
        raise ConfigError(f"time_scale must be a positive finite number, got {time_scale}")
    if limit is not None and limit < 1:
        raise ConfigError(f"limit must be >= 1, got {limit}")
    if arrival not in ARRIVAL_PROCESSES:
        raise ConfigError(f"unknown arrival process {arrival!r}; known: {', '.join(ARRIVAL_PROCESSES)}")


def load_trace(
    path: Path,
    *,
    seed: int = 0,
    tight_fraction: float = 0.5,
    rate_rps: float | None = None,
    time_scale: float | None = None,
    limit: int | None = None,
    arrival: str = "poisson",
    offset: int = 0,
) -> Trace:
    """Load a trace file as requests ``t000000``, ``t000001``, ... in arrival order.

    For timed traces ``rate_rps`` rescales the inter-arrival times so the mean rate over the kept requests is
    ``rate_rps``, and ``time_scale`` divides the arrival times instead. Lengths-only traces need ``rate_rps``
    and draw ``arrival`` ("poisson" or "bursty") arrivals from ``seed``. ``limit`` keeps the first requests in
    arrival order (file order for lengths-only traces) after skipping ``offset`` of them, before any of this
    (a window of the trace, its arrivals then counted from its first request).
    """
    if offset < 0:
        raise ConfigError(f"offset must be >= 0, got {offset}")
    end = None if limit is None else offset + limit
    _check_args(seed, tight_fraction, rate_rps, time_scale, limit, arrival)
    path = Path(path)
    text = _read_text(path)
    fmt = _detect(path, text)
    columns = _parse_jsonl(path, text) if fmt == MOONCAKE_JSONL else _parse_csv(path, text, fmt)
    if not columns.prompt_tokens:
        raise TraceFormatError(f"{path}: no requests (only a header or blank lines)")
    if offset >= len(columns.prompt_tokens):
        raise ConfigError(f"{path}: offset {offset} skips all {len(columns.prompt_tokens)} requests")

    prompt_tokens = np.array(columns.prompt_tokens, dtype=np.int64)
    output_tokens = np.array(columns.output_tokens, dtype=np.int64)
    prefix_blocks: list[tuple[int, ...]] | None = None
    native_rate_rps: float | None = None
    scale_factor = 1.0
    arrivals_s: npt.NDArray[np.float64]
    if columns.times_s is None:
        if rate_rps is None:
            raise ConfigError(f"{path}: lengths-only traces have no arrival times and need a rate (--rate)")
        if time_scale is not None:
            raise ConfigError(f"{path}: time_scale needs a timed trace; this one is lengths-only")
        prompt_tokens, output_tokens = prompt_tokens[offset:end], output_tokens[offset:end]
        if columns.prefix_blocks is not None:
            prefix_blocks = list(columns.prefix_blocks[offset:end])
        rng = np.random.default_rng([seed, _ARRIVAL_STREAM])
        make_arrivals = bursty_arrivals if arrival == "bursty" else poisson_arrivals
        arrivals_s = make_arrivals(rate_rps, len(prompt_tokens), rng)
    else:
        if arrival != "poisson":
            raise ConfigError(f"{path}: arrival={arrival!r} applies only to lengths-only traces")
        times_s = np.array(columns.times_s, dtype=np.float64)
        order = np.argsort(times_s, kind="stable")[offset:end]
        arrivals_s = times_s[order] - times_s[order[0]]
        prompt_tokens, output_tokens = prompt_tokens[order], output_tokens[order]
        if columns.prefix_blocks is not None:
            prefix_blocks = [columns.prefix_blocks[i] for i in order.tolist()]
        span_s = float(arrivals_s[-1])
        if len(arrivals_s) >= 2 and span_s > 0:
            native_rate_rps = (len(arrivals_s) - 1) / span_s
        if rate_rps is not None:
            if native_rate_rps is None:
                raise ConfigError(
                    f"{path}: cannot rescale to rate_rps={rate_rps}: the kept requests span no time "
                    f"({len(arrivals_s)} request(s)); use time_scale or a larger limit"
                )
            scale_factor = rate_rps / native_rate_rps
        elif time_scale is not None:
            scale_factor = time_scale
        if scale_factor != 1.0:
            arrivals_s = arrivals_s / scale_factor

    clamped = int(np.count_nonzero((prompt_tokens < 1) | (output_tokens < 1)))
    prompt_tokens = np.maximum(prompt_tokens, 1)
    output_tokens = np.maximum(output_tokens, 1)
    tight = np.random.default_rng([seed, _SLO_STREAM]).random(len(prompt_tokens)) < tight_fraction
    blocks = prefix_blocks if prefix_blocks is not None else [()] * len(prompt_tokens)
    requests = [
        RequestSpec(f"t{i:06d}", t_s, p, o, SloClass.TIGHT if is_tight else SloClass.LOOSE, b)
        for i, (t_s, p, o, is_tight, b) in enumerate(
            zip(
                arrivals_s.tolist(),
                prompt_tokens.tolist(),
                output_tokens.tolist(),
                tight.tolist(),
                blocks,
                strict=True,
            )
        )
    ]
    return Trace(requests, fmt, native_rate_rps, scale_factor, str(path), clamped)
