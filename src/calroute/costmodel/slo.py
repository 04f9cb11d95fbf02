"""Which SLO targets judge a run: ``--slo SPEC``, resolved against a calibration in one place.

SPEC is one of:

* ``paper`` (the default): the calibration's own targets, the paper's rule (calibration.py): fixed TTFT and
  TPOT per class, loose = loose_factor x tight;
* ``long-context``: the paper's fixed parts plus a TTFT allowance of twice what the prompt's tokens add to
  an idle request's TTFT on this hardware: its prefill (the calibrated curve, its attention term growing with
  the square of the prompt) and the transfer of its KV (tight; loose: loose_factor x that). So every request
  an engine admits meets its targets alone on an idle cluster, however long its prompt
  (docs/calibration.md, "SLO targets");
* a path to an SLO file, YAML or JSON (a ``.json`` file is read as JSON, anything else as YAML):

  .. code-block:: yaml

      tight:                        # every field optional: what is not given is the calibration's
        ttft_s: 0.2                 # the fixed part of the TTFT target, seconds
        ttft_per_token_tau_pre: 4   # the allowance per prompt token, in units of tau_pre_s ...
        # ttft_s_per_token: 3.2e-4  # ... or in seconds (at most one of the two)
        tpot_s: 0.04
      loose:                        # the same fields; what is not given is loose_factor x the tight one
        tpot_s: 0.2
      loose_factor: 3

A spec is parsed (``parse_slo``) apart from its resolution (``SloSpec.resolve``), so a command checks a bad
file before it calibrates or starts anything, and an experiment resolves the one spec against the calibration
of each cluster it brings up.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from calroute.costmodel.calibration import TIGHT_SLO_FACTOR, Calibration, SloTargets
from calroute.errors import CalibrationError, ConfigError
from calroute.types import SloClass

PAPER = "paper"
LONG_CONTEXT = "long-context"
# The long-context preset's tight allowance, as a multiple of what a prompt's tokens add to an idle
# request's TTFT (its prefill on the calibrated curve, attention included, and its KV transfer): the paper's
# factor-2 headroom over an unloaded request (TIGHT_SLO_FACTOR) at every prompt length. On the a40-qwen2.5-3b
# profile a lone 32k prompt takes 4.6 s to its first token against a tight target of 9.3 s; at 1k tokens
# 0.11 s against 0.34 s. (A per-token allowance alone, as this preset gave before 2026-12-05, falls behind
# the square of the prompt: past about 100k tokens a lone prompt missed it.) Loose is LOOSE_FACTOR x that.
LONG_CONTEXT_IDLE_FACTOR = TIGHT_SLO_FACTOR

# A class's fields in an SLO file; loose_factor is the one top-level field besides the two classes.
CLASS_FIELDS = (
    "ttft_s",
    "ttft_s_per_token",
    "ttft_per_token_tau_pre",
    "ttft_s_per_token2",
    "ttft_idle_factor",
    "tpot_s",
)
# At most one way of giving a class's growing allowance (the idle factor sets both of its terms).
_EXCLUSIVE = (
    ("ttft_s_per_token", "ttft_per_token_tau_pre"),
    ("ttft_idle_factor", "ttft_s_per_token"),
    ("ttft_idle_factor", "ttft_per_token_tau_pre"),
    ("ttft_idle_factor", "ttft_s_per_token2"),
)
TOP_FIELDS = ("tight", "loose", "loose_factor")


@dataclass(frozen=True)
class ClassSpec:
    """One class's targets as a spec gives them; None: not given."""

    ttft_s: float | None = None
    ttft_s_per_token: float | None = None
    ttft_per_token_tau_pre: float | None = None  # the allowance per prompt token as a multiple of tau_pre_s
    ttft_s_per_token2: float | None = None  # the allowance per squared prompt token
    # both allowances: this many times what a prompt's tokens add to an idle request's TTFT (idle_allowance)
    ttft_idle_factor: float | None = None
    tpot_s: float | None = None

    def given(self) -> dict[str, float]:
        return {k: v for k in CLASS_FIELDS if (v := getattr(self, k)) is not None}


