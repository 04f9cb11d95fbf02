"""What results record of a path: relative to the file's own folder or to the repository, never a machine's
absolute path."""

from __future__ import annotations

from pathlib import Path

import pytest

from calroute.experiments.kit.paths import REPO, portable_workload, recorded_path, recorded_paths


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("FOLDER/records/rr-seed0.jsonl", "records/rr-seed0.jsonl"),  # inside the folder: relative to it
        (str(REPO / "data" / "traces" / "t.jsonl"), "data/traces/t.jsonl"),  # inside the repository
        ("FOLDER/../../elsewhere", "../../elsewhere"),  # neither: relative to the folder all the same
        ("out/experiments", "out/experiments"),  # relative: kept as the user typed it
    ],
    ids=["in the folder", "in the repository", "elsewhere", "relative"],
)
def test_a_path_is_recorded_relative(tmp_path: Path, path: str, expected: str) -> None:
    folder = tmp_path / "a" / "b"
    assert recorded_path(path.replace("FOLDER", str(folder)), folder) == expected


def test_every_absolute_path_in_a_document_is_recorded_relative(tmp_path: Path) -> None:
    doc = {
        "out": str(tmp_path),
        "cells": [{"workload": str(REPO / "data" / "t.jsonl"), "tags": {"source": "chat"}}],
        "calibration": {"source": f"calibrate:emulated:{tmp_path / 'x' / 'cluster.yaml'}"},
        "urls": "calibrate:emulated:http://127.0.0.1:8000,http://127.0.0.1:8001",
        "n": 3,
    }
    assert recorded_paths(doc, tmp_path / "x") == {
        "out": "..",
        "cells": [{"workload": "data/t.jsonl", "tags": {"source": "chat"}}],
        "calibration": {"source": "calibrate:emulated:cluster.yaml"},
        "urls": "calibrate:emulated:http://127.0.0.1:8000,http://127.0.0.1:8001",
        "n": 3,
    }


def test_a_trace_named_relative_to_the_repository_is_found_from_anywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    trace = "data/traces/mooncake_fast25/synthetic_trace.jsonl"
    assert portable_workload(trace) == str(REPO / trace)
    assert portable_workload("chat") == "chat"  # a family, as it is
