"""OpenAI chat messages and tools as vLLM hands them to a chat template (text content only).

Followed (vLLM 0.32, vllm/renderers/chat_utils.py): ``parse_chat_messages`` -> ``_parse_chat_message_content``
(content None -> no parts, a string -> one text part; the Claude Code billing header dropped from system
text; assistant ``tool_calls`` and ``reasoning``; tool ``tool_call_id`` and list content joined; ``name``,
``task``; a developer message's ``tools``), ``_parse_chat_message_content_part`` (the "string" content
format joins text parts with a newline, "openai" keeps ``{"type": "text", "text": ...}`` dicts and their
unknown fields) and ``_postprocess_messages`` (tool-call arguments parsed to dicts). Tools are dumped as
vLLM's ``ChatCompletionToolsParam.model_dump`` writes them (vllm/entrypoints/openai/chat_completion/
protocol.py and generate/base/protocol.py ``FunctionDefinition``).

Not reproduced: multimodal parts (images, audio, video, embeddings) raise TokenizeError, since their
placeholders and token counts depend on the model's processor; and pydantic's re-validation of the message
TypedDicts (keys it would drop, its error texts: ours say what is wrong in our own words).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from calroute.contract.tokenizer import TokenizeError

ContentFormat = Literal["string", "openai"]

# Part types read as text, and the key their text is under (vLLM's TEXT_PART_TYPES and MM_PARSER_MAP).
_TEXT_KEY = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}
_SKIP_NONE = ("text", "refusal")  # PART_TYPES_TO_SKIP_NONE_CONTENT: a None text is dropped, not an error
_MEDIA_TYPES = (
    "input_image",
    "image_url",
    "image_embeds",
    "audio_embeds",
    "video_embeds",
    "prompt_embeds",
    "image_pil",
    "audio_url",
    "input_audio",
    "video_url",
)
_SUPPORTED_TYPES = sorted({*_TEXT_KEY, *_MEDIA_TYPES, "tool_reference"})
# Every field of vLLM's content part TypedDicts: the others ride along in the "openai" format's dicts.
_KNOWN_PART_FIELDS = frozenset(
    {
        *("audio_embeds", "audio_url", "closed", "data", "file", "image_embeds", "image_pil", "image_url"),
        *("input_audio", "name", "prompt_cache_breakpoint", "refusal", "text", "thinking", "type", "uuid"),
        *("video_embeds", "video_url"),
    }
)
_BILLING_HEADER = "x-anthropic-billing-header"


def conversation(messages: Any, content_format: ContentFormat) -> list[dict[str, Any]]:
    """The messages as the template's ``messages``."""
    if not isinstance(messages, list):
        raise TokenizeError("messages must be a list of message objects (parameter=messages)")
    out = [_message(m, i, content_format) for i, m in enumerate(messages)]
    for message in out:
        _parse_tool_call_arguments(message)
    return out


def _message(message: Any, index: int, content_format: ContentFormat) -> dict[str, Any]:
    if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
        raise TokenizeError(f"messages[{index}] must be an object with a string role (parameter=messages)")
    role: str = message["role"]
    content = message.get("content")
    parts: list[Any]
    if content is None:
        parts = []
    elif isinstance(content, str):
        parts = [{"type": "text", "text": content}]
    elif isinstance(content, list):
        parts = content
    else:
        raise TokenizeError(
            f"messages[{index}].content must be a string or a list of parts (parameter=messages)"
        )
    if role == "system":
        parts = _strip_billing_header(parts)
    texts = [t for t in (_part(p, content_format) for p in parts) if t]  # an empty text is dropped
    out: dict[str, Any] = {
        "role": role,
        "content": texts if content_format == "openai" else "\n".join(texts),
    }
    if role == "assistant":
        if message.get("tool_calls") is not None:
            # copies: their arguments are parsed in place below, and the body is the caller's
            out["tool_calls"] = [_copy_call(c) for c in message["tool_calls"]]
        if (reasoning := message.get("reasoning")) is not None:
            out["reasoning"] = reasoning
            out["reasoning_content"] = reasoning  # the older name templates still read
    elif role == "tool":
        if "tool_call_id" in message:
            out["tool_call_id"] = message["tool_call_id"]
        listed = out["content"]
        if isinstance(listed, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in listed):
            out["content"] = "\n".join(p.get("text", "") for p in listed)
    for key in ("name", "task"):
        if isinstance(message.get(key), str):
            out[key] = message[key]
    if role == "developer":
        out["tools"] = message.get("tools")
    return out


def _copy_call(call: Any) -> Any:
    if not isinstance(call, Mapping):
        return call
    function = call.get("function")
    return {**call, "function": dict(function)} if isinstance(function, Mapping) else dict(call)


