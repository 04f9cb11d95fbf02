"""How results name files: relative to the folder they are written in, or to the repository, so that a
results directory reads the same wherever it is moved (docs/results/ holds copies made elsewhere)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[4]


def recorded_path(path: str | Path, folder: Path) -> str:
    """``path`` as a file written in ``folder`` records it: relative to the folder when it lies inside it,
    else to the repository when inside that, else relative to the folder (``..`` and all). A relative path
    is kept as given: it names what the user typed."""
    p = Path(path)
    if not p.is_absolute():
        return str(path)
    here = folder.resolve()
    p = p.resolve()
    if p.is_relative_to(here) or not p.is_relative_to(REPO):
        return os.path.relpath(p, here)
    return str(p.relative_to(REPO))


def recorded_paths(data: Any, folder: Path) -> Any:
    """``data`` (JSON-like) with every absolute path in it recorded by ``recorded_path``: a string that is
    one, or that ends in one after a colon (a calibration's source, ``calibrate:emulated:/x/cluster.yaml``).
    URLs are left alone."""
    if isinstance(data, dict):
        return {k: recorded_paths(v, folder) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [recorded_paths(v, folder) for v in data]
    if isinstance(data, str) and "://" not in data:
        head, _, tail = data.rpartition(":")
        if tail.startswith("/"):
            return f"{head}:{recorded_path(tail, folder)}" if head else recorded_path(tail, folder)
    return data


def portable_workload(workload: str) -> str:
    """A cell's workload as a run needs it: a family's name as it is, a trace file by its absolute path (a
    worker may run in another directory). A trace is looked for from here, then in the repository: the
    catalogue and saved results name the repository's traces relative to it."""
    path = Path(workload)
    if not path.is_file() and (REPO / path).is_file():
        path = REPO / path
    return str(path.resolve()) if path.is_file() else workload
