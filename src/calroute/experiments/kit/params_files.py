"""Params files (policies/params_file.py) in experiments, two ways.

A whole experiment run with one (``calroute experiment --params FILE``, ``WithParams``): every variant of the
file's policy starts from the file's parameters, and a variant's own parameters (what the experiment varies,
e.g. an ablation's switch) override them. The cells' definitions then carry the parameters, so results saved
without the file (or with another one) are not reused for them.

The files `calroute tune` wrote for each workload family as variants of their own (``tuned_variant``), kept
in docs/results/tuning (``W.json`` for marginal_cost trained on family W, ``clairvoyant-W.json`` for the
clairvoyant marginal_cost). A family without a file has no tuned variant; the report says so rather than
inventing one."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from calroute.experiments.kit.cells import Cell, CellResult, Experiment
from calroute.experiments.kit.paths import REPO
from calroute.policies.params_file import load_params_file
from calroute.routing.variant import Variant

TUNING_DIR = REPO / "docs" / "results" / "tuning"


def experiment_policies(exp: Experiment, quick: bool) -> set[str]:
    return {v.policy for c in exp.cells(quick) for v in c.variants}


@dataclass(frozen=True)
class WithParams:
    base: Experiment
    policy: str
    params: Mapping[str, Any]

    @property
    def name(self) -> str:
        return self.base.name

    @property
    def title(self) -> str:
        return self.base.title

    def cells(self, quick: bool) -> list[Cell]:
        return [
            replace(
                c,
                variants=tuple(
                    replace(v, params={**self.params, **v.params}) if v.policy == self.policy else v
                    for v in c.variants
                ),
            )
            for c in self.base.cells(quick)
        ]

    def report(self, results: list[CellResult], exp_dir: Path) -> str:
        return self.base.report(results, exp_dir)


@dataclass(frozen=True)
class Tuned:
    variant: Variant
    path: Path
    training_seeds: tuple[int, ...]
    saturation_rps: float | None  # where the study trained: the hand-set parameters' saturation rate


def tuned_variant(label: str, policy: str, path: Path) -> Tuned | None:
    """``policy`` with the parameters of the params file at ``path`` (which may be for another policy sharing
    its Params, as the clairvoyant shares marginal_cost's); None when there is no such file."""
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
