"""One client request through the proxy: what the client may send (``validate``), how a request boards
(``board``: its body, SLO class and prompt length read into a Flight), and its journey across attempts
(``Flight``), which becomes its one record in the shared schema."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from calroute.proxy.http import codec
from calroute.proxy.oracle import ORACLE_HEADER, oracle_tokens
from calroute.proxy.slo import slo_class
from calroute.results.records import RequestRecord
from calroute.routing.block_hash import machine_token_ids
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
    # The prompt's blocks as the prefix index names them (empty without an index, or for a prompt the
    # proxy cannot tokenize), the tokens the index expected the chosen prefill engine to hold, and what
    # that engine said it served from its cache (kv_transfer_params.remote_prefill_cached_tokens).
    prefix_blocks: Sequence[int] = ()  # a PromptBlocks: hashed as far as the router asks (proxy/prefix.py)
    # the prompt's token ids as machine ints: a token-id prompt's (board), or the tokenizer's (generate.py)
    prompt_ids: npt.NDArray[np.uint64] | None = None
    predicted_cached_tokens: int = 0
    cached_tokens: int = 0
    # What the router priced at its first admission (prompt_tokens becomes the engine's count once a prefill
    # engine reports it), and whether that was an estimate from characters.
    priced_prompt_tokens: int | None = None
    prompt_estimated: bool = False
    # A prefill engine holds this request's KV for this decode engine, which has not taken it yet: the KV
    # params to release it with if the client leaves now (generate.py, "release").
    handoff: tuple[str, dict[str, Any]] | None = None
    # The path of the current attempt: its decode engine prefills the prompt itself (RouteDecision.local;
    # prefill_id is then decode_id), and why the router chose the path (RouteDecision.reason).
    local: bool = False
    path_reason: str = ""

    @property
    def hop(self) -> str:
        """The phase a failure of its decode engine's leg is counted under: "local" or "decode"."""
        return "local" if self.local else "decode"

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
            cached_tokens=self.cached_tokens,
            priced_prompt_tokens=self.priced_prompt_tokens,
            predicted_cached_tokens=self.predicted_cached_tokens,
            prompt_estimated=self.prompt_estimated,
            local_prefill=self.local,
            path_reason=self.path_reason,
        )


@dataclass(frozen=True)
class Invalid:
    """Why a request body cannot be served: a 400 naming the field (``param``) when there is one."""

    message: str
    param: str | None = None


# The deepest nesting of arrays and objects a body may have, the body itself counting as one. The proxy
# writes the body back twice (prefill, decode: codec.dumps), and orjson writes at most 254 nested levels
# (its recursion limit is 255; it reads up to 1024); past that, the standard library's encoder, codec's
# fallback, would recurse until Python's own limit and fail the request with a 500.
MAX_DEPTH = 254

PROMPT_TYPES = "a string, a list of token ids, a list of strings or a list of lists of token ids"


def _is_int(value: Any) -> bool:
    return type(value) is int  # JSON's integers; not a bool, not a float that happens to be whole


