"""Token-id prompts: exact length, valid ids, deterministic, distinct per request from the first block."""

from __future__ import annotations

import json

import pytest

from calroute.errors import ConfigError
from calroute.harness.prompts import prompt_ids, prompt_json
from calroute.workload.tokens import DEFAULT_VOCAB_SIZE, FIRST_TOKEN_ID

KV_BLOCK_TOKENS = 16


@pytest.mark.parametrize("length", [1, 2, 4, 5, 16, 17, 300, 4096])
def test_exact_length_and_valid_ids(length: int) -> None:
    for key in (0, 7, 123_456, "r000001"):
        ids = prompt_ids(key, length, seed=3)
        assert len(ids) == length
        assert all(type(t) is int and FIRST_TOKEN_ID <= t < DEFAULT_VOCAB_SIZE for t in ids)


def test_deterministic_and_seeded() -> None:
    assert prompt_ids(5, 64, seed=1) == prompt_ids(5, 64, seed=1)
    assert prompt_ids("r5", 64, seed=1) == prompt_ids("r5", 64, seed=1)
    assert prompt_ids(5, 64, seed=1) != prompt_ids(5, 64, seed=2)
    # A longer prompt of the same request extends the shorter one (a pure function of position).
    assert prompt_ids(5, 100)[:64] == prompt_ids(5, 64)


def test_fixed_values_do_not_drift() -> None:
    # Pinned: a change here changes every live run's prompts (and so their prefix-cache behaviour).
    assert prompt_ids(0, 8) == [10, 10, 10, 10, 245, 298, 588, 335]
    assert prompt_ids("r1", 6) == [101, 749, 359, 830, 292, 373]
    assert prompt_ids(123_456, 7, seed=3) == [10, 10, 134, 706, 464, 51, 498]
    assert prompt_ids("gate:greedy:64", 5) == [527, 842, 844, 806, 759]


def test_distinct_first_kv_block_for_every_index() -> None:
    firsts = {tuple(prompt_ids(i, KV_BLOCK_TOKENS, seed=0)) for i in range(5000)}
    assert len(firsts) == 5000
    # Integer keys spell the index in the first four tokens: distinct whatever the rest.
    assert prompt_ids(990, 4) == [10, 10, 11, 10] and prompt_ids(989, 4) == [10, 10, 10, 999]
    assert len({tuple(prompt_ids(f"r{i:06d}", KV_BLOCK_TOKENS)) for i in range(5000)}) == 5000


@pytest.mark.parametrize("length", [1, 3, 17, 1000])
def test_json_form_is_the_same_prompt(length: int) -> None:
    for key in (0, 99, "x"):
        raw = prompt_json(key, length, seed=9)
        assert json.loads(raw) == prompt_ids(key, length, seed=9)
        assert raw.startswith(b"[") and raw.endswith(b"]") and b"\n" not in raw


@pytest.mark.parametrize(("key", "length"), [(0, 0), (0, -3), (-1, 10)])
def test_bad_arguments(key: int, length: int) -> None:
    with pytest.raises(ConfigError):
        prompt_ids(key, length)
