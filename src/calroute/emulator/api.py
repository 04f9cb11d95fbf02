"""The emulator's OpenAI-compatible request parsing and response shapes, as vLLM's server produces them.

Parsing turns a JSON body into a ``Parsed`` request or raises ``ApiError`` (HTTP status, message, param);
building turns an engine request's progress into completion / chat-completion objects and SSE chunks.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from calroute.contract.tokenizer import TokenizeError
from calroute.emulator import tokens
from calroute.errors import CalrouteError


class ApiError(CalrouteError):
    """A request the emulator refuses, with the status and OpenAI error body vLLM would answer."""

    def __init__(
        self, status: int, message: str, param: str | None = None, kind: str = "BadRequestError"
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind

    def body(self) -> dict[str, Any]:
        return {
            "error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}
        }


@dataclass(frozen=True)
class Parsed:
    chat: bool
    prompt_ids: list[int]
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool
    continuous_usage: bool
    return_token_ids: bool
    kv_transfer_params: dict[str, Any] | None


_TYPE_NAMES = {
    int: "a valid integer",
    bool: "a valid boolean",
    dict: "a valid dictionary",
    float: "a valid number",
}


def _type_error(name: str, kind: type | tuple[type, ...], value: Any) -> ApiError:
    # vLLM's request models are pydantic: a type error reads like pydantic's, with a "body." location.
    want = _TYPE_NAMES.get(kind if isinstance(kind, type) else kind[-1], "of another type")
    return ApiError(
        400,
        f"1 validation error:\n  {{'loc': 'body.{name}', 'msg': 'Input should be {want}', "
        f"'input': {value!r}}}",
        f"body.{name}",
        "Bad Request",
    )


def invalid_json(error: str) -> ApiError:
    return ApiError(
        400,
        f"1 validation error:\n  {{'type': 'json_invalid', 'loc': 'body', "
        f"'msg': 'JSON decode error: {error}'}}",
        "body",
        "Bad Request",
    )


def _field(body: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    # bool is an int in Python, but JSON true is not a valid max_tokens
    if isinstance(value, bool) and not (kind is bool or (isinstance(kind, tuple) and bool in kind)):
        raise _type_error(name, kind, value)
    if not isinstance(value, kind):
        raise _type_error(name, kind, value)
    return value


def _prompt_ids(body: Mapping[str, Any]) -> list[int]:
    prompt = body.get("prompt")
    if prompt is None:
        raise ApiError(400, "prompt is required", "prompt")
    if isinstance(prompt, str):
        return tokens.encode(prompt)
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        if any(t < 0 or t >= tokens.VOCAB_SIZE for t in prompt):
            raise ApiError(400, f"prompt token ids must be in [0, {tokens.VOCAB_SIZE})", "prompt")
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) == 1:
        return _prompt_ids({"prompt": prompt[0]})
    raise ApiError(
        400, "prompt must be a string, a list of token ids, or a one-element list of either", "prompt"
    )


def _chat_ids(body: Mapping[str, Any]) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", "messages")
    pairs = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, "each message needs a string role", "messages")
        content = m.get("content")
        if isinstance(content, list):  # OpenAI content parts: the text of the text parts
            parts = [p for p in content if isinstance(p, dict) and p.get("type", "text") == "text"]
            if not all(isinstance(p.get("text"), str) for p in parts):
                raise ApiError(400, "a text content part's text must be a string", "messages")
            content = "".join(p["text"] for p in parts)
        if not isinstance(content, str):
            raise ApiError(400, "message content must be a string or a list of text parts", "messages")
        pairs.append((m["role"], content))
    return tokens.encode(tokens.chat_prompt(pairs))


def prompt_token_ids(body: Mapping[str, Any], chat: bool) -> list[int]:
    """The token ids the emulator prefills for this body (ApiError if it has no valid prompt)."""
    return _chat_ids(body) if chat else _prompt_ids(body)


class EmulatorTokenizer:
    """The emulator's tokenizer and chat template as a contract.tokenizer.Tokenizer: what a proxy in front
    of emulated engines hashes to match their prefix caches (contract/blocks.block_hashes)."""

    name = "emulator"

    def prompt_ids(self, body: Mapping[str, Any], chat: bool) -> list[int]:
        try:
            return prompt_token_ids(body, chat)
        except ApiError as e:
            raise TokenizeError(str(e)) from e

    def counters(self) -> Mapping[str, float]:
        return {}


def parse(body: Any, chat: bool, model_name: str, max_model_len: int) -> Parsed:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != model_name:
        raise ApiError(
            404, f"The model `{model}` does not exist. Valid aliases: {model_name}.", "model", "NotFoundError"
        )
    prompt_ids = _chat_ids(body) if chat else _prompt_ids(body)
    if _field(body, "n", int, 1) != 1:
        raise ApiError(400, "the emulator supports n=1 only", "n")
    default_max = max_model_len - len(prompt_ids) if chat else 16
    max_tokens = _field(
        body,
        "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens",
        int,
        default_max,
    )
    if max_tokens < 1:
        raise ApiError(
            400,
            f"max_tokens must be at least 1, got {max_tokens}. (parameter=max_tokens, value={max_tokens})",
            "max_tokens",
        )
    if max_tokens > max_model_len:
        raise ApiError(
            400,
            f"max_tokens={max_tokens} cannot be greater than max_model_len={max_model_len}. Please request "
            f"fewer output tokens. (parameter=max_tokens, value={max_tokens})",
            "max_tokens",
        )
    if len(prompt_ids) + max_tokens > max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in the messages, {max_tokens} in the "
            "completion). Please reduce the length of the messages or completion.",
            "max_tokens",
        )
    min_tokens = _field(body, "min_tokens", int, 0)
    if min_tokens < 0:
        raise ApiError(400, f"min_tokens must be greater than or equal to 0, got {min_tokens}.")
    if min_tokens > max_tokens:
        raise ApiError(
            400, f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}."
        )
    stream = _field(body, "stream", bool, False)
    options = _field(body, "stream_options", dict, {})
    if options and not stream:
        raise ApiError(400, "Stream options can only be defined when `stream=True`.", "stream_options")
    kv = _field(body, "kv_transfer_params", dict, None)
    temperature = _field(body, "temperature", (int, float), 1.0)
    if temperature < 0:
        raise ApiError(
            400,
            f"temperature must be non-negative, got {float(temperature)}. (parameter=temperature, "
            f"value={float(temperature)})",
            "temperature",
        )
    return Parsed(
        chat=chat,
        prompt_ids=prompt_ids,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=_field(body, "ignore_eos", bool, False),
        stream=stream,
        include_usage=bool(options.get("include_usage", True)) if options else False,
        continuous_usage=bool(options.get("continuous_usage_stats", False)),
        return_token_ids=_field(body, "return_token_ids", bool, False),
        kv_transfer_params=kv,
    )


SYSTEM_FINGERPRINT = "calroute-emulator"


# What the prefix cache did for a prompt, as vLLM reports it with --enable-prompt-tokens-details: the tokens
# served from it, and those its prefill added to it (the prompt's full blocks it did not hold before).
CacheUse = tuple[int, int]


def prompt_tokens_details(chat: bool, whole: bool, cache: CacheUse) -> dict[str, Any]:
    """vLLM 0.32's PromptTokenUsageInfo as each answer writes it: a whole answer all its fields (only chat
    sets ``created_cache_tokens``), a stream's usage chunk only those set (completions: ``cached_tokens``)."""
    cached, created = cache
    if whole:
        return {
            "cached_tokens": cached,
            "created_cache_tokens": created if chat else None,
            "multimodal_tokens": None,
        }
    return {"cached_tokens": cached, "created_cache_tokens": created} if chat else {"cached_tokens": cached}


