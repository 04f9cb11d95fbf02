"""A router's recipe under a label: policy, parameters, constants and predictor. The simulator's runs, the
live runs and the experiments all name what they route with by a Variant."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Variant:
    """A policy under a label: the same policy with other parameters or other constants is another variant."""

    label: str
    policy: str
    params: dict[str, Any] = field(default_factory=dict)
    router: str = "calibrated"  # calibrated | mismatched (the paper's simulator constants) | online
    predictor: str = "bucket"
    predictor_noise: float = 0.0
