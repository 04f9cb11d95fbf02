"""A tiny model directory in Hugging Face's layout, built per test session: a byte-level BPE trained in a few
ms on a made-up corpus, its config with special tokens, and a chat template (no vLLM, no weights)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from calroute.tokenizer import HfTokenizer

# A template in the "string" content format (it never loops over a message's content) that uses what
# real ones do: bos_token, a refused role, tools and documents through tojson, a template kwarg.
TEMPLATE = """{{ bos_token }}
{%- if tools %}[tools]{{ tools | tojson }}
{% endif %}
{%- if documents %}[docs]{% for d in documents %}{{ d.title }}: {{ d.text }};{% endfor %}
{% endif %}
{%- for message in messages %}
{%- if message.role not in ['system', 'user', 'assistant', 'tool'] %}
{{- raise_exception('Unknown role: ' ~ message.role) }}
{%- endif %}
<|{{ message.role }}|>{{ message.content }}</s>
{% endfor %}
{%- if add_generation_prompt %}<|assistant|>{% if enable_thinking %}<think>{% endif %}{% endif %}"""

CORPUS = [
    "the cache block prefill decode router engine token prompt model latency",
    "system user assistant tool call hash index shard queue scheduler budget",
    "café naïve Straße 中文 русский 😀 🚀 <s> </s> <pad> \t\n  ",
    "<|system|> <|user|> <|assistant|> <|tool|> [tools] [docs] <think>",
]


def build_model(
    directory: Path,
    config: dict[str, Any] | None = None,
    template: str | None = TEMPLATE,
    post_processor: bool = True,
) -> Path:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    if post_processor:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 0)]
        )
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    base = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "tokenizer_class": "TokenizersBackend",
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(base | (config or {})))
    if template is not None:
        (directory / "chat_template.jinja").write_text(template)
    return directory


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("tiny-tokenizer"))


@pytest.fixture(scope="session")
def tok(model_dir: Path) -> HfTokenizer:
    return HfTokenizer(model_dir)


@pytest.fixture(scope="session")
def rust(model_dir: Path) -> Tokenizer:
    """The same tokenizer.json read directly: the expected ids of a text."""
    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))


MakeModel = Callable[..., HfTokenizer]


@pytest.fixture
def make_tok(tmp_path: Path) -> MakeModel:
    """A tokenizer over a fresh directory: build_model's arguments, then HfTokenizer's keywords."""

    def make(config: dict[str, Any] | None = None, template: str | None = TEMPLATE, **kw: Any) -> HfTokenizer:
        post = kw.pop("post_processor", True)
        return HfTokenizer(build_model(tmp_path / "model", config, template, post), **kw)

    return make