def usage(
    prompt_tokens: int,
    completion_tokens: int,
    details: bool = True,
    prompt_details: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """vLLM's UsageInfo. ``prompt_details``: ``prompt_tokens_details`` (vLLM with
    --enable-prompt-tokens-details; None: the flag is off, and a whole answer says null, a stream's usage
    chunk nothing)."""
    u: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
    if prompt_details is not None:
        u["prompt_tokens_details"] = prompt_details
    elif details:
        u["prompt_tokens_details"] = None
    if details:
        u["completion_tokens_details"] = None
    return u


def completion_id(chat: bool, request_id: str) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{request_id}"


def full_response(
    p: Parsed,
    request_id: str,
    model: str,
    output_ids: list[int],
    finish_reason: str | None,
    kv_transfer_params: dict[str, Any] | None,
    cache: CacheUse | None = None,
) -> dict[str, Any]:
    text = tokens.decode(output_ids)
    token_ids = list(output_ids) if p.return_token_ids else None
    choice: dict[str, Any]
    if p.chat:
        message = {
            "role": "assistant",
            "content": text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "reasoning": None,
        }
        choice = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
            "token_ids": token_ids,
            "routed_experts": None,
        }
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
            "token_ids": token_ids,
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "routed_experts": None,
        }
    out: dict[str, Any] = {
        "id": completion_id(p.chat, request_id),
        "object": "chat.completion" if p.chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "usage": usage(
            len(p.prompt_ids),
            len(output_ids),
            prompt_details=None if cache is None else prompt_tokens_details(p.chat, True, cache),
        ),
    }
    if p.chat:
        out.update(prompt_logprobs=None, prompt_token_ids=None, prompt_text=None)
    out.update(kv_transfer_params=kv_transfer_params, ec_transfer_params=None, metrics=None)
    return out


def sse(obj: dict[str, Any] | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def stream_chunk(
    p: Parsed,
    request_id: str,
    model: str,
    created: int,
    new_ids: list[int],
    finish_reason: str | None,
    role: bool = False,
    usage_obj: dict[str, Any] | None = None,
) -> dict[str, Any]:
    text = tokens.decode(new_ids)
    token_ids = list(new_ids) if p.return_token_ids else None
    choice: dict[str, Any]
    if p.chat:
        if role:
            choice = {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        else:
            choice = {
                "index": 0,
                "delta": {"content": text},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
            if finish_reason is not None:
                choice["stop_reason"] = None
            choice["token_ids"] = token_ids
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
            "prompt_token_ids": None,
            "token_ids": token_ids,
        }
    chunk: dict[str, Any] = {
        "id": completion_id(p.chat, request_id),
        "object": "chat.completion.chunk" if p.chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
    }
    if p.chat and role:
        chunk.update(prompt_token_ids=None, prompt_text=None)
    if usage_obj is not None:
        chunk["usage"] = usage_obj
    return chunk


def usage_chunk(
    p: Parsed,
    request_id: str,
    model: str,
    created: int,
    completion_tokens: int,
    cache: CacheUse | None = None,
) -> dict[str, Any]:
    details = None if cache is None else prompt_tokens_details(p.chat, False, cache)
    return {
        "id": completion_id(p.chat, request_id),
        "object": "chat.completion.chunk" if p.chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage(len(p.prompt_ids), completion_tokens, details=False, prompt_details=details),
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }
