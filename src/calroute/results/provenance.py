"""Which code made a result: the repository's commit, for manifests and benchmark reports.

Below every part that writes results (experiments, tuning, the benchmarks), so that all of them ask git the
same way and a checkout without git (an installed package, a source archive) records None rather than failing.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

GIT_TIMEOUT_S = 10.0


def git_commit(repo: Path, *, short: bool = False) -> str | None:
    """The commit checked out at ``repo`` (git's abbreviated form with ``short``), or None when git or a
    repository is missing. Edits not yet committed are not in it: a report that must name the code which
    ran records a hash of the sources beside it."""
    argv = ["git", "-C", str(repo), "rev-parse", *(["--short"] if short else []), "HEAD"]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None