def _part(part: Any, content_format: ContentFormat) -> Any:
    """One content part: its text (a string, or the "openai" format's dict), or None to drop it."""
    wrap = content_format == "openai"
    if isinstance(part, str):
        return {"type": "text", "text": part} if wrap else part
    if not isinstance(part, Mapping):
        raise TokenizeError("a content part must be a string or an object (parameter=messages)")
    kind = part.get("type")
    if kind is None or part.get("uuid") is not None:
        if any(key in part for key in _MEDIA_TYPES):
            raise _multimodal()
        if "tool_reference" in part:
            kind = "tool_reference"
        else:
            raise TokenizeError("Missing 'type' field in multimodal part. (parameter=type)")
    if not isinstance(kind, str):
        raise TokenizeError("Invalid 'type' field in multimodal part. (parameter=type)")
    if kind in _TEXT_KEY:
        text = part.get(_TEXT_KEY[kind])
        if text is None and kind in _SKIP_NONE:
            return None
        if not isinstance(text, str):
            raise TokenizeError(
                f"a {kind!r} content part needs a string {_TEXT_KEY[kind]!r} (parameter=messages)"
            )
        if not wrap:
            return text
        extra = {k: v for k, v in part.items() if k not in _KNOWN_PART_FIELDS}
        return {"type": "text", "text": text, **extra}
    if kind == "tool_reference":
        name = part.get("name")
        return {"type": "tool_reference", "name": name} if wrap else name
    if kind in _MEDIA_TYPES:
        raise _multimodal()
    raise TokenizeError(
        f"Unsupported chat content part type: {kind!r}. Supported types: {', '.join(_SUPPORTED_TYPES)}. "
        f"(parameter=type, value={kind})"
    )


def _multimodal() -> TokenizeError:
    return TokenizeError("multimodal content parts are not supported by calroute's tokenizer (text only)")


def _strip_billing_header(parts: list[Any]) -> list[Any]:
    """Claude Code's first system line changes on every request: vLLM drops it so the prefix caches."""
    out = []
    for part in parts:
        text = part if isinstance(part, str) else part.get("text") if isinstance(part, Mapping) else None
        if isinstance(part, Mapping) and part.get("type") != "text":
            text = None
        if not (isinstance(text, str) and text.startswith(_BILLING_HEADER)):
            out.append(part)
            continue
        rest = text.partition("\n")[2]
        if rest:
            out.append(rest if isinstance(part, str) else {**part, "text": rest})
    return out


def _parse_tool_call_arguments(message: dict[str, Any]) -> None:
    """Templates read an assistant tool call's arguments as a mapping: a JSON string is parsed, and
    anything that is not an object (malformed, a list, a number) becomes {} so the conversation goes on."""
    if message["role"] != "assistant" or not isinstance(message.get("tool_calls"), list):
        return
    calls = message["tool_calls"]
    if not calls:
        del message["tool_calls"]
        return
    for call in calls:
        if not isinstance(call, dict):
            raise TokenizeError("assistant tool_calls entries must be objects. (parameter=tool_calls)")
        function = call.get("function")
        if call.get("type", "function") != "function" or not isinstance(function, dict):
            raise TokenizeError(
                "chat completions only support assistant tool_calls of type 'function'. "
                "(parameter=tool_calls)"
            )
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            try:
                arguments = json.loads(arguments)
            except ValueError:
                arguments = None
        function["arguments"] = arguments if isinstance(arguments, dict) else {}


def tool_dicts(tools: Any) -> list[dict[str, Any]] | None:
    """The request's tools as vLLM dumps them: only the model's fields, description and parameters always
    present (None when absent), strict and defer_loading only when set."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise TokenizeError("tools must be a list (parameter=tools)")
    return [_tool(t, i) for i, t in enumerate(tools)]


def _tool(tool: Any, index: int) -> dict[str, Any]:
    function = tool.get("function") if isinstance(tool, Mapping) else None
    if (
        not isinstance(function, Mapping)
        or not isinstance(function.get("name"), str)
        or tool.get("type", "function") != "function"
    ):
        raise TokenizeError(f"tools[{index}] must be a function tool with a string name (parameter=tools)")
    defer = tool.get("defer_loading")
    out_function: dict[str, Any] = {
        "name": function["name"],
        "description": function.get("description"),
        "parameters": function.get("parameters"),
    }
    if function.get("strict") is not None:
        out_function["strict"] = function["strict"]
    if (function_defer := function.get("defer_loading", defer)) is not None:
        out_function["defer_loading"] = function_defer
    out: dict[str, Any] = {"type": "function", "function": out_function}
    if defer is not None:
        out["defer_loading"] = defer
    return out


def developer_as_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM's ``_convert_developer_to_system`` then ``_consolidate_system_messages`` (vllm/renderers/hf.py),
    for a template that does not name the developer role: developer messages become system ones (without
    their tools), and when a system message is not first or not alone, all of them merge into one first
    message, their texts joined by a blank line."""
    converted = [
        {k: v for k, v in m.items() if k != "tools"} | {"role": "system"} if m["role"] == "developer" else m
        for m in messages
    ]
    texts: list[str] = []
    others: list[dict[str, Any]] = []
    merge = False
    for i, message in enumerate(converted):
        if message["role"] != "system":
            others.append(message)
            continue
        merge = merge or i > 0 or bool(texts)
        content = message.get("content", "")
        if isinstance(content, list):
            content = "\n".join(
                p["text"] if isinstance(p, dict) else p
                for p in content
                if (isinstance(p, dict) and "text" in p) or isinstance(p, str)
            )
        if content:
            texts.append(content)
    return [{"role": "system", "content": "\n\n".join(texts)}, *others] if merge else converted
