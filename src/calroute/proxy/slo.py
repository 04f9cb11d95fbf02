"""The SLO class of a request, from its headers.

``x-calroute-slo: tight|loose`` names the class. Otherwise the request may state its own targets, and each one
it gives votes: tight when it is below the geometric mean of the same target of the tight and loose classes
(so a target near the tight one maps to tight), and the request is tight when any vote is. The targets:
llm-d's ``x-llm-d-slo-ttft-ms`` and ``x-llm-d-slo-tpot-ms``, and ``x-calroute-slo-ttft-ms-per-token``, a TTFT
allowance per prompt token (the SLO's per-token part, costmodel/slo.py). A request is classified before its
prompt is measured, so a TTFT target is compared with the classes' fixed parts and a per-token allowance with
the classes' allowances; when neither class has one (the paper's targets) that header cannot tell the classes
apart and does not vote. The class then judges the request (its targets at its prompt length), not the header
values. Anything unparseable is a ValueError naming the header (the proxy answers 400).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from calroute.costmodel.calibration import SloTargets
from calroute.types import SloClass

CLASS_HEADER = "x-calroute-slo"
TTFT_HEADER = "x-llm-d-slo-ttft-ms"
TPOT_HEADER = "x-llm-d-slo-tpot-ms"
TTFT_PER_TOKEN_HEADER = "x-calroute-slo-ttft-ms-per-token"


def slo_class(headers: Mapping[str, str], targets: SloTargets, default: SloClass) -> SloClass:
    named = headers.get(CLASS_HEADER)
    if named is not None:
        try:
            return SloClass(named.strip().lower())
        except ValueError:
            raise ValueError(f"{CLASS_HEADER} must be tight or loose, got {named!r}") from None
    tight = False
    given = False
    tight_cls, loose_cls = SloClass.TIGHT, SloClass.LOOSE
    for header, tight_s, loose_s, allow_zero in (
        (TTFT_HEADER, targets.ttft_s(tight_cls), targets.ttft_s(loose_cls), False),
        (TPOT_HEADER, targets.tpot_s(tight_cls), targets.tpot_s(loose_cls), False),
        (
            TTFT_PER_TOKEN_HEADER,
            targets.ttft_s_per_token(tight_cls),
            targets.ttft_s_per_token(loose_cls),
            True,
        ),
    ):
        raw = headers.get(header)
        if raw is None:
            continue
        try:
            ms = float(raw)
        except ValueError:
            raise ValueError(f"{header} must be a number of milliseconds, got {raw!r}") from None
        if not math.isfinite(ms) or ms < 0 or (ms == 0 and not allow_zero):
            sign = "non-negative" if allow_zero else "positive"
            raise ValueError(f"{header} must be a {sign} number of milliseconds, got {raw!r}")
        if loose_s == 0:  # no class has this target: the value cannot choose between them
            continue
        given = True
        tight |= ms / 1e3 < math.sqrt(tight_s * loose_s)
    if not given:
        return default
    return SloClass.TIGHT if tight else SloClass.LOOSE
