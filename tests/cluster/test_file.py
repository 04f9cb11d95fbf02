"""The cluster file's tokenizer field: what a file names, what a file without it means, and the tokenizer the
CLI builds from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from calroute.cli.common import load_tokenizer
from calroute.cluster.file import EMULATOR_TOKENIZER, ClusterFile
from calroute.contract.tokenizer import AsyncTokenizer
from calroute.emulator.api import EmulatorTokenizer
from calroute.errors import ConfigError
from calroute.proxy.engine_tokenizer import EngineTokenizer


def cluster(kind: str = "vllm", **extra: Any) -> dict[str, Any]:
    return {
        "kind": kind,
        "model": "m",
        "max_model_len": 2048,
        "engines": [
            {"id": "p0", "role": "prefill", "url": "http://127.0.0.1:1", "kv_capacity_tokens": 1000},
            {"id": "d0", "role": "decode", "url": "http://127.0.0.1:2", "kv_capacity_tokens": 1000},
        ],
        **extra,
    }


@pytest.mark.parametrize(
    ("kind", "extra", "expected"),
    [
        ("emulated", {}, EMULATOR_TOKENIZER),  # files written before the field: the emulator's, as then
        ("vllm", {}, None),
        ("external", {}, None),
        ("vllm", {"tokenizer": "/models/qwen"}, "/models/qwen"),
        ("emulated", {"tokenizer": None}, None),
    ],
    ids=["emulated, no field", "vllm, no field", "external, no field", "a folder", "emulated, none"],
)
def test_the_tokenizer_a_file_names(kind: str, extra: dict[str, Any], expected: str | None) -> None:
    assert ClusterFile.from_dict(cluster(kind, **extra)).tokenizer == expected


def test_a_relative_folder_is_read_from_the_cluster_files_folder(tmp_path: Path) -> None:
    path = tmp_path / "deploy" / "cluster.yaml"
    ClusterFile.from_dict(cluster(tokenizer="models/qwen")).save(path)
    assert ClusterFile.load(path).tokenizer == str(tmp_path / "deploy" / "models" / "qwen")


@pytest.mark.parametrize("bad", ["", 5])
def test_a_bad_tokenizer_value_is_an_error_naming_the_field(bad: Any) -> None:
    with pytest.raises(ConfigError, match="tokenizer"):
        ClusterFile.from_dict(cluster(tokenizer=bad))


def test_the_cli_builds_the_tokenizer_the_file_names(tmp_path: Path) -> None:
    assert load_tokenizer(ClusterFile.from_dict(cluster())) is None
    emulated = load_tokenizer(ClusterFile.from_dict(cluster("emulated")))
    assert isinstance(emulated, EmulatorTokenizer) and emulated.name == "emulator"
    assert emulated.prompt_ids({"prompt": [5, 6]}, False) == [5, 6]
    engine = load_tokenizer(ClusterFile.from_dict(cluster("emulated", tokenizer="engine")))
    assert isinstance(engine, EngineTokenizer) and isinstance(engine, AsyncTokenizer)
    with pytest.raises(ConfigError):
        load_tokenizer(ClusterFile.from_dict(cluster(tokenizer=str(tmp_path / "missing"))))
