"""The served model's own tokenizer and chat template: the ids a real vLLM engine prefills for a request.

Followed (vLLM 0.32): a completions body's text is tokenized with special tokens unless it says
``add_special_tokens: false`` (``CompletionRequest.add_special_tokens``, default True); a chat body's
messages are read by ``parse_chat_messages`` in the content format ``resolve_chat_template_content_format``
detects, rendered to text by ``safe_apply_chat_template`` (the template resolved as ``resolve_chat_template``
does, developer messages converted when the template does not name that role, the kwargs filtered by
``resolve_chat_template_kwargs``) through transformers' ``apply_chat_template`` (the special tokens map
under the request's kwargs, ``tokenize=False``), then tokenized with ``add_special_tokens`` from the body
(default False for chat); the request's kwargs merge as ``ChatCompletionRequest.build_chat_params``,
``OnlineRenderer.preprocess_chat`` and ``ChatParams.with_defaults`` merge them (``merge_kwargs``: a None or
"auto" override is no override). ``truncate_prompt_tokens`` cuts as ``TokenizeParams`` does. Text is
encoded by the ``tokenizers`` library from tokenizer.json, what vLLM's fast tokenizers run.

The context-length check is not made here: the ids are the prompt as the engine reads it, and an engine
refuses an over-long one whatever the routing.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from calroute.contract.tokenizer import TokenizeError
from calroute.errors import ConfigError
from calroute.tokenizer.files import TokenizerFiles
from calroute.tokenizer.messages import ContentFormat, conversation, developer_as_system, tool_dicts
from calroute.tokenizer.prefix_store import DEFAULT_CHECK_EVERY, DEFAULT_MAX_CHARS, PrefixStore
from calroute.tokenizer.template import Renderer, supports_developer_role

DEFAULT_MAX_OUTPUT_CHARS = 4_000_000  # a rendered prompt past ~4 MB is far beyond any context length
DEFAULT_MAX_RENDER_S = 1.0  # an 8k-token chat renders in about a millisecond
# the engine's --chat-template-content-format; None: detected from the template ("auto")
_CONTENT_FORMATS: dict[str, ContentFormat | None] = {"auto": None, "string": "string", "openai": "openai"}
_UNSET = (None, "auto")  # vLLM's merge_kwargs: these override nothing
# transformers' apply_chat_template's own parameters: what reaches the template is the rest.
_APPLY_PARAMS = frozenset(
    {
        *("conversation", "tools", "documents", "chat_template", "add_generation_prompt"),
        *("continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors"),
        *("return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"),
    }
)
_UNTRUSTED_TEMPLATE = (
    "Chat template is passed with request, but --trust-request-chat-template is not set. "
    "Refused request with untrusted chat template."
)
_NO_TEMPLATE = (
    "As of transformers v4.44, default chat template is no longer allowed, so you must provide a chat "
    "template if the tokenizer does not define one."
)


def _merge(defaults: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    return {**defaults, **{k: v for k, v in overrides.items() if not _is_unset(v)}}


def _is_unset(value: Any) -> bool:
    return any(value is u or (isinstance(value, str) and value == u) for u in _UNSET)


class HfTokenizer:
    """contract.tokenizer.Tokenizer for a model in Hugging Face's layout, matching vLLM 0.32's ids.

    ``chat_template``, ``content_format``, ``default_chat_template_kwargs`` and
    ``trust_request_chat_template`` mirror the engine's flags of the same names (``--chat-template`` as the
    template's text). ``max_model_len`` is only needed for ``truncate_prompt_tokens: -1``.

    ``prefix_store_chars``: the characters of prompt text kept so that a prompt sharing a long prefix with an
    earlier one (a repeated system prompt) encodes only its new part (prefix_store.py; 0: no store);
    ``prefix_store_check_every``: its valve, 1 hit in that many also encoded whole and compared (0: never).
    ``prefix_store`` is the store (None without one), its counters for export; for a tokenizer whose pipeline
    it is not proven for it stays empty and every text is encoded whole (``prefix_store.reason`` says why).
    """

    def __init__(
        self,
        directory: Path | str,
        *,
        name: str | None = None,
        chat_template: str | None = None,
        content_format: str = "auto",
        default_chat_template_kwargs: Mapping[str, Any] | None = None,
        trust_request_chat_template: bool = False,
        max_model_len: int | None = None,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
        max_render_s: float = DEFAULT_MAX_RENDER_S,
        prefix_store_chars: int = DEFAULT_MAX_CHARS,
        prefix_store_check_every: int = DEFAULT_CHECK_EVERY,
    ) -> None:
        if content_format not in _CONTENT_FORMATS:
            raise ConfigError(f"content_format must be auto, string or openai, got {content_format!r}")
        if max_output_chars <= 0 or max_render_s <= 0:
            raise ConfigError("max_output_chars and max_render_s must be positive")
        if prefix_store_chars < 0 or prefix_store_check_every < 0:
            raise ConfigError("prefix_store_chars and prefix_store_check_every must be at least 0")
        directory = Path(directory)
        self.name = name or f"hf:{directory.name}"
        self._files = TokenizerFiles.load(directory)
        self._server_template = chat_template
        self._content_format = _CONTENT_FORMATS[content_format]
        self._default_kwargs = dict(default_chat_template_kwargs or {})
        self._trust_request_template = trust_request_chat_template
        self._max_model_len = max_model_len
        self._renderer = Renderer(max_output_chars, max_render_s)
        self.prefix_store = (
            PrefixStore(
                self._files.tokenizer, max_chars=prefix_store_chars, check_every=prefix_store_check_every
            )
            if prefix_store_chars
            else None
        )

    def counters(self) -> Mapping[str, float]:
        """The prefix store's (prefix_store.py): its hits, misses, valve checks, mismatches (a mismatch turns
        it off) and evictions, the texts and characters it holds, whether it is on."""
        store = self.prefix_store
        if store is None:
            return {"prefix_store_enabled": 0.0}
        return {
            "prefix_store_enabled": 1.0 if store.enabled else 0.0,
            "prefix_store_hits_total": store.hits,
            "prefix_store_misses_total": store.misses,
            "prefix_store_checks_total": store.checks,
            "prefix_store_mismatches_total": store.mismatches,
            "prefix_store_evictions_total": store.evictions,
            "prefix_store_entries": len(store),
            "prefix_store_chars": store.chars,
        }

    def prompt_ids(self, body: Mapping[str, Any], chat: bool) -> list[int]:
        if not isinstance(body, Mapping):
            raise TokenizeError("the request body must be a JSON object")
        if chat:
            text, add_special = self.render_chat(body), bool(body.get("add_special_tokens", False))
        else:
            prompt = _single_prompt(body.get("prompt"))
            if not isinstance(prompt, str):
                return self._checked_ids(prompt)
            text, add_special = prompt, bool(body.get("add_special_tokens", True))
        return self._encode(text, add_special, body)

    def render_chat(self, body: Mapping[str, Any]) -> str:
        """The chat body's prompt text, as vLLM renders it before tokenizing."""
        if body.get("continue_final_message") and body.get("add_generation_prompt"):
            raise TokenizeError(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
            )
        user_kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(user_kwargs, Mapping):
            raise TokenizeError("chat_template_kwargs must be an object (parameter=chat_template_kwargs)")
        request_template = body.get("chat_template")
        if not self._trust_request_template and (
            request_template is not None or user_kwargs.get("chat_template") is not None
        ):
            raise TokenizeError(_UNTRUSTED_TEMPLATE)
        effort = body.get("reasoning_effort")
        extra: dict[str, Any] = {
            "add_generation_prompt": body.get("add_generation_prompt", True),
            "continue_final_message": body.get("continue_final_message", False),
            "documents": body.get("documents"),
            "reasoning_effort": effort,
        }
        if effort is not None and "enable_thinking" not in user_kwargs:
            extra["enable_thinking"] = effort != "none"
        kwargs = _merge(
            _merge(self._default_kwargs, {"tools": tool_dicts(body.get("tools")), "tokenize": False}),
            _merge(user_kwargs, extra),
        )
        kwargs = _merge(kwargs, {"chat_template": request_template or self._server_template})
        source = self._resolve_template(kwargs.pop("chat_template", None), kwargs.get("tools"))
        content_format = self._content_format or self._renderer.content_format(source)
        messages = conversation(body.get("messages"), content_format)
        if any(m["role"] == "developer" for m in messages) and not supports_developer_role(source):
            messages = developer_as_system(messages)
        if not messages:
            raise TokenizeError(
                "Cannot apply chat template to an empty conversation. Provide at least one message."
            )
        if kwargs.pop("tokenize", False):
            raise TokenizeError("chat_template_kwargs.tokenize is not supported by calroute's tokenizer")
        accepted = self._renderer.variables(source) | _APPLY_PARAMS
        kwargs = {k: v for k, v in kwargs.items() if k in accepted}
        if kwargs.get("return_assistant_tokens_mask"):
            raise TokenizeError(
                "`return_assistant_tokens_mask=True` requires `return_dict=True` and `tokenize=True`"
            )
        if "conversation" in kwargs or "messages" in kwargs:
            raise TokenizeError("got multiple values for the template's messages")
        template_kwargs = {k: v for k, v in kwargs.items() if k not in _APPLY_PARAMS}
        return self._renderer.render(
            source,
            messages,
            bool(kwargs.get("continue_final_message", False)),
            tools=kwargs.get("tools"),
            documents=kwargs.get("documents"),
            add_generation_prompt=kwargs.get("add_generation_prompt", False),
            **(self._files.special_tokens | template_kwargs),
        )

    def _resolve_template(self, given: str | None, tools: Any) -> str:
        """vLLM's resolve_chat_template through transformers' get_chat_template: a given template (or the
        name of one of the model's), else the model's ("tool_use" when tools are given and it has one)."""
        own = self._files.chat_template
        if given is not None:
            return own[given] if isinstance(own, dict) and given in own else given
        if isinstance(own, dict):
            if tools is not None and "tool_use" in own:
                return own["tool_use"]
            if "default" in own:
                return own["default"]
            raise TokenizeError(_NO_TEMPLATE)
        if own is None:
            raise TokenizeError(_NO_TEMPLATE)
        return own

    def _encode(self, text: str, add_special: bool, body: Mapping[str, Any]) -> list[int]:
        """TokenizeParams: ``truncate_prompt_tokens`` N keeps N tokens (-1: the context length less one).
        Without a ``truncation_side`` the tokenizer truncates first, on its own side, keeping the special
        tokens it adds (so N counts them); then the ids are sliced to N from that side."""
        tokenizer = self._files.tokenizer
        keep = self._keep_tokens(body)
        side = body.get("truncation_side")
        if side not in (None, "left", "right"):
            raise TokenizeError(
                "`truncation_side` must be either 'left' or 'right'. (parameter=truncation_side)"
            )
        if keep is None:
            # encode_batch, not encode: the same ids, but tokenizers releases the GIL only in the batch call
            # (0.23: a thread stalls 80 ms beside an 8k-token encode, 3 ms beside encode_batch), so the
            # proxy's event loop runs on while a worker thread tokenizes a long prompt. The prefix store
            # encodes only what follows a prefix it has seen, the same way (and the same ids).
            if self.prefix_store is not None:
                return self.prefix_store.encode(text, add_special)
            return list(tokenizer.encode_batch([text], add_special_tokens=add_special)[0].ids)
        if side is None:
            side = self._files.truncation_side
            encoding = tokenizer.encode(text, add_special_tokens=False)
            added = tokenizer.num_special_tokens_to_add(is_pair=False) if add_special else 0
            if len(encoding.ids) + added > keep:
                encoding.truncate(max(keep - added, 0), direction=side)
            ids = list(tokenizer.post_process(encoding, add_special_tokens=add_special).ids)
        else:
            ids = list(tokenizer.encode_batch([text], add_special_tokens=add_special)[0].ids)
        if keep >= len(ids):
            return ids
        if keep == 0:
            return []
        return ids[-keep:] if side == "left" else ids[:keep]

    def _keep_tokens(self, body: Mapping[str, Any]) -> int | None:
        keep = body.get("truncate_prompt_tokens")
        if keep is None:
            return None
        if type(keep) is not int or keep < -1:
            raise TokenizeError(
                "truncate_prompt_tokens must be an integer >= -1 (parameter=truncate_prompt_tokens)"
            )
        if keep == -1:
            return None if self._max_model_len is None else self._max_model_len - 1
        return keep

    def _checked_ids(self, ids: list[int]) -> list[int]:
        top = self._files.tokenizer.get_vocab_size(with_added_tokens=True) - 1
        for token_id in (min(ids), max(ids)):
            if token_id < 0 or token_id > top:
                raise TokenizeError(f"Token id {token_id} is out of vocabulary (parameter=prompt)")
        return list(ids)


def _single_prompt(prompt: Any) -> str | list[int]:
    """A completions prompt: a string, token ids, or a one-element list of either (more is a batch)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return prompt
    if isinstance(prompt, list) and len(prompt) == 1:
        return _single_prompt(prompt[0])
    if prompt is None:
        raise TokenizeError("prompt is required (parameter=prompt)")
    raise TokenizeError("prompt must be a string, a list of token ids, or a one-element list of either")
