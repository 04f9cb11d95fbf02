"""The SLO class of a request, from its headers.

``x-calroute-slo: tight|loose`` names the class. llm-d's ``x-llm-d-slo-ttft-ms`` / ``x-llm-d-slo-tpot-ms``
give targets instead: a request is tight when any target it gives is below the geometric mean of the tight
and loose targets of the calibration (so a target near the tight one maps to tight), else loose.
Anything unparseable is a ValueError naming the header (the proxy answers 400).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from calroute.costmodel.calibration import SloTargets
from calroute.types import SloClass

CLASS_HEADER = "x-calroute-slo"
TTFT_HEADER = "x-llm-d-slo-ttft-ms"
TPOT_HEADER = "x-llm-d-slo-tpot-ms"


def slo_class(headers: Mapping[str, str], targets: SloTargets, default: SloClass) -> SloClass:
    named = headers.get(CLASS_HEADER)
    if named is not None:
        try:
            return SloClass(named.strip().lower())
        except ValueError:
            raise ValueError(f"{CLASS_HEADER} must be tight or loose, got {named!r}") from None
    tight = False
    given = False
    for header, tight_s in ((TTFT_HEADER, targets.tight_ttft_s), (TPOT_HEADER, targets.tight_tpot_s)):
        raw = headers.get(header)
        if raw is None:
            continue
        try:
            ms = float(raw)
        except ValueError:
            raise ValueError(f"{header} must be a number of milliseconds, got {raw!r}") from None
        if not math.isfinite(ms) or ms <= 0:
            raise ValueError(f"{header} must be a positive number of milliseconds, got {raw!r}")
        given = True
        tight |= ms / 1e3 < tight_s * math.sqrt(targets.loose_factor)
    if not given:
        return default
    return SloClass.TIGHT if tight else SloClass.LOOSE
