"""The admin surface of `calroute serve`: `GET /state` and `POST /admin/policy`, behind a bearer token.

With no token configured (CALROUTE_ADMIN_TOKEN unset) both answer 403: an operator opts in.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any, Protocol

from calroute.errors import ConfigError
from calroute.proxy.config import ProxyConfig
from calroute.proxy.errors import json_error
from calroute.proxy.http import codec
from calroute.proxy.http.messages import Request, Response, json_response
from calroute.proxy.prompt_length import PromptLength
from calroute.routing.ledger import Ledger
from calroute.routing.router import Router


class Routed(Protocol):
    """What the admin surface reads and changes of a running proxy (proxy/app.py's Proxy)."""

    cfg: ProxyConfig
    ledger: Ledger
    router: Router
    prompt_length: PromptLength
    urls: dict[str, str]
    policy_params: dict[str, Any]

    @property
    def policy_name(self) -> str: ...

    def now(self) -> float: ...

    def switch_policy(self, name: str, params: dict[str, Any]) -> None: ...


logger = logging.getLogger(__name__)


def authorized(token: str | None, request: Request) -> Response | None:
    """None when the request may pass; otherwise the answer to give it."""
    if token is None:
        return json_error(403, "admin endpoints are disabled: set CALROUTE_ADMIN_TOKEN", "Forbidden")
    given = request.headers.get("Authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        return json_error(401, "missing or wrong admin token", "Unauthorized")
    return None


def state(proxy: Routed) -> dict[str, Any]:
    """The router as it stands: policy, prices, SLO targets, and every engine's view."""
    view = proxy.ledger.view(proxy.now())
    cal = proxy.cfg.calibration
    prices = proxy.router.constants or cal
    return {
        "policy": proxy.policy_name,
        "params": proxy.policy_params,
        "constants": {
            "tau_pre_s": prices.tau_pre_s,
            "tau_dec_s": prices.tau_dec_s,
            "source": prices.provenance.get("source"),
            "online": proxy.router.online is not None,
            "refits": 0 if proxy.router.online is None else proxy.router.online.calibrator.refits,
        },
        "slo": {
            "tight_ttft_s": cal.slo.tight_ttft_s,
            "tight_tpot_s": cal.slo.tight_tpot_s,
            "loose_factor": cal.slo.loose_factor,
        },
        "chars_per_token": proxy.prompt_length.chars_per_token,
        "in_flight": proxy.ledger.in_flight_requests(),
        "engines": [
            {
                **s.as_dict(),
                "role": s.role.value,
                "url": proxy.urls[s.instance_id],
                "metrics_age_s": None if s.metrics_age_s == float("inf") else s.metrics_age_s,
            }
            for s in (*view.prefill, *view.decode)
        ],
    }


async def set_policy(proxy: Routed, request: Request) -> Response:
    try:
        body = codec.loads(request.body)
        name = body["policy"]
        params = body.get("params", {})
        if not isinstance(name, str) or not isinstance(params, dict):
            raise ConfigError("policy must be a name and params an object")
        proxy.switch_policy(name, params)
    except (codec.DecodeError, KeyError, TypeError) as e:
        return json_error(400, f'expected {{"policy": NAME, "params": {{...}}}}: {e}')
    except ConfigError as e:
        return json_error(400, str(e))
    logger.info("policy switched to %s %s", name, params)
    return json_response({"policy": name, "params": params})
