"""A served model's tokenizer files, read as transformers v5 reads a local directory in Hugging Face's layout.

Followed: transformers' ``PreTrainedTokenizerBase._from_pretrained`` (tokenization_utils_base.py: which
files, the chat template's sources and their priority) and ``TokenizersBackend.__init__``
(tokenization_utils_tokenizers.py: the Rust tokenizer built from tokenizer.json, named special tokens missing
from it added as special tokens, ``split_special_tokens``, a post-processor written from
``add_bos_token``/``add_eos_token`` only when tokenizer.json has none). No weights are read.

Not reproduced: a ``tokenizer_class`` whose transformers v5 class rebuilds the pipeline from the vocabulary
(its own normalizer or pre-tokenizer in place of tokenizer.json's), the Mistral regex patch (vocabularies over
100k with a wrong split regex), slow (Python) tokenizers, and chat templates that only a multimodal
processor or vLLM's per-architecture fallbacks provide. For such a model, run the parity test against its
engine (tests/tokenizer/test_parity_vllm.py) before trusting the ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import AddedToken
from tokenizers import Tokenizer as RustTokenizer
from tokenizers.processors import TemplateProcessing

from calroute.errors import ConfigError

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"  # legacy: read when the config names no special token
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # transformers v5 saves a single template here
CHAT_TEMPLATE_DIR = "additional_chat_templates"  # ... and named ones here, one <name>.jinja each
# transformers' PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES: the names a chat template sees.
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


@dataclass(frozen=True)
class TokenizerFiles:
    """What a directory says about the tokenizer: the Rust tokenizer ready to encode, the special tokens a
    template sees, the chat template(s) and the truncation side."""

    tokenizer: RustTokenizer
    special_tokens: dict[str, str]  # bos_token -> "<s>", ...: transformers' special_tokens_map
    # None: no template; str: one; dict: named templates ("default", "tool_use", ...)
    chat_template: str | dict[str, str] | None
    truncation_side: str  # "right" or "left": which end a truncate_prompt_tokens without a side cuts

    @classmethod
    def load(cls, directory: Path) -> TokenizerFiles:
        path = directory / TOKENIZER_FILE
        if not path.is_file():
            raise ConfigError(f"{directory}: no {TOKENIZER_FILE} (a fast tokenizer is required)")
        config = _read_json(directory / CONFIG_FILE)
        legacy = _read_json(directory / SPECIAL_TOKENS_MAP_FILE)
        tokenizer = RustTokenizer.from_file(str(path))
        # transformers sets truncation and padding per call, and vLLM asks for neither on a prompt it reads
        tokenizer.no_truncation()
        tokenizer.no_padding()
        special = {
            name: _token_text(config[name] if name in config else legacy.get(name))
            for name in SPECIAL_TOKEN_NAMES
        }
        special_tokens = {name: text for name, text in special.items() if text is not None}
        extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
        _add_missing_special_tokens(
            tokenizer, [*special_tokens.values(), *(t for t in map(_token_text, extra) if t is not None)]
        )
        # The config's add_bos_token/add_eos_token are dropped when tokenizer.json exists (its post-processor
        # decides), unless it has none: then they write one.
        if tokenizer.post_processor is None:
            _write_post_processor(tokenizer, config, special_tokens)
        tokenizer.encode_special_tokens = bool(config.get("split_special_tokens", False))
        side = config.get("truncation_side", "right")
        return cls(tokenizer, special_tokens, _chat_templates(directory, config), side)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a JSON object")
    return data


def _token_text(token: Any) -> str | None:
    """A special token as the config holds it: a string, or an AddedToken's dict ({"content": ...})."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else None


def _add_missing_special_tokens(tokenizer: RustTokenizer, tokens: list[str]) -> None:
    known = {t.content for t in tokenizer.get_added_tokens_decoder().values()}
    missing = [t for t in dict.fromkeys(tokens) if t not in known]
    if missing:
        tokenizer.add_special_tokens([AddedToken(t, special=True) for t in missing])


def _write_post_processor(
    tokenizer: RustTokenizer, config: dict[str, Any], special_tokens: dict[str, str]
) -> None:
    """TokenizersBackend.update_post_processor: BOS and/or EOS around the text, as the config asks."""
    ends: dict[str, tuple[str, int]] = {}
    for name, flag in (("bos_token", "add_bos_token"), ("eos_token", "add_eos_token")):
        text = special_tokens.get(name)
        token_id = tokenizer.token_to_id(text) if text is not None else None
        if config.get(flag, False) and text is not None and token_id is not None:
            ends[name] = (text, token_id)

    def around(sequence: str, type_id: int) -> list[str]:
        bos, eos = ends.get("bos_token"), ends.get("eos_token")
        return [
            *([f"{bos[0]}:{type_id}"] if bos else []),
            f"${sequence}:{type_id}",
            *([f"{eos[0]}:{type_id}"] if eos else []),
        ]

    tokenizer.post_processor = TemplateProcessing(
        single=" ".join(around("A", 0)),
        pair=" ".join(around("A", 0) + around("B", 1)),
        special_tokens=list(ends.values()),
    )


def _chat_templates(directory: Path, config: dict[str, Any]) -> str | dict[str, str] | None:
    """The template files take priority over the config's entry; one "default" alone is a plain string."""
    templates: dict[str, str] = {}
    single = directory / CHAT_TEMPLATE_FILE
    if single.is_file():
        templates["default"] = single.read_text(encoding="utf-8")
    named = directory / CHAT_TEMPLATE_DIR
    if named.is_dir():
        for path in sorted(named.glob("*.jinja")):
            templates[path.name.removesuffix(".jinja")] = path.read_text(encoding="utf-8")
    if not templates:
        entry = config.get("chat_template")
        if isinstance(entry, list):  # [{"name": ..., "template": ...}, ...]
            return {t["name"]: t["template"] for t in entry if isinstance(t, dict)}
        return entry if isinstance(entry, str) else None
    if list(templates) == ["default"]:
        return templates["default"]
    return templates