def _deeper_than(value: Any, limit: int) -> bool:
    """True when ``value`` nests more than ``limit`` arrays and objects (itself counting as one). A walk
    with a stack, not recursion: the body may nest up to 1024 levels (orjson's reading limit)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > limit:
            return True
        for child in v.values() if isinstance(v, dict) else v:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return False


def _prompt_ok(prompt: Any) -> bool:
    """str | list[int] | list[str] | list[list[int]], as vLLM accepts (empty lists are the engine's call)."""
    if isinstance(prompt, str):
        return True
    if not isinstance(prompt, list):
        return False
    if not prompt:
        return True
    first = prompt[0]
    if _is_int(first):
        # the conversion checks the common case in C; the loop gives the verdict on the rest (an id past
        # 64 bits is a JSON integer too: the engine judges it)
        return machine_token_ids(prompt) is not None or all(_is_int(t) for t in prompt)
    if isinstance(first, str):
        return all(isinstance(t, str) for t in prompt)
    return all(isinstance(p, list) and all(_is_int(t) for t in p) for p in prompt)


def _messages_invalid(messages: Any) -> Invalid | None:
    """A list of objects with a string ``role`` and a ``content`` that is a string, null, or a list of
    parts: objects whose ``type`` is a string and whose ``text``, for a text part, is a string."""
    if not isinstance(messages, list):
        return Invalid("messages must be a list of message objects", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            return Invalid(f"messages[{i}] must be an object", "messages")
        if not isinstance(m.get("role"), str):
            return Invalid(f"messages[{i}].role must be a string", "messages")
        content = m.get("content")
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, list):
            return Invalid(f"messages[{i}].content must be a string or a list of content parts", "messages")
        for j, part in enumerate(content):
            where = f"messages[{i}].content[{j}]"
            if not isinstance(part, dict):
                return Invalid(f"{where} must be an object", "messages")
            kind = part.get("type")
            if not isinstance(kind, str):
                return Invalid(f"{where}.type must be a string", "messages")
            if kind == "text" and not isinstance(part.get("text"), str):
                return Invalid(f"{where}.text must be a string", "messages")
    return None


def _optional_int(body: dict[str, Any], name: str, low: int, high: int | None) -> Invalid | None:
    value = body.get(name)
    if value is None:
        return None  # absent or null: the engine's default
    if not _is_int(value):
        return Invalid(f"{name} must be an integer", name)
    if value < low or (high is not None and value > high):
        bounds = f"[{low}, {high}]" if high is not None else f"at least {low}"
        return Invalid(f"{name} must be {'in ' if high is not None else ''}{bounds}, got {value}", name)
    return None


def validate(
    body: Any, path: str, max_model_len: int, prompt_ids: npt.NDArray[np.uint64] | None = None
) -> Invalid | None:
    """None when the proxy can route the body; what is wrong with it otherwise: the fields the proxy reads
    or writes back (prompt or messages, the token limits, stream and its options), the few it relays
    whose type vLLM fixes (model, n, min_tokens, ignore_eos), and the body's depth. The engine judges the
    rest, and its 4xx goes back to the client. ``prompt_ids``: the prompt's token ids as ``board``
    converted them (routing/block_hash.machine_token_ids), which checked them already."""
    if not isinstance(body, dict):
        return Invalid("the request body must be a JSON object")
    chat = path.endswith("chat/completions")
    key = "messages" if chat else "prompt"
    if key not in body:
        return Invalid(f"{key} is required", key)
    # The prompt's shape is checked below without recursion; skipping it here spares a walk over every
    # token id of a long prompt.
    for name, value in body.items():
        if (
            isinstance(value, (dict, list))
            and (chat or name != "prompt")
            and _deeper_than(value, MAX_DEPTH - 1)
        ):
            return Invalid(
                f"{name} is nested more than {MAX_DEPTH} levels deep (the body counting as one)", name
            )
    if chat:
        invalid = _messages_invalid(body["messages"])
        if invalid is not None:
            return invalid
    elif prompt_ids is None and not _prompt_ok(body["prompt"]):
        return Invalid(f"prompt must be {PROMPT_TYPES}", "prompt")
    for name in ("max_tokens", "max_completion_tokens"):
        invalid = _optional_int(body, name, 1, max_model_len)
        if invalid is not None:
            return invalid
    for name, low in (("min_tokens", 0), ("min_completion_tokens", 0), ("n", 1)):
        invalid = _optional_int(body, name, low, None)
        if invalid is not None:
            return invalid
    for name in ("stream", "ignore_eos"):
        if body.get(name) is not None and not isinstance(body[name], bool):
            return Invalid(f"{name} must be a boolean", name)
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            return Invalid("stream_options must be an object", "stream_options")
        if options.get("include_usage") is not None and not isinstance(options["include_usage"], bool):
            return Invalid("stream_options.include_usage must be a boolean", "stream_options")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        return Invalid("model must be a string", "model")
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
    # A token-id prompt is converted once, here: the conversion is the check of its ids, and the array is
    # what the prefix index hashes (proxy/prefix.py).
    chat = path.endswith("chat/completions")
    prompt_ids = None if chat or not isinstance(body, dict) else machine_token_ids(body.get("prompt"))
    invalid = validate(body, path, cfg.cluster.max_model_len, prompt_ids)
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
        prompt_ids=prompt_ids,
    )
    return body, flight
