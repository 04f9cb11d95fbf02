"""Online recalibration: refit the router's prices from the requests it has routed, as traffic flows.

Two bounded windows of observations, fed by the router's request events:
- unqueued prefills (the chosen prefill engine had nothing else in flight): (prompt tokens, seconds from
  admission to prefill done);
- finished decodes: (batch size, context tokens in the batch, TPOT), the batch and context read from the
  decode engine's polled metrics (running requests, KV in use) at the request's first and last token.
Every ``refit_every`` finished requests the prefill and decode curves are refitted with the same fitting
code as `calroute calibrate` (costmodel/fit.py) and tau_pre / tau_dec are read off them by the same rule
(derive_calibration). A fit that fails keeps the previous constants. SLO targets never change online: they
describe the service promised, not the router's prices.
"""

from __future__ import annotations

import datetime
from collections import deque
from dataclasses import replace

from calroute.costmodel.calibration import Calibration, derive_calibration
from calroute.costmodel.fit import fit_decode, fit_prefill
from calroute.errors import CalibrationError


class OnlineCalibrator:
    def __init__(
        self, start: Calibration, window: int = 400, refit_every: int = 50, min_samples: int = 24
    ) -> None:
        if window < min_samples or refit_every < 1 or min_samples < 4:
            raise CalibrationError("online calibration: need window >= min_samples >= 4 and refit_every >= 1")
        self.current = start
        self._prefill: deque[tuple[int, float]] = deque(maxlen=window)
        self._decode: deque[tuple[int, float, float]] = deque(maxlen=window)
        self._refit_every = refit_every
        self._min_samples = min_samples
        self._since_refit = 0
        self.refits = 0

    def observe_prefill(self, prompt_tokens: int, latency_s: float) -> None:
        if prompt_tokens > 0 and latency_s > 0:
            self._prefill.append((prompt_tokens, latency_s))

    def observe_decode(self, batch: int, context_tokens: float, tpot_s: float) -> None:
        if batch > 0 and tpot_s > 0:
            self._decode.append((batch, context_tokens, tpot_s))
        self._since_refit += 1

    def maybe_refit(self) -> Calibration | None:
        """New constants when it is time to refit and the fits succeed; None otherwise."""
        if self._since_refit < self._refit_every:
            return None
        self._since_refit = 0
        cal = self.current
        prefill, decode = cal.prefill, cal.decode
        fitted = []
        if len(self._prefill) >= self._min_samples:
            try:
                prefill = fit_prefill(list(self._prefill)).curve
                fitted.append("prefill")
            except CalibrationError:
                pass
        if len(self._decode) >= self._min_samples:
            try:
                decode = fit_decode(list(self._decode)).curve
                fitted.append("decode")
            except CalibrationError:
                pass
        if not fitted:
            return None
        provenance = {
            "source": "online",
            "started_from": cal.provenance.get("source"),
            "refits": self.refits + 1,
            "fitted": fitted,
            "samples": {"prefill": len(self._prefill), "decode": len(self._decode)},
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        }
        derived = derive_calibration(prefill, decode, cal.transfer, cal.kv_bytes_per_token, provenance)
        self.current = replace(derived, slo=cal.slo)
        self.refits += 1
        return self.current
