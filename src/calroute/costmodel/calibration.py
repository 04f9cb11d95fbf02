"""Calibration: the hardware constants the router prices with, and the SLO targets, in one JSON file.

A Calibration carries both the curves a service model needs (prefill iteration time versus tokens, decode
step time versus batch and context, KV transfer) and the router's two prices, tau_pre and tau_dec, which
are read off those curves at a documented reference point. The same file configures the simulator's
service model and the router, so "simulated with the hardware's constants" and "routed with the
simulator's constants" are explicit, separate choices.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from calroute.errors import CalibrationError
from calroute.types import PicklesByConstructor, SloClass

SCHEMA_VERSION = 1

# Reference point at which tau_pre and tau_dec are read off the curves, and at which the SLO rule applies.
REF_PROMPT_TOKENS = 1024
REF_DECODE_BATCH = 32
REF_CONTEXT_TOKENS = 1024
# SLO rule: tight targets are this multiple of the reference latencies; loose = LOOSE_FACTOR x tight.
TIGHT_SLO_FACTOR = 2.0
LOOSE_FACTOR = 3.0


def _positive(name: str, value: float, allow_zero: bool = False) -> None:
    if not (value > 0 or (allow_zero and value == 0)):
        raise CalibrationError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")


@dataclass(frozen=True)
class PrefillCurve(PicklesByConstructor):
    """Time of one prefill iteration: base + per_token * T + attn * sum(chunk * (ctx_before + chunk / 2))."""

    base_s: float
    per_token_s: float
    attn_s_per_token2: float = 0.0

    def __post_init__(self) -> None:
        _positive("prefill.base_s", self.base_s, allow_zero=True)
        _positive("prefill.per_token_s", self.per_token_s)
        _positive("prefill.attn_s_per_token2", self.attn_s_per_token2, allow_zero=True)

    def single_s(self, prompt_tokens: int) -> float:
        """An unchunked prefill of one prompt alone."""
        p = prompt_tokens
        return self.base_s + self.per_token_s * p + self.attn_s_per_token2 * p * p / 2


@dataclass(frozen=True)
class DecodeCurve(PicklesByConstructor):
    """Time of one decode step: base + per_seq * batch + per_ctx_token * (context tokens in the batch)."""

    base_s: float
    per_seq_s: float
    per_ctx_token_s: float

    def __post_init__(self) -> None:
        _positive("decode.base_s", self.base_s)
        _positive("decode.per_seq_s", self.per_seq_s, allow_zero=True)
        _positive("decode.per_ctx_token_s", self.per_ctx_token_s, allow_zero=True)

    def step_s(self, batch: int, context_tokens: int) -> float:
        return self.base_s + self.per_seq_s * batch + self.per_ctx_token_s * context_tokens


@dataclass(frozen=True)
class TransferModel(PicklesByConstructor):
    """KV transfer time from a prefill to a decode engine: latency + bytes / bandwidth (no contention)."""

    latency_s: float
    bandwidth_bytes_per_s: float

    def __post_init__(self) -> None:
        _positive("transfer.latency_s", self.latency_s, allow_zero=True)
        _positive("transfer.bandwidth_bytes_per_s", self.bandwidth_bytes_per_s)

    def seconds(self, n_bytes: float) -> float:
        return self.latency_s + n_bytes / self.bandwidth_bytes_per_s


@dataclass(frozen=True)
class SloTargets(PicklesByConstructor):
    """A request's targets by SLO class: TTFT = a fixed part + an allowance per prompt token + one per
    squared prompt token (a prefill's attention grows with the square of the prompt); TPOT fixed.

    The paper's targets (those of every calibration file) have no per-token allowance, and each loose target
    is ``loose_factor`` x the tight one. An SLO file or preset (``costmodel/slo.py``) may add per-token
    allowances, so that a long prompt is judged by what its prefill must cost, and may set the loose targets
    apart; a loose target left at None keeps the paper's rule.
    """

    tight_ttft_s: float
    tight_tpot_s: float
    loose_factor: float = LOOSE_FACTOR
    tight_ttft_s_per_token: float = 0.0
    loose_ttft_s: float | None = None
    loose_tpot_s: float | None = None
    loose_ttft_s_per_token: float | None = None
    tight_ttft_s_per_token2: float = 0.0  # seconds per squared prompt token
    loose_ttft_s_per_token2: float | None = None

    def __post_init__(self) -> None:
        _positive("slo.tight_ttft_s", self.tight_ttft_s)
        _positive("slo.tight_tpot_s", self.tight_tpot_s)
        _positive("slo.tight_ttft_s_per_token", self.tight_ttft_s_per_token, allow_zero=True)
        _positive("slo.tight_ttft_s_per_token2", self.tight_ttft_s_per_token2, allow_zero=True)
        if not self.loose_factor >= 1:
            raise CalibrationError(f"slo.loose_factor must be >= 1, got {self.loose_factor!r}")
        # A loose target tighter than the tight one would make the classes' names lie, and the proxy's
        # header classification (the geometric mean between the two) meaningless.
        for name, loose, tight in (
            ("ttft_s", self.loose_ttft_s, self.tight_ttft_s),
            ("tpot_s", self.loose_tpot_s, self.tight_tpot_s),
            ("ttft_s_per_token", self.loose_ttft_s_per_token, self.tight_ttft_s_per_token),
            ("ttft_s_per_token2", self.loose_ttft_s_per_token2, self.tight_ttft_s_per_token2),
        ):
            if loose is not None and not loose >= tight:
                raise CalibrationError(
                    f"slo.loose_{name} must be >= slo.tight_{name} ({tight!r}), got {loose!r}"
                )

    def ttft_s(self, slo: SloClass) -> float:
        """The fixed part of the class's TTFT target (the whole target when there is no per-token part)."""
        if slo is SloClass.TIGHT:
            return self.tight_ttft_s
        loose = self.loose_ttft_s
        return self.tight_ttft_s * self.loose_factor if loose is None else loose

    def ttft_s_per_token(self, slo: SloClass) -> float:
        """The class's TTFT allowance per prompt token, seconds."""
        if slo is SloClass.TIGHT:
            return self.tight_ttft_s_per_token
        loose = self.loose_ttft_s_per_token
        return self.tight_ttft_s_per_token * self.loose_factor if loose is None else loose

    def ttft_s_per_token2(self, slo: SloClass) -> float:
        """The class's TTFT allowance per squared prompt token, seconds."""
        if slo is SloClass.TIGHT:
            return self.tight_ttft_s_per_token2
        loose = self.loose_ttft_s_per_token2
        return self.tight_ttft_s_per_token2 * self.loose_factor if loose is None else loose

    def ttft_target_s(self, slo: SloClass, prompt_tokens: int) -> float:
        """The TTFT target of a request of this class and prompt length."""
        p = prompt_tokens
        if slo is SloClass.TIGHT:  # one branch for the common class: goodput calls this once per record
            return self.tight_ttft_s + (self.tight_ttft_s_per_token + self.tight_ttft_s_per_token2 * p) * p
        return self.ttft_s(slo) + (self.ttft_s_per_token(slo) + self.ttft_s_per_token2(slo) * p) * p

    def tpot_s(self, slo: SloClass) -> float:
        if slo is SloClass.TIGHT:
            return self.tight_tpot_s
        loose = self.loose_tpot_s
        return self.tight_tpot_s * self.loose_factor if loose is None else loose

    @property
    def per_token(self) -> bool:
        """Whether some TTFT target grows with the prompt (then no single number is the class's target)."""
        return (
            self.tight_ttft_s_per_token > 0
            or bool(self.loose_ttft_s_per_token)
            or self.tight_ttft_s_per_token2 > 0
            or bool(self.loose_ttft_s_per_token2)
        )

    def to_dict(self) -> dict[str, float]:
        """The fields as a calibration file holds them: the paper's three, then only what is set, so a
        calibration with the paper's targets writes the same file as before per-token targets existed."""
        d = {
            "tight_ttft_s": self.tight_ttft_s,
            "tight_tpot_s": self.tight_tpot_s,
            "loose_factor": self.loose_factor,
        }
        if self.tight_ttft_s_per_token:
            d["tight_ttft_s_per_token"] = self.tight_ttft_s_per_token
        if self.tight_ttft_s_per_token2:
            d["tight_ttft_s_per_token2"] = self.tight_ttft_s_per_token2
        for name, value in (
            ("loose_ttft_s", self.loose_ttft_s),
            ("loose_tpot_s", self.loose_tpot_s),
            ("loose_ttft_s_per_token", self.loose_ttft_s_per_token),
            ("loose_ttft_s_per_token2", self.loose_ttft_s_per_token2),
        ):
            if value is not None:
                d[name] = value
        return d


@dataclass(frozen=True)
class Calibration(PicklesByConstructor):
    """Hardware constants for pricing (tau_pre, tau_dec) and modelling (curves), SLO targets, provenance."""

    tau_pre_s: float  # seconds per prompt token (the router's prefill price)
    tau_dec_s: float  # seconds per output token at the reference concurrency (the router's decode price)
    prefill: PrefillCurve
    decode: DecodeCurve
    kv_bytes_per_token: int
    transfer: TransferModel
    slo: SloTargets
    provenance: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _positive("tau_pre_s", self.tau_pre_s)
        _positive("tau_dec_s", self.tau_dec_s)
        _positive("kv_bytes_per_token", self.kv_bytes_per_token)

    def transfer_s(self, prompt_tokens: int) -> float:
        return self.transfer.seconds(prompt_tokens * self.kv_bytes_per_token)

    def to_json(self) -> str:
        d = asdict(self)
        d["slo"] = self.slo.to_dict()
        return json.dumps({"schema_version": SCHEMA_VERSION, **d}, indent=2, sort_keys=True) + "\n"

    def save(self, path: Path) -> None:
        path.write_text(self.to_json())

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Calibration:
        version = d.get("schema_version", SCHEMA_VERSION)
        if version != SCHEMA_VERSION:
            raise CalibrationError(
                f"unsupported calibration schema_version {version} (expected {SCHEMA_VERSION})"
            )
        try:
            return cls(
                tau_pre_s=float(d["tau_pre_s"]),
                tau_dec_s=float(d["tau_dec_s"]),
                prefill=PrefillCurve(**d["prefill"]),
                decode=DecodeCurve(**d["decode"]),
                kv_bytes_per_token=int(d["kv_bytes_per_token"]),
                transfer=TransferModel(**d["transfer"]),
                slo=SloTargets(**d["slo"]),
                provenance=dict(d.get("provenance", {})),
            )
        except KeyError as e:
            raise CalibrationError(f"calibration is missing field {e.args[0]!r}") from e
        except TypeError as e:
            raise CalibrationError(f"calibration has a bad field: {e}") from e

    @classmethod
    def load(cls, path: Path) -> Calibration:
        try:
            data = json.loads(path.read_text())
        except OSError as e:
            raise CalibrationError(f"cannot read calibration file {path}: {e}") from e
        except json.JSONDecodeError as e:
            raise CalibrationError(f"calibration file {path} is not JSON: {e}") from e
        if not isinstance(data, dict):
            raise CalibrationError(f"calibration file {path} must hold a JSON object")
        return cls.from_dict(data)


def derive_calibration(
    prefill: PrefillCurve,
    decode: DecodeCurve,
    transfer: TransferModel,
    kv_bytes_per_token: int,
    provenance: dict[str, Any],
) -> Calibration:
    """Read the router's prices and the SLO targets off a set of curves, by the documented rule.

    tau_pre: mean seconds per token of a REF_PROMPT_TOKENS prefill. tau_dec: one decode step with
    REF_DECODE_BATCH sequences of REF_CONTEXT_TOKENS context (the per-token time a request sees there).
    Tight TTFT: TIGHT_SLO_FACTOR x the unloaded TTFT of a reference prompt (prefill + transfer + one step).
    Tight TPOT: TIGHT_SLO_FACTOR x tau_dec.
    """
    tau_pre = prefill.single_s(REF_PROMPT_TOKENS) / REF_PROMPT_TOKENS
    tau_dec = decode.step_s(REF_DECODE_BATCH, REF_DECODE_BATCH * REF_CONTEXT_TOKENS)
    unloaded_ttft = (
        prefill.single_s(REF_PROMPT_TOKENS)
        + transfer.seconds(REF_PROMPT_TOKENS * kv_bytes_per_token)
        + decode.step_s(1, REF_PROMPT_TOKENS)
    )
    slo = SloTargets(tight_ttft_s=TIGHT_SLO_FACTOR * unloaded_ttft, tight_tpot_s=TIGHT_SLO_FACTOR * tau_dec)
    return Calibration(
        tau_pre_s=tau_pre,
        tau_dec_s=tau_dec,
        prefill=prefill,
        decode=decode,
        kv_bytes_per_token=kv_bytes_per_token,
        transfer=transfer,
        slo=slo,
        provenance=provenance,
    )


# The paper's simulator priced decode 7.4x cheaper than the hardware measured (section III-B); its constants
# were 7-13x off overall. The "mismatched" router of the calibration experiments uses this factor.
PAPER_MISMATCH_FACTOR = 7.4


def mismatched(cal: Calibration, factor: float = PAPER_MISMATCH_FACTOR) -> Calibration:
    """The same hardware priced ``factor`` times too cheaply: what a router tuned on a simulator would use.

    Only the router's prices change (tau_pre, tau_dec); curves and SLO targets still describe the hardware.
    """
    if factor <= 0:
        raise CalibrationError(f"mismatch factor must be > 0, got {factor}")
    source = f"mismatched({cal.provenance.get('source', 'calibration')}, /{factor:g})"
    return replace(
        cal,
        tau_pre_s=cal.tau_pre_s / factor,
        tau_dec_s=cal.tau_dec_s / factor,
        provenance={**cal.provenance, "source": source},
    )
