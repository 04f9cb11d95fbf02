"""An experiment run with a params file (``calroute experiment --params FILE``): every variant of the file's
policy starts from the file's parameters, and a variant's own parameters (what the experiment varies, e.g.
an ablation's switch) override them. The cells' definitions then carry the parameters, so results saved
without the file (or with another one) are not reused for them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from calroute.experiments.base import Experiment
from calroute.experiments.cells import Cell, CellResult


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
