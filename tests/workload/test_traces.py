"""Trace loaders: the vendored traces, rate scaling, limits, synthetic arrivals and malformed files."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from calroute.errors import ConfigError, TraceFormatError
from calroute.types import SloClass
from calroute.workload.reuse import unbounded_reuse
from calroute.workload.traces import Trace, load_trace

TRACES_DIR = Path(__file__).resolve().parents[2] / "data" / "traces"
AZURE = TRACES_DIR / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
MOONCAKE = TRACES_DIR / "mooncake_fast25" / "synthetic_trace.jsonl"
VIDUR = (
    TRACES_DIR
    / "vidur_arxiv_summarization_lengths"
    / "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"
)


@pytest.fixture(scope="module")
def azure() -> Trace:
    return load_trace(AZURE)


def _arrivals(trace: Trace) -> npt.NDArray[np.float64]:
    return np.array([r.arrival_s for r in trace.requests])


# Expected statistics from data/traces/README.md (native rate: 3,992 gaps over 1,022 s for Mooncake).
@pytest.mark.parametrize(
    ("path", "fmt", "count", "native_rate_rps", "mean_prompt", "mean_output"),
    [
        (AZURE, "azure-csv", 19_366, 5.5, 1_155, 211),
        (MOONCAKE, "mooncake-jsonl", 3_993, 3.9, 15_325, 149),
        (VIDUR, "lengths-csv", 28_257, None, 2_588, 291),
    ],
)
def test_vendored_traces(
    path: Path,
    fmt: str,
    count: int,
    native_rate_rps: float | None,
    mean_prompt: float,
    mean_output: float | None,
) -> None:
    trace = load_trace(path, rate_rps=None if native_rate_rps else 4.0)
    assert trace.format == fmt
    assert len(trace.requests) == count
    assert trace.source == str(path)
    arrivals_s = _arrivals(trace)
    assert np.all(np.diff(arrivals_s) >= 0)
    if native_rate_rps is None:
        assert trace.native_rate_rps is None
        assert arrivals_s[0] > 0
        assert count / arrivals_s[-1] == pytest.approx(4.0, rel=0.05)
    else:
        assert arrivals_s[0] == 0.0
        assert trace.native_rate_rps == pytest.approx(native_rate_rps, rel=0.02)
        assert trace.scale_factor == 1.0
    assert np.mean([r.prompt_tokens for r in trace.requests]) == pytest.approx(mean_prompt, rel=0.005)
    if mean_output is not None:
        assert np.mean([r.output_tokens for r in trace.requests]) == pytest.approx(mean_output, rel=0.005)
    assert min(min(r.prompt_tokens, r.output_tokens) for r in trace.requests) >= 1
    assert [r.request_id for r in trace.requests[:2]] == ["t000000", "t000001"]


def test_azure_span_and_speed() -> None:
    start = time.perf_counter()
    trace = load_trace(AZURE)
    assert time.perf_counter() - start < 1.0
    # 18:15:46.68 to 19:14:08.40 (the first and last rows of the file).
    assert trace.requests[-1].arrival_s == pytest.approx(3501.722, abs=1e-3)
    assert trace.requests[0].prompt_tokens == 374
    assert trace.requests[0].output_tokens == 44


@pytest.mark.parametrize("rate_rps", [1.0, 20.0, 100.0])
def test_rate_scaling(azure: Trace, rate_rps: float) -> None:
    scaled = load_trace(AZURE, rate_rps=rate_rps)
    n = len(scaled.requests)
    assert (n - 1) / scaled.requests[-1].arrival_s == pytest.approx(rate_rps, rel=1e-9)
    assert scaled.native_rate_rps == azure.native_rate_rps
    assert azure.native_rate_rps is not None
    assert scaled.scale_factor == pytest.approx(rate_rps / azure.native_rate_rps)
    np.testing.assert_allclose(_arrivals(scaled) * scaled.scale_factor, _arrivals(azure), rtol=1e-12)
    assert [r[2:] for r in scaled.requests] == [r[2:] for r in azure.requests]


def test_time_scale(azure: Trace) -> None:
    scaled = load_trace(AZURE, time_scale=4.0)
    assert scaled.scale_factor == 4.0
    np.testing.assert_allclose(_arrivals(scaled), _arrivals(azure) / 4.0)


def test_rate_and_time_scale_together_rejected() -> None:
    with pytest.raises(ConfigError, match="rate_rps or time_scale"):
        load_trace(AZURE, rate_rps=10.0, time_scale=2.0)


def test_limit_applies_before_rate(azure: Trace) -> None:
    limited = load_trace(AZURE, limit=500)
    assert limited.requests == azure.requests[:500]
    assert limited.native_rate_rps == pytest.approx(499 / azure.requests[499].arrival_s)
    scaled = load_trace(MOONCAKE, limit=1000, rate_rps=50.0)
    assert len(scaled.requests) == 1000
    assert 999 / scaled.requests[-1].arrival_s == pytest.approx(50.0)


def test_lengths_only_needs_a_rate() -> None:
    with pytest.raises(ConfigError, match="need a rate"):
        load_trace(VIDUR)
    with pytest.raises(ConfigError, match="time_scale"):
        load_trace(VIDUR, rate_rps=1.0, time_scale=2.0)


def test_lengths_only_arrivals_are_seeded_and_selectable() -> None:
    poisson = load_trace(VIDUR, rate_rps=2.0, limit=3000, seed=1)
    again = load_trace(VIDUR, rate_rps=2.0, limit=3000, seed=1)
    other = load_trace(VIDUR, rate_rps=2.0, limit=3000, seed=2)
    bursty = load_trace(VIDUR, rate_rps=2.0, limit=3000, seed=1, arrival="bursty")
    assert poisson == again
    assert _arrivals(other).tolist() != _arrivals(poisson).tolist()
    # Lengths come from the file in file order, whatever the arrival process.
    assert [r[2:4] for r in bursty.requests] == [r[2:4] for r in poisson.requests]
    assert poisson.requests[0][2:4] == (3772, 54)
    gaps = {name: np.diff(_arrivals(t)) for name, t in (("poisson", poisson), ("bursty", bursty))}
    assert gaps["bursty"].std() / gaps["bursty"].mean() > gaps["poisson"].std() / gaps["poisson"].mean() + 0.1


def test_arrival_choice_only_for_lengths_only_traces() -> None:
    with pytest.raises(ConfigError, match="lengths-only"):
        load_trace(AZURE, arrival="bursty")
    with pytest.raises(ConfigError, match="arrival"):
        load_trace(VIDUR, rate_rps=1.0, arrival="gamma")


@pytest.mark.parametrize("tight_fraction", [0.0, 0.25, 1.0])
def test_slo_classes_seeded(tight_fraction: float) -> None:
    trace = load_trace(MOONCAKE, tight_fraction=tight_fraction, seed=3)
    share = np.mean([r.slo_class is SloClass.TIGHT for r in trace.requests])
    assert share == pytest.approx(tight_fraction, abs=0.025)
    assert load_trace(MOONCAKE, tight_fraction=tight_fraction, seed=3) == trace


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"rate_rps": 0.0}, "rate_rps"),
        ({"time_scale": -1.0}, "time_scale"),
        ({"limit": 0}, "limit"),
        ({"tight_fraction": 2.0}, "tight_fraction"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_arguments(kwargs: dict[str, float], param: str) -> None:
    with pytest.raises(ConfigError, match=param):
        load_trace(AZURE, **kwargs)  # type: ignore[arg-type]


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read trace file"):
        load_trace(tmp_path / "nope.csv")


# --- small hand-written files -------------------------------------------------------------------------------


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8", newline="")
    return path


AZURE_UNSORTED = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
    "2023-11-16 18:17:05.5000000,30,3\r\n"
    "2023-11-16 18:17:03.9799600,10,1\r\n"
    "2023-11-16 18:17:04.0000001,20,2\r\n"
    "2023-11-16 18:17:05.5000000,40,4\r\n"
)


def test_unsorted_azure_rows_get_sorted_stably(tmp_path: Path) -> None:
    # A .txt name on purpose: detection reads the content.
    trace = load_trace(_write(tmp_path, "trace.txt", AZURE_UNSORTED))
    assert trace.format == "azure-csv"
    assert [r.prompt_tokens for r in trace.requests] == [10, 20, 30, 40]
    np.testing.assert_allclose(_arrivals(trace), [0.0, 0.02004, 1.52004, 1.52004], atol=1e-6)
    assert trace.native_rate_rps == pytest.approx(3 / 1.52004)


def test_splitwise_csv(tmp_path: Path) -> None:
    text = "arrived_at,num_prefill_tokens,num_decode_tokens\n0.5,100,10\n0.25,200,20\n\n2.25,300,0\n"
    trace = load_trace(_write(tmp_path, "splitwise_conv.csv", text), rate_rps=1.0)
    assert trace.format == "splitwise-csv"
    assert [r[1:4] for r in trace.requests] == [(0.0, 200, 20), (0.25, 100, 10), (2.0, 300, 1)]
    assert trace.native_rate_rps == pytest.approx(1.0)
    assert trace.scale_factor == pytest.approx(1.0)
    assert trace.clamped == 1


def test_mooncake_detected_by_content_and_ms_converted(tmp_path: Path) -> None:
    text = (
        '{"timestamp": 1000, "input_length": 5, "output_length": 2, "hash_ids": [1]}\n'
        '{"timestamp": 3000, "input_length": 0, "output_length": 7}\n'
    )
    trace = load_trace(_write(tmp_path, "mooncake.csv", text))
    assert trace.format == "mooncake-jsonl"
    assert [r[1:4] for r in trace.requests] == [(0.0, 5, 2), (2.0, 1, 7)]
    assert trace.native_rate_rps == pytest.approx(0.5)
    assert trace.clamped == 1


@pytest.mark.parametrize(
    ("name", "text", "pattern"),
    [
        ("empty.csv", "", "empty trace file"),
        ("blank.csv", "\n  \n", "empty trace file"),
        ("header_only.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n", "no requests"),
        ("unknown.csv", "time,prompt,output\n1,2,3\n", "unrecognised trace format.*expected"),
        ("array.jsonl", "[1, 2, 3]\n", "unrecognised trace format"),
        (
            "azure_bad_tokens.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,10,1\n"
            "2023-11-16 18:17:04.1,1.5,2\n",
            r":3: ContextTokens must be an integer",
        ),
        (
            "azure_negative.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,10,-1\n",
            r":2: GeneratedTokens must be >= 0",
        ),
        (
            "azure_missing.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,10,1\n\n"
            "2023-11-16 18:17:04.0,7\n",
            r":4: missing columns",
        ),
        (
            "azure_bad_time.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,10,1\n",
            r":2: TIMESTAMP must look like",
        ),
        (
            "lengths_text.csv",
            "num_prefill_tokens,num_decode_tokens\n10,1\n20,many\n",
            r":3: num_decode_tokens must be an integer",
        ),
        (
            "splitwise_bad_time.csv",
            "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,1,1\nnan,1,1\n",
            r":3: arrived_at must be a finite number",
        ),
        (
            "mooncake_bad_json.jsonl",
            '{"timestamp": 0, "input_length": 1, "output_length": 1}\n{"timestamp": 5,\n',
            r":2: not valid JSON",
        ),
        (
            "mooncake_missing_key.jsonl",
            '{"timestamp": 0, "input_length": 1, "output_length": 1}\n\n'
            '{"timestamp": 5, "input_length": 1}\n',
            r":3: missing keys: output_length",
        ),
        (
            "mooncake_float_tokens.jsonl",
            '{"timestamp": 0, "input_length": 1.5, "output_length": 1}\n',
            r":1: input_length must be an integer",
        ),
    ],
)
def test_bad_files_name_file_and_line(tmp_path: Path, name: str, text: str, pattern: str) -> None:
    path = _write(tmp_path, name, text)
    with pytest.raises(TraceFormatError, match=pattern) as info:
        load_trace(path, rate_rps=1.0)
    assert str(path) in str(info.value)


def test_rescaling_needs_a_time_span(tmp_path: Path) -> None:
    path = _write(tmp_path, "one.jsonl", '{"timestamp": 7, "input_length": 3, "output_length": 2}\n')
    single = load_trace(path)
    assert single.native_rate_rps is None
    assert single.requests[0].arrival_s == 0.0
    with pytest.raises(ConfigError, match="span no time"):
        load_trace(path, rate_rps=5.0)


# --- Mooncake hash_ids: the prompts' prefix blocks ------------------------------------------------------


def test_mooncake_hash_ids_become_full_prefix_blocks() -> None:
    trace = load_trace(MOONCAKE)
    # The file's first record: 40,160 tokens, hash_ids 0..78; the 79th block holds 224 tokens, dropped.
    assert trace.requests[0].prefix_blocks == tuple(range(78))
    assert all(len(r.prefix_blocks) == r.prompt_tokens // 512 for r in trace.requests)
    # The figure: 64 % of the raw hash_ids repeat an earlier prompt's leading blocks. Counting
    # full blocks only, 65.9 % of them hit an unbounded cache, 65.0 % of all prompt tokens.
    stats = unbounded_reuse(trace.requests)
    assert stats.block_hit_ratio == pytest.approx(0.659, abs=0.001)
    assert stats.hit_ratio == pytest.approx(0.650, abs=0.001)
    assert all(r.prefix_blocks == () for r in load_trace(AZURE, limit=100).requests)


def test_mooncake_blocks_follow_their_requests(tmp_path: Path) -> None:
    text = (
        '{"timestamp": 2000, "input_length": 1100, "output_length": 2, "hash_ids": [1, 2, 3]}\n'
        '{"timestamp": 0, "input_length": 1024, "output_length": 2, "hash_ids": [1, 4]}\n'
        '{"timestamp": 1000, "input_length": 600, "output_length": 2}\n'
        '{"timestamp": 3000, "input_length": 1100, "output_length": 2, "hash_ids": [1]}\n'
        '{"timestamp": 4000, "input_length": 0, "output_length": 2, "hash_ids": []}\n'
    )
    trace = load_trace(_write(tmp_path, "blocks.jsonl", text))
    # Sorted by arrival with their lengths; a partial last block dropped; fewer ids than blocks kept as given.
    assert [(r.prompt_tokens, r.prefix_blocks) for r in trace.requests] == [
        (1024, (1, 4)),
        (600, ()),
        (1100, (1, 2)),
        (1100, (1,)),
        (1, ()),
    ]
    limited = load_trace(_write(tmp_path, "blocks.jsonl", text), limit=2, rate_rps=3.0)
    assert [r.prefix_blocks for r in limited.requests] == [(1, 4), ()]


@pytest.mark.parametrize(
    ("hash_ids", "pattern"),
    [
        ('"1,2"', "hash_ids must be a list of block ids"),
        ("{}", "hash_ids must be a list of block ids"),
        ("[1, -2]", r"hash_ids must hold non-negative integers, got -2"),
        ("[1, 2.0]", r"hash_ids must hold non-negative integers, got 2.0"),
        ("[true]", r"hash_ids must hold non-negative integers, got True"),
        ('["7"]', r"hash_ids must hold non-negative integers, got '7'"),
        ("[1, 2, 3]", r"hash_ids names 3 blocks, but input_length 1024 fills at most 2 blocks of 512 tokens"),
    ],
)
def test_mooncake_bad_hash_ids_name_file_line_and_field(tmp_path: Path, hash_ids: str, pattern: str) -> None:
    text = (
        '{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [5, 6]}\n\n'
        f'{{"timestamp": 5, "input_length": 1024, "output_length": 1, "hash_ids": {hash_ids}}}\n'
    )
    path = _write(tmp_path, "bad_hash_ids.jsonl", text)
    with pytest.raises(TraceFormatError, match=f":3: {pattern}") as info:
        load_trace(path)
    assert str(path) in str(info.value)


def test_trace_windows_replay_distinct_stretches_by_seed() -> None:
    from calroute.workload.source import TraceWorkload

    path = (
        Path(__file__).resolve().parents[2] / "data" / "traces" / "mooncake_fast25" / "synthetic_trace.jsonl"
    )
    whole = load_trace(path).requests
    source = TraceWorkload(path, 4000, windows=10)
    first, second, wrapped = (source.requests(1.0, s) for s in (0, 1, 10))
    n = len(whole) // 10
    assert len(first) == len(second) == n
    assert [r.prompt_tokens for r in second] == [r.prompt_tokens for r in whole[n : 2 * n]]
    assert [r.prefix_blocks for r in second] == [r.prefix_blocks for r in whole[n : 2 * n]]
    assert second[0].arrival_s == 0.0  # a window's clock starts at its first request
    assert [r.prompt_tokens for r in wrapped] == [r.prompt_tokens for r in first]
    with pytest.raises(ConfigError, match="offset"):
        load_trace(path, offset=len(whole))