@dataclass(frozen=True)
class SloSpec:
    """What ``--slo`` said, parsed: a preset or a file's content, not yet bound to a calibration."""

    name: str  # "paper", "long-context", or the file's path
    tight: ClassSpec = field(default_factory=ClassSpec)
    loose: ClassSpec = field(default_factory=ClassSpec)
    loose_factor: float | None = None

    @property
    def is_paper(self) -> bool:
        return self.name == PAPER

    def resolve(self, cal: Calibration) -> SloTargets:
        """The targets this spec sets on ``cal``'s hardware; what it does not set is ``cal``'s."""
        changes: dict[str, Any] = {}
        for cls, given in (("tight", self.tight), ("loose", self.loose)):
            if given.ttft_s is not None:
                changes[f"{cls}_ttft_s"] = given.ttft_s
            if given.tpot_s is not None:
                changes[f"{cls}_tpot_s"] = given.tpot_s
            if given.ttft_s_per_token is not None:
                changes[f"{cls}_ttft_s_per_token"] = given.ttft_s_per_token
            elif given.ttft_per_token_tau_pre is not None:
                changes[f"{cls}_ttft_s_per_token"] = given.ttft_per_token_tau_pre * cal.tau_pre_s
            if given.ttft_s_per_token2 is not None:
                changes[f"{cls}_ttft_s_per_token2"] = given.ttft_s_per_token2
            if given.ttft_idle_factor is not None:
                per_token, per_token2 = idle_allowance(cal)
                changes[f"{cls}_ttft_s_per_token"] = given.ttft_idle_factor * per_token
                changes[f"{cls}_ttft_s_per_token2"] = given.ttft_idle_factor * per_token2
        if self.loose_factor is not None:
            changes["loose_factor"] = self.loose_factor
        try:
            return replace(cal.slo, **changes)
        except CalibrationError as e:  # e.g. a loose target below the tight one
            raise ConfigError(f"SLO {self.name}: {e}") from e

    def definition(self) -> dict[str, Any]:
        """What the spec sets, as JSON: an experiment's saved results are reused only for an equal one, and
        its report resolves the spec again from it (the file may be gone)."""
        d: dict[str, Any] = {"name": self.name}
        for cls, given in (("tight", self.tight), ("loose", self.loose)):
            if given.given():
                d[cls] = given.given()
        if self.loose_factor is not None:
            d["loose_factor"] = self.loose_factor
        return d

    @property
    def key(self) -> str:
        """A short name for file and dictionary keys: ``paper``, else a name and a digest of what the spec
        sets, so that a preset whose definition changes (long-context did on 2026-12-05) keys apart from its
        saved results."""
        if self.name == PAPER:
            return PAPER
        content = {k: v for k, v in self.definition().items() if k != "name"}
        digest = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:10]
        return f"{self.name}-{digest}" if self.name in PRESETS else f"file-{digest}"

    @classmethod
    def from_definition(cls, d: Mapping[str, Any]) -> SloSpec:
        return _from_mapping(str(d.get("name", PAPER)), {k: v for k, v in d.items() if k != "name"})


PRESETS: dict[str, SloSpec] = {
    PAPER: SloSpec(PAPER),
    LONG_CONTEXT: SloSpec(LONG_CONTEXT, tight=ClassSpec(ttft_idle_factor=LONG_CONTEXT_IDLE_FACTOR)),
}


def idle_allowance(cal: Calibration) -> tuple[float, float]:
    """(seconds per prompt token, seconds per squared prompt token) a prompt adds to an idle request's
    TTFT on ``cal``'s hardware: its prefill (per token, and the attention term: a p-token prompt attends
    over p^2 / 2 token pairs, chunked or not) and the transfer of its KV (per token)."""
    transfer_per_token = (cal.transfer_s(1_000_000) - cal.transfer_s(0)) / 1_000_000
    return cal.prefill.per_token_s + transfer_per_token, cal.prefill.attn_s_per_token2 / 2


