"""Tuned parameters as experiment variants: the params files `calroute tune` wrote for each workload family,
kept in docs/results/tuning (``W.json`` for marginal_cost trained on family W, ``oracle-W.json`` for the
oracle). A family without a file has no tuned variant; the report says so rather than inventing one."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from calroute.policies.params_file import load_params_file
from calroute.routing.variant import Variant

TUNING_DIR = Path(__file__).resolve().parents[3] / "docs" / "results" / "tuning"


@dataclass(frozen=True)
class Tuned:
    variant: Variant
    path: Path
    training_seeds: tuple[int, ...]
    saturation_rps: float | None  # where the study trained: the hand-set parameters' saturation rate


def tuned_variant(label: str, policy: str, path: Path) -> Tuned | None:
    """``policy`` with the parameters of the params file at ``path`` (which may be for another policy sharing
    its Params, as the oracle shares marginal_cost's); None when there is no such file."""
    if not path.exists():
        return None
    pf = load_params_file(path)
    training = json.loads(path.read_text()).get("training", {})
    rate = training.get("saturation", {}).get("rate_rps")
    return Tuned(
        Variant(label, policy, dict(pf.params)),
        path,
        tuple(training.get("seeds", ())),
        None if rate is None else float(rate),
    )


def trained_on(tuned: Sequence[Tuned], seeds: Sequence[int]) -> list[str]:
    """The run seeds a tuned variant was trained on (a validation must not use them): one line per file."""
    out = []
    for t in tuned:
        overlap = sorted(set(seeds) & set(t.training_seeds))
        if overlap:
            out.append(f"{t.variant.label} ({t.path.name}) was trained on seeds {overlap}")
    return out
