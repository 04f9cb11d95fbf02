"""One client request through the proxy: what the client may send (``validate``), how a request boards
(``board``: its body, SLO class and prompt length read into a Flight), and its journey across attempts
(``Flight``), which becomes its one record in the shared schema."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from calroute.proxy.http import codec
from calroute.proxy.oracle import ORACLE_HEADER, oracle_tokens
from calroute.proxy.slo import slo_class
from calroute.results.records import RequestRecord
from calroute.types import RequestStatus, SloClass

if TYPE_CHECKING:
    from calroute.proxy.config import ProxyConfig
    from calroute.proxy.http.messages import Request, Stream
    from calroute.proxy.prompt_length import PromptLength

# The only client headers that reach an engine (trace context); everything else is dropped, credentials
# included: engines get the proxy's own key, if any. Each is checked against its grammar first.
FORWARDED_HEADERS = ("traceparent", "tracestate")

# W3C Trace Context (https://www.w3.org/TR/trace-context/): version-traceid-parentid-flags, lowercase hex.
# Version 00 is exactly that; a later version may add fields after a "-" (read as printable ASCII here).
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}(-[\x21-\x7e]*)?")
# tracestate: list-members "key=value", comma-separated with optional spaces and tabs; empty members allowed.
_KEY = re.compile(
    r"[a-z][a-z0-9_\-*/]{0,255}"  # simple-key
    r"|[a-z0-9][a-z0-9_\-*/]{0,240}@[a-z][a-z0-9_\-*/]{0,13}"  # multi-tenant-key: tenant@system
)
_VALUE = re.compile(r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]")
TRACESTATE_MAX_MEMBERS = 32
TRACESTATE_MAX_CHARS = 512


def valid_traceparent(value: str) -> bool:
    m = _TRACEPARENT.fullmatch(value)
    if m is None:
        return False
    version, trace_id, parent_id, rest = m.groups()
    if version == "ff" or trace_id == "0" * 32 or parent_id == "0" * 16:
        return False
    return version != "00" or rest is None


def valid_tracestate(value: str) -> bool:
    if len(value) > TRACESTATE_MAX_CHARS:
        return False
    keys: set[str] = set()
    for member in value.split(","):
        member = member.strip(" \t")
        if not member:
            continue
        key, eq, val = member.partition("=")
        if not eq or _KEY.fullmatch(key) is None or _VALUE.fullmatch(val) is None or key in keys:
            return False
        keys.add(key)
    return 0 < len(keys) <= TRACESTATE_MAX_MEMBERS


def forwarded(headers: Mapping[str, str]) -> dict[str, str]:
    """The trace context to pass on to the engines: a traceparent only if valid (W3C: an invalid one is
    not propagated), a tracestate only if valid and with a valid traceparent (W3C: without one it is
    dropped). Anything else the client sent stays with the proxy."""
    parent = headers.get("traceparent")
    if parent is None or not valid_traceparent(parent):
        return {}
    state = headers.get("tracestate")
    if state is None or not valid_tracestate(state):
        return {"traceparent": parent}
    return {"traceparent": parent, "tracestate": state}


@dataclass
class Flight:
    """One client request's journey, across attempts."""

    request_id: str
    arrival_s: float
    slo: SloClass
    prompt_tokens: int
    prompt_chars: int | None
    target_tokens: int
    predicted: int = 0
    prefill_id: str | None = None
    decode_id: str | None = None
    admitted: bool = False  # in the ledger now
    prefill_done_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    output_tokens: int = 0
    recorded: bool = False
    forwarded: dict[str, str] = field(default_factory=dict)  # client headers on the allow-list
    oracle_tokens: int | None = None  # the true output length (ORACLE_HEADER): oracle studies only
    stream: Stream | None = None  # the client's event stream, once its head went out

    def record(self, policy: str, status: RequestStatus, error: str | None) -> RequestRecord:
        return RequestRecord(
            request_id=self.request_id,
            slo_class=self.slo,
            prompt_tokens=self.prompt_tokens,
            target_output_tokens=self.target_tokens,
            predicted_output_tokens=self.predicted,
            output_tokens=self.output_tokens,
            policy=policy,
            prefill_id=self.prefill_id,
            decode_id=self.decode_id,
            arrival_s=self.arrival_s,
            prefill_done_s=self.prefill_done_s,
            first_token_s=self.first_token_s,
            last_token_s=self.last_token_s,
            status=status,
            error=error,
        )


@dataclass(frozen=True)
class Invalid:
    """Why a request body cannot be served: a 400 naming the field (``param``) when there is one."""

    message: str
    param: str | None = None


def validate(body: Any, path: str, max_model_len: int) -> Invalid | None:
    """None when the proxy can route the body; what is wrong with it otherwise. Only what the proxy
    itself reads is checked here: the engine judges the rest, and its 4xx goes back to the client."""
    if not isinstance(body, dict):
        return Invalid("the request body must be a JSON object")
    key = "messages" if path.endswith("chat/completions") else "prompt"
    if key not in body:
        return Invalid(f"{key} is required", key)
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            return Invalid(f"{name} must be an integer", name)
        if value < 1 or value > max_model_len:
            return Invalid(f"{name} must be in [1, {max_model_len}], got {value}", name)
    if not isinstance(body.get("stream", False), bool):
        return Invalid("stream must be a boolean", "stream")
    return None


def board(
    request: Request,
    path: str,
    cfg: ProxyConfig,
    prompt_length: PromptLength,
    request_id: str,
    arrival_s: float,
) -> tuple[dict[str, Any], Flight] | Invalid:
    """The client's body and the request's Flight, or why it cannot be served (a 400)."""
    try:
        body = codec.loads(request.body)
    except codec.DecodeError as e:
        return Invalid(f"the request body is not valid JSON: {e}")
    invalid = validate(body, path, cfg.cluster.max_model_len)
    if invalid is not None:
        return invalid
    try:
        slo = slo_class(request.headers, cfg.calibration.slo, cfg.default_slo)
    except ValueError as e:
        return Invalid(str(e), "headers")
    true_tokens: int | None = None
    if cfg.predictor == "oracle":
        true_tokens = oracle_tokens(request.headers.get(ORACLE_HEADER))
        if true_tokens is None:
            return Invalid(
                f"the oracle predictor needs the {ORACLE_HEADER} header: a positive integer", "headers"
            )
    tokens, chars = prompt_length.estimate(body)
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    flight = Flight(
        request_id,
        arrival_s,
        slo,
        tokens,
        chars,
        max_tokens if isinstance(max_tokens, int) else 0,
        forwarded=forwarded(request.headers),
        oracle_tokens=true_tokens,
    )
    return body, flight
