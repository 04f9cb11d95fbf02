"""Fit the calibration curves to measured samples: pure, deterministic, numpy only.

Every curve is linear in its constants, so each fit is a least-squares problem. The constants are physical
costs, so they are constrained to be non-negative (an unconstrained fit of noisy latencies readily
returns, say, a negative base time paid for by a steeper slope); the solver is Lawson and Hanson's
active-set NNLS, small enough to carry here rather than pull in scipy.

Every 4th sample (indices 3, 7, 11, ...) is held out: the returned curve is the one fitted on the other
samples, so the held-out figures describe exactly the curve that is returned. A ``FitReport`` carries R^2
on the fitting and on the held-out points, relative residuals |predicted - measured| / measured, and the
relative standard error of each constant (how well the samples pin it down).

* prefill: latency = base + per_token * p + attn * p^2 / 2 (a lone prompt of p tokens: ``single_s``)
* decode: step = base + per_seq * B + per_ctx_token * C (B sequences holding C context tokens in all)
* transfer: seconds = latency + p * kv_bytes_per_token / bandwidth
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Generic, NamedTuple, TypeVar

import numpy as np
from numpy.typing import NDArray

from calroute.costmodel.calibration import DecodeCurve, PrefillCurve, TransferModel
from calroute.errors import CalibrationError

HOLD_OUT_EVERY = 4  # every 4th sample is held out of the fit
REJECT_SIGMAS = 4.0  # fitting points further than this many robust sigmas from the curve are outliers
MAX_REJECT_ROUNDS = 5
# Robust sigma floors: residuals below these are exact data, where nothing should count as an outlier.
_ROBUST_FLOOR_REL = 0.002
_ROBUST_FLOOR_ABS_S = 1e-4
# Relative residuals of values this close to zero are meaningless (a transfer time can measure ~0 s).
_REL_FLOOR_S = 1e-6

Array = NDArray[np.float64]
CurveT = TypeVar("CurveT")


class PrefillSample(NamedTuple):
    prompt_tokens: int
    latency_s: float


class DecodeSample(NamedTuple):
    batch: int
    context_tokens: float  # total context tokens in the batch (mean over the measured steps)
    step_s: float


class TransferSample(NamedTuple):
    prompt_tokens: int
    transfer_s: float


@dataclass(frozen=True)
class FitReport:
    """How well a curve fits its samples; ``to_dict`` is JSON-ready (None where a figure is undefined).

    ``n_fit`` counts the fitting points the curve was fitted to, ``n_rejected`` the fitting points rejected
    as outliers; the fit figures are over the former. Held-out figures cover every held-out point, outliers
    included: a spike there shows in the max residual and R^2, not in the median.
    """

    curve: str
    terms: tuple[str, ...]
    coefficients: dict[str, float]
    rel_stderr: dict[str, float | None]  # standard error / value; None for a constant clamped at 0
    weighting: str  # "relative" (minimises relative error) or "absolute"
    n_fit: int
    n_rejected: int
    n_held_out: int
    r2_fit: float | None
    r2_held_out: float | None  # None with fewer than 2 held-out points or no spread among them
    fit_max_rel_residual: float
    fit_median_rel_residual: float
    held_out_max_rel_residual: float | None
    held_out_median_rel_residual: float | None
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["terms"] = list(self.terms)
        d["notes"] = list(self.notes)
        return d


@dataclass(frozen=True)
class Fit(Generic[CurveT]):
    curve: CurveT
    report: FitReport


def nnls(a: Array, b: Array, max_iter: int | None = None) -> Array:
    """argmin ||a x - b|| subject to x >= 0 (Lawson and Hanson 1974, active set).

    Columns should be of comparable scale (callers normalise them): the tolerances are absolute.
    """
    m, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tol = 10 * np.finfo(np.float64).eps * float(np.linalg.norm(a, 1)) * max(m, n)
    max_iter = 3 * n if max_iter is None else max_iter
    w = a.T @ (b - a @ x)
    for _ in range(max_iter):
        if passive.all() or not (w[~passive] > tol).any():
            return x
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        for _ in range(n + 1):  # each pass drops at least one variable, so n + 1 passes suffice
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > tol).all():
                x = z
                break
            neg = passive & (z <= tol)
            alpha = float(np.min(x[neg] / (x[neg] - z[neg])))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
        w = a.T @ (b - a @ x)
    raise CalibrationError("non-negative least squares did not converge")


def _r2(measured: Array, predicted: Array) -> float | None:
    if measured.size < 2:
        return None
    ss_tot = float(np.sum((measured - measured.mean()) ** 2))
    if ss_tot == 0.0:
        return None
    return 1.0 - float(np.sum((measured - predicted) ** 2)) / ss_tot


def _rel_residuals(measured: Array, predicted: Array) -> Array:
    return np.abs(predicted - measured) / np.maximum(np.abs(measured), _REL_FLOOR_S)


def held_out_mask(n: int) -> NDArray[np.bool_]:
    """The deterministic split: True for the samples held out of the fit (indices 3, 7, 11, ...)."""
    mask: NDArray[np.bool_] = (np.arange(n) % HOLD_OUT_EVERY) == HOLD_OUT_EVERY - 1
    return mask


def _full_rank(a: Array, k: int) -> bool:
    scale = np.linalg.norm(a, axis=0)
    return bool(a.shape[0] >= k and (scale > 0).all() and np.linalg.matrix_rank(a / scale) == k)


def _nnls_scaled(a: Array, b: Array) -> Array:
    # Columns span many orders of magnitude (1 against p^2 / 2): normalise them for the solver.
    scale = np.linalg.norm(a, axis=0)
    coef: Array = nnls(a / scale, b) / scale
    return coef


def _fit_linear(
    curve: str, terms: tuple[str, ...], x: Array, y: Array, relative: bool, what_varies: str
) -> tuple[Array, FitReport]:
    """Non-negative (weighted) least squares of y on the columns of x, with the hold-out split and
    outlier rejection among the fitting points."""
    k = len(terms)
    n = y.size
    if n < k + 1:
        raise CalibrationError(
            f"{curve} fit needs at least {k + 1} samples ({k} constants and one held out), got {n}"
        )
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise CalibrationError(f"{curve} fit: samples must be finite numbers")
    if relative and (y <= 0).any():
        raise CalibrationError(f"{curve} fit: measured times must be > 0, got {float(y.min())!r}")
    held = held_out_mask(n)
    xf, yf = x[~held], y[~held]
    # Weighting by 1/measured minimises relative error: short and long requests count alike.
    wf = 1.0 / yf if relative else np.ones_like(yf)
    a = xf * wf[:, None]
    b = yf * wf
    if not _full_rank(a, k):
        raise CalibrationError(
            f"{curve} fit is degenerate: the fitting samples do not pin down {k} constants "
            f"({', '.join(terms)}); {what_varies}"
        )
    # A latency sample taken while the machine was busy elsewhere can be several times too long; such
    # samples say nothing about the curve. Reject fitting points beyond REJECT_SIGMAS robust standard
    # deviations (1.4826 x the median absolute residual) and refit, until the set is stable.
    floor = _ROBUST_FLOOR_REL if relative else _ROBUST_FLOOR_ABS_S
    keep = np.ones(b.size, dtype=bool)
    coef = _nnls_scaled(a, b)
    for _ in range(MAX_REJECT_ROUNDS):
        r = np.abs(a @ coef - b)
        sigma = max(1.4826 * float(np.median(r[keep])), floor)
        new_keep = r <= REJECT_SIGMAS * sigma
        if (new_keep == keep).all() or not _full_rank(a[new_keep], k) or new_keep.sum() < k + 1:
            break
        keep = new_keep
        coef = _nnls_scaled(a[keep], b[keep])

    rel_stderr: dict[str, float | None] = {t: None for t in terms}
    dof = int(keep.sum()) - k
    active = coef > 0
    if dof > 0 and active.any():
        ak = a[keep]
        sigma2 = float(np.sum((ak @ coef - b[keep]) ** 2)) / dof
        cov = sigma2 * np.linalg.pinv(ak[:, active].T @ ak[:, active])
        for name, c, var in zip(
            [t for t, on in zip(terms, active, strict=True) if on], coef[active], np.diag(cov), strict=True
        ):
            rel_stderr[name] = math.sqrt(max(float(var), 0.0)) / float(c)

    pred = x @ coef
    rel = _rel_residuals(y, pred)
    rel_fit = rel[~held][keep]
    report = FitReport(
        curve=curve,
        terms=terms,
        coefficients={t: float(c) for t, c in zip(terms, coef, strict=True)},
        rel_stderr=rel_stderr,
        weighting="relative" if relative else "absolute",
        n_fit=int(keep.sum()),
        n_rejected=int((~keep).sum()),
        n_held_out=int(held.sum()),
        r2_fit=_r2(yf[keep], pred[~held][keep]),
        r2_held_out=_r2(y[held], pred[held]),
        fit_max_rel_residual=float(rel_fit.max()),
        fit_median_rel_residual=float(np.median(rel_fit)),
        held_out_max_rel_residual=float(rel[held].max()) if held.any() else None,
        held_out_median_rel_residual=float(np.median(rel[held])) if held.any() else None,
    )
    return coef, report


def _with_notes(report: FitReport, notes: list[str]) -> FitReport:
    return replace(report, notes=(*report.notes, *notes))


def fit_prefill(samples: Sequence[tuple[int, float]]) -> Fit[PrefillCurve]:
    """Fit ``PrefillCurve`` to (prompt_tokens, latency_s) samples of lone, unchunked prompts.

    When the quadratic (attention) term takes all the growth and leaves a zero per-token cost, which is not
    physics (every token costs GEMM work), the quadratic term is dropped and the curve refitted linear. When
    even the line is flat under the noise, per_token_s is reported as an upper bound, and the report says so.
    """
    p = np.array([s[0] for s in samples], dtype=np.float64)
    y = np.array([s[1] for s in samples], dtype=np.float64)
    why = "prompt lengths must take at least 3 distinct values"
    x = np.column_stack([np.ones_like(p), p, p * p / 2])
    terms = ("base_s", "per_token_s", "attn_s_per_token2")
    coef, report = _fit_linear("prefill", terms, x, y, relative=True, what_varies=why)
    notes = [f"{t} clamped at 0" for t, v in zip(terms, coef, strict=True) if v == 0.0 and t != "per_token_s"]
    if coef[1] == 0.0:
        coef2, report = _fit_linear("prefill", terms[:2], x[:, :2], y, relative=True, what_varies=why)
        coef = np.append(coef2, 0.0)
        report = replace(
            report,
            terms=terms,
            coefficients={**report.coefficients, "attn_s_per_token2": 0.0},
            rel_stderr={**report.rel_stderr, "attn_s_per_token2": None},
        )
        notes = ["per-token cost fitted 0 with the quadratic term: refitted without it (attn = 0)"]
        notes += ["base_s clamped at 0"] if coef[0] == 0.0 else []
    if coef[1] <= 0.0:
        # Latency that does not grow with the prompt above the noise (a tiny model on a busy CPU): the slope
        # is bounded by the noise, as fit_transfer bounds a flat transfer's bandwidth. Noise-free flat data
        # means the engine is not computing the prompt at all, which no bound describes.
        held = held_out_mask(y.size)
        typical_s = float(np.sqrt(np.median((y[~held] - x[~held, :2] @ coef[:2]) ** 2)))
        if typical_s < _ROBUST_FLOOR_ABS_S:
            raise CalibrationError(
                "prefill fit is degenerate: the per-token time came out 0 "
                "(latency does not grow with prompt length in these samples)"
            )
        coef[1] = typical_s / float(p.max())
        notes.append(
            f"latency does not grow with prompt length above the noise ({typical_s * 1e3:.1f} ms typical "
            "residual): per_token_s is an upper bound (the longest prompt's tokens cost one typical residual)"
        )
    curve = PrefillCurve(base_s=float(coef[0]), per_token_s=float(coef[1]), attn_s_per_token2=float(coef[2]))
    return Fit(curve, _with_notes(report, notes))


def fit_decode(samples: Sequence[tuple[int, float, float]]) -> Fit[DecodeCurve]:
    """Fit ``DecodeCurve`` to (batch, total context tokens, step_s) samples.

    per_seq_s and per_ctx_token_s are separable only when context varies independently of the batch size
    (several prompt lengths per batch size); a constant clamped at 0 is noted in the report.
    """
    b = np.array([s[0] for s in samples], dtype=np.float64)
    c = np.array([s[1] for s in samples], dtype=np.float64)
    y = np.array([s[2] for s in samples], dtype=np.float64)
    x = np.column_stack([np.ones_like(b), b, c])
    terms = ("base_s", "per_seq_s", "per_ctx_token_s")
    coef, report = _fit_linear(
        "decode",
        terms,
        x,
        y,
        relative=True,
        what_varies="batch size and context must vary independently (several prompt lengths per batch size)",
    )
    if coef[0] <= 0.0:
        raise CalibrationError("decode fit is degenerate: the per-step base time came out 0")
    notes = [f"{t} clamped at 0" for t, v in zip(terms[1:], coef[1:], strict=True) if v == 0.0]
    curve = DecodeCurve(base_s=float(coef[0]), per_seq_s=float(coef[1]), per_ctx_token_s=float(coef[2]))
    return Fit(curve, _with_notes(report, notes))


def fit_transfer(samples: Sequence[tuple[int, float]], kv_bytes_per_token: int) -> Fit[TransferModel]:
    """Fit ``TransferModel`` to (prompt_tokens, transfer_s) samples.

    Unweighted: a transfer time is a difference of two measurements and can be ~0, so relative weights
    would blow up. When the time does not grow with size at all (a bandwidth too high to see under the
    noise), the bandwidth is reported as the lower bound at which the largest sample's bytes would cost one
    typical (root-median-square) residual, and the report says so.
    """
    if kv_bytes_per_token <= 0:
        raise CalibrationError(f"kv_bytes_per_token must be > 0, got {kv_bytes_per_token}")
    n_bytes = np.array([s[0] * kv_bytes_per_token for s in samples], dtype=np.float64)
    y = np.array([s[1] for s in samples], dtype=np.float64)
    x = np.column_stack([np.ones_like(n_bytes), n_bytes])
    coef, report = _fit_linear(
        "transfer",
        ("latency_s", "s_per_byte"),
        x,
        y,
        relative=False,
        what_varies="prompt lengths must take at least 2 distinct values",
    )
    notes: list[str] = []
    if coef[1] > 0.0:
        bandwidth = 1.0 / float(coef[1])
    else:
        held = held_out_mask(y.size)
        typical_s = float(np.sqrt(np.median((y[~held] - x[~held] @ coef) ** 2)))
        bandwidth = float(n_bytes.max()) / max(typical_s, _REL_FLOOR_S)
        notes.append(
            "transfer time does not grow with size: bandwidth is a lower bound "
            "(the largest sample's bytes cost one typical residual)"
        )
    if coef[0] == 0.0:
        notes.append("latency_s clamped at 0")
    model = TransferModel(latency_s=float(coef[0]), bandwidth_bytes_per_s=bandwidth)
    return Fit(model, _with_notes(report, notes))
