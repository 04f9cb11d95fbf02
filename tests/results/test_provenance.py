"""The commit a result records (results/provenance.py): git's answer, or None where there is no repository."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from calroute.results.provenance import git_commit


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    def git(*argv: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *argv], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "a.txt").write_text("a\n")
    git("add", "a.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    return tmp_path


def test_the_commit_in_full_and_abbreviated(repo: Path) -> None:
    full = git_commit(repo)
    assert full is not None and len(full) == 40
    short = git_commit(repo, short=True)
    assert short is not None and full.startswith(short) and len(short) < 40


def test_no_repository_is_none(tmp_path: Path) -> None:
    assert git_commit(tmp_path) is None
    assert git_commit(tmp_path / "missing") is None