def _number(where: str, name: str, value: object, allow_zero: bool) -> float:
    # bool is an int to Python; "true" as a target is a mistake, not 1 second
    if isinstance(value, bool) or not isinstance(value, int | float):
        hint = " (YAML reads 1e-4 as text: write 1.0e-4)" if isinstance(value, str) else ""
        raise ConfigError(f"{where}: field {name!r} must be a number, got {value!r}{hint}")
    x = float(value)
    if not math.isfinite(x) or x < 0 or (x == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{where}: field {name!r} must be a finite number {bound}, got {value!r}")
    return x


def _class_spec(where: str, cls: str, raw: object) -> ClassSpec:
    if not isinstance(raw, Mapping):
        raise ConfigError(
            f"{where}: field {cls!r} must be a mapping of {', '.join(CLASS_FIELDS)}, got {raw!r}"
        )
    unknown = sorted(str(k) for k in raw if k not in CLASS_FIELDS)
    if unknown:
        raise ConfigError(f"{where}: unknown field {cls}.{unknown[0]}; known: {', '.join(CLASS_FIELDS)}")
    for a, b in _EXCLUSIVE:
        if a in raw and b in raw:
            raise ConfigError(f"{where}: give at most one of {cls}.{a} and {cls}.{b}")
    values = {
        k: _number(where, f"{cls}.{k}", raw[k], allow_zero=k not in ("ttft_s", "tpot_s", "ttft_idle_factor"))
        for k in CLASS_FIELDS
        if k in raw
    }
    return ClassSpec(**values)


def _from_mapping(where: str, raw: object) -> SloSpec:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: an SLO file holds a mapping of {', '.join(TOP_FIELDS)}, got {raw!r}")
    unknown = sorted(str(k) for k in raw if k not in TOP_FIELDS)
    if unknown:
        raise ConfigError(f"{where}: unknown field {unknown[0]!r}; known: {', '.join(TOP_FIELDS)}")
    factor = raw.get("loose_factor")
    if factor is not None:
        factor = _number(where, "loose_factor", factor, allow_zero=False)
        if factor < 1:
            raise ConfigError(f"{where}: field 'loose_factor' must be >= 1, got {factor!r}")
    return SloSpec(
        where,
        tight=_class_spec(where, "tight", raw.get("tight", {})),
        loose=_class_spec(where, "loose", raw.get("loose", {})),
        loose_factor=factor,
    )


def parse_slo(spec: str) -> SloSpec:
    """A preset's name or an SLO file's path, parsed; a ConfigError names the file and the field at fault."""
    if spec in PRESETS:
        return PRESETS[spec]
    path = Path(spec)
    if not path.is_file():
        raise ConfigError(f"unknown SLO {spec!r}: not a preset ({', '.join(PRESETS)}) nor a file")
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read SLO file {spec}: {e}") from e
    try:
        raw = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        kind = "JSON" if path.suffix.lower() == ".json" else "YAML"
        raise ConfigError(f"SLO file {spec} is not {kind}: {e}") from e
    return _from_mapping(spec, raw)


def resolve_slo(spec: str | SloSpec, cal: Calibration) -> SloTargets:
    """The targets ``spec`` (a name, a path or a parsed spec) sets on ``cal``'s hardware."""
    return (parse_slo(spec) if isinstance(spec, str) else spec).resolve(cal)


def with_slo(cal: Calibration, spec: str | SloSpec) -> Calibration:
    """``cal`` judging by ``spec``'s targets: the hardware constants and the router's prices unchanged."""
    return replace(cal, slo=resolve_slo(spec, cal))


def describe_slo(slo: SloTargets) -> str:
    """One line for reports: each class's TTFT target (with its per-token part) and TPOT target."""
    parts = []
    for cls in (SloClass.TIGHT, SloClass.LOOSE):
        ttft = f"{slo.ttft_s(cls) * 1e3:.0f} ms"
        if slo.ttft_s_per_token(cls):
            ttft += f" + {slo.ttft_s_per_token(cls) * 1e3:.3g} ms per prompt token"
        if slo.ttft_s_per_token2(cls):
            ttft += f" + {slo.ttft_s_per_token2(cls) * 1e9:.3g} ns per squared prompt token"
        parts.append(f"{cls.value} TTFT {ttft}, TPOT {slo.tpot_s(cls) * 1e3:.1f} ms")
    return "; ".join(parts)
