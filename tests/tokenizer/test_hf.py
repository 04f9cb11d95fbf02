"""HfTokenizer on a tiny trained tokenizer (conftest.py): text as vLLM's completions tokenize it, chat as
vLLM renders it (the rendered text pinned here, its ids the tokenizer's own), and the errors vLLM answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from calroute.contract.tokenizer import TokenizeError
from calroute.contract.tokenizer import Tokenizer as TokenizerProtocol
from calroute.tokenizer import HfTokenizer
from tests.tokenizer.conftest import TEMPLATE, MakeModel

BOS = 0


def test_it_is_a_contract_tokenizer(tok: HfTokenizer) -> None:
    t: TokenizerProtocol = tok
    assert t.name.startswith("hf:")


# ---- completions ----------------------------------------------------------------------------------------

TEXTS = {
    "plain": "the cache block prefill",
    "unicode": "café naïve Straße 中文 русский",
    "emoji": "😀 🚀 👩‍👩‍👧 🇫🇷 👍🏽",
    "whitespace at both ends": "  \t the router \n\n",
    "only whitespace": " \n\t ",
    "empty": "",
    "crlf and tabs": "a\r\nb\tc  d",
    "long": "the cache block prefill decode 😀 Straße " * 1200,
}


@pytest.mark.parametrize("text", TEXTS.values(), ids=TEXTS.keys())
@pytest.mark.parametrize("add_special", [None, True, False], ids=["default", "true", "false"])
def test_a_text_prompt_is_its_ids_with_bos_unless_asked_not_to(
    tok: HfTokenizer, rust: Tokenizer, text: str, add_special: bool | None
) -> None:
    body: dict[str, Any] = {"prompt": text}
    if add_special is not None:
        body["add_special_tokens"] = add_special
    ids = tok.prompt_ids(body, chat=False)
    plain = rust.encode(text, add_special_tokens=False).ids
    assert ids == (plain if add_special is False else [BOS, *plain])
    assert rust.decode(ids, skip_special_tokens=False).removeprefix("<s>") == text  # nothing lost or added


SPELLED = {
    "bos": ("<s>", [BOS]),
    "eos and pad": ("</s><pad>", [1, 2]),
    "in a sentence": ("a <s> b", None),
    "broken": ("<s", None),
}


@pytest.mark.parametrize(("text", "special_ids"), SPELLED.values(), ids=SPELLED.keys())
def test_text_spelling_a_special_token_is_that_token(
    tok: HfTokenizer, text: str, special_ids: list[int] | None
) -> None:
    # vLLM (split_special_tokens off) reads "<s>" in a prompt as the BOS token itself
    ids = tok.prompt_ids({"prompt": text, "add_special_tokens": False}, chat=False)
    if special_ids is not None:
        assert ids == special_ids
    assert (BOS in ids) == ("<s>" in text)


def test_split_special_tokens_spells_them_out(make_tok: MakeModel) -> None:
    tok = make_tok({"split_special_tokens": True})
    assert BOS not in tok.prompt_ids({"prompt": "a <s> b", "add_special_tokens": False}, chat=False)


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [([5, 6, 7], [5, 6, 7]), ([[5, 6]], [5, 6]), (["<s>"], [BOS, BOS])],
    ids=["ids", "one list of ids", "one string"],
)
def test_a_prompt_of_token_ids_is_taken_as_is(tok: HfTokenizer, prompt: Any, expected: list[int]) -> None:
    assert tok.prompt_ids({"prompt": prompt}, chat=False) == expected


TRUNCATIONS = {
    "keep 3": ({"truncate_prompt_tokens": 3}, lambda p: [BOS, *p[:2]]),
    "keep all": ({"truncate_prompt_tokens": 1000}, lambda p: [BOS, *p]),
    "keep 0": ({"truncate_prompt_tokens": 0}, lambda p: []),
    "left side": ({"truncate_prompt_tokens": 3, "truncation_side": "left"}, lambda p: p[-3:]),
    "right side": ({"truncate_prompt_tokens": 3, "truncation_side": "right"}, lambda p: [BOS, *p[:2]]),
}


@pytest.mark.parametrize(("fields", "expected"), TRUNCATIONS.values(), ids=TRUNCATIONS.keys())
def test_truncate_prompt_tokens_cuts_as_vllm_does(
    tok: HfTokenizer, rust: Tokenizer, fields: dict[str, Any], expected: Any
) -> None:
    text = "the cache block prefill decode router"
    plain = rust.encode(text, add_special_tokens=False).ids
    assert tok.prompt_ids({"prompt": text, **fields}, chat=False) == expected(plain)


def test_a_left_truncating_tokenizer_keeps_its_bos(make_tok: MakeModel, rust: Tokenizer) -> None:
    tok = make_tok({"truncation_side": "left"})
    text = "the cache block prefill decode router"
    plain = rust.encode(text, add_special_tokens=False).ids
    assert tok.prompt_ids({"prompt": text, "truncate_prompt_tokens": 3}, chat=False) == [BOS, *plain[-2:]]


def test_add_bos_token_writes_a_post_processor_when_tokenizer_json_has_none(make_tok: MakeModel) -> None:
    assert make_tok(post_processor=False).prompt_ids({"prompt": "a"}, chat=False)[0] != BOS
    with_bos = make_tok({"add_bos_token": True, "add_eos_token": True}, post_processor=False)
    ids = with_bos.prompt_ids({"prompt": "a"}, chat=False)
    assert ids[0] == BOS and ids[-1] == 1


# ---- chat -----------------------------------------------------------------------------------------------


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


CHATS: dict[str, tuple[dict[str, Any], str]] = {
    "system, user, assistant, user": (
        {
            "messages": [
                {"role": "system", "content": "be brief"},
                user("hi"),
                {"role": "assistant", "content": "hello"},
                user("again"),
            ]
        },
        "<s><|system|>be brief</s>\n<|user|>hi</s>\n<|assistant|>hello</s>\n<|user|>again</s>\n<|assistant|>",
    ),
    "no generation prompt": (
        {"messages": [user("hi")], "add_generation_prompt": False},
        "<s><|user|>hi</s>\n",
    ),
    "parts joined by a newline, empty ones dropped": (
        {
            "messages": [
                user(
                    [
                        {"type": "text", "text": "a"},
                        {"type": "text", "text": ""},
                        {"type": "text", "text": "b"},
                    ]
                )
            ]
        },
        "<s><|user|>a\nb</s>\n<|assistant|>",
    ),
    "unicode, emoji and whitespace kept": (
        {"messages": [user("  café 😀 👩‍👩‍👧\t\n")]},
        "<s><|user|>  café 😀 👩‍👩‍👧\t\n</s>\n<|assistant|>",
    ),
    "special tokens spelled in content": (
        {"messages": [user("<s> and </s>")]},
        "<s><|user|><s> and </s></s>\n<|assistant|>",
    ),
    "continue the final message": (
        {
            "messages": [user("hi"), {"role": "assistant", "content": "the answer is "}],
            "add_generation_prompt": False,
            "continue_final_message": True,
        },
        "<s><|user|>hi</s>\n<|assistant|>the answer is ",
    ),
    "continue a final message of parts": (
        {
            "messages": [user("hi"), {"role": "assistant", "content": [{"type": "text", "text": "x"}]}],
            "add_generation_prompt": False,
            "continue_final_message": True,
        },
        "<s><|user|>hi</s>\n<|assistant|>x",
    ),
    "developer becomes system, merged first": (
        {"messages": [{"role": "system", "content": "s"}, user("u"), {"role": "developer", "content": "d"}]},
        "<s><|system|>s\n\nd</s>\n<|user|>u</s>\n<|assistant|>",
    ),
    "tool results joined, tool-call arguments parsed": (
        {
            "messages": [
                user("u"),
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{"}}
                    ],
                },
                {
                    "role": "tool",
                    "tool_call_id": "c",
                    "content": [{"type": "text", "text": "r1"}, {"type": "text", "text": "r2"}],
                },
            ],
            "add_generation_prompt": False,
        },
        "<s><|user|>u</s>\n<|assistant|></s>\n<|tool|>r1\nr2</s>\n",
    ),
    "tools as vLLM dumps them": (
        {"messages": [user("u")], "tools": [{"type": "function", "function": {"name": "f", "extra": 1}}]},
        '<s>[tools][{"type": "function", "function": {"name": "f", "description": null, '
        '"parameters": null}}]\n'
        "<|user|>u</s>\n<|assistant|>",
    ),
    "documents": (
        {"messages": [user("u")], "documents": [{"title": "t", "text": "x"}]},
        "<s>[docs]t: x;<|user|>u</s>\n<|assistant|>",
    ),
    "reasoning effort turns thinking on": (
        {"messages": [user("u")], "reasoning_effort": "low"},
        "<s><|user|>u</s>\n<|assistant|><think>",
    ),
    "a template kwarg, and one it does not read": (
        {"messages": [user("u")], "chat_template_kwargs": {"enable_thinking": True, "unused": 1}},
        "<s><|user|>u</s>\n<|assistant|><think>",
    ),
    # vLLM: a kwarg the request names keeps reasoning_effort's default out, then a None value is dropped
    "a None kwarg is no kwarg": (
        {
            "messages": [user("u")],
            "reasoning_effort": "high",
            "chat_template_kwargs": {"enable_thinking": None},
        },
        "<s><|user|>u</s>\n<|assistant|>",
    ),
}


@pytest.mark.parametrize(("body", "rendered"), CHATS.values(), ids=CHATS.keys())
def test_chat_renders_as_vllm_and_tokenizes_without_adding_bos(
    tok: HfTokenizer, rust: Tokenizer, body: dict[str, Any], rendered: str
) -> None:
    assert tok.render_chat(body) == rendered
    assert tok.prompt_ids(body, chat=True) == rust.encode(rendered, add_special_tokens=False).ids
    with_bos = tok.prompt_ids({**body, "add_special_tokens": True}, chat=True)
    assert with_bos == rust.encode(rendered, add_special_tokens=True).ids


def test_the_body_is_left_as_it_was(tok: HfTokenizer) -> None:
    body, _ = CHATS["tool results joined, tool-call arguments parsed"]
    before = json.dumps(body)
    tok.prompt_ids(body, chat=True)
    tok.prompt_ids({**body, "continue_final_message": True, "add_generation_prompt": False}, chat=True)
    assert json.dumps(body) == before


def test_a_long_chat_prompt(tok: HfTokenizer, rust: Tokenizer) -> None:
    system = "the cache block prefill decode router 😀 " * 1000
    body = {"messages": [{"role": "system", "content": system}, user("go")]}
    ids = tok.prompt_ids(body, chat=True)
    assert len(ids) > 5000
    rendered = f"<s><|system|>{system}</s>\n<|user|>go</s>\n<|assistant|>"
    assert ids == rust.encode(rendered, add_special_tokens=False).ids


OPENAI_TEMPLATE = (
    "{% for m in messages %}{{ m.role }}:{% for p in m.content %}[{{ p.type }}:{{ p.text }}]{% endfor %}\n"
    "{% endfor %}"
)


def test_a_template_that_loops_over_content_gets_parts(make_tok: MakeModel) -> None:
    tok = make_tok(template=OPENAI_TEMPLATE)
    body = {
        "messages": [user("a"), user([{"type": "text", "text": "b"}, {"type": "refusal", "refusal": "c"}])]
    }
    assert tok.render_chat(body) == "user:[text:a]user:[text:b][text:c]"  # trim_blocks ate the newlines
    # the engine's --chat-template-content-format overrides the detection
    forced = make_tok(template="{% for m in messages %}{{ m.content }}{% endfor %}", content_format="openai")
    assert forced.render_chat({"messages": [user("a")]}) == "[{'type': 'text', 'text': 'a'}]"


FORMATS = {
    "plain": ("{% for m in messages %}{{ m.content }}{% endfor %}", "string"),
    "loop over content": (
        "{% for m in messages %}{% for c in m['content'] %}{% endfor %}{% endfor %}",
        "openai",
    ),
    "through an alias": (
        "{% set ms = messages[1:] %}{% for m in ms %}{% for c in m.content | list %}{% endfor %}{% endfor %}",
        "openai",
    ),
    "through a macro": (
        "{% macro r(x) %}{% for c in x %}{% endfor %}{% endmacro %}{% for m in messages %}{{ r(m.content) }}"
        "{% endfor %}",
        "openai",
    ),
    "a loop named content": ("{% set content = 1 %}{% for c in content %}{% endfor %}", "openai"),
    "a tuple target": ("{% for a, b in messages %}{% endfor %}", "string"),
}


@pytest.mark.parametrize(("template", "expected"), FORMATS.values(), ids=FORMATS.keys())
def test_content_format_detection(make_tok: MakeModel, template: str, expected: str) -> None:
    assert make_tok(template=template)._renderer.content_format(template) == expected


def test_named_templates_tool_use_when_tools_are_given(make_tok: MakeModel, tmp_path: Any) -> None:
    tok = make_tok(template="default")
    named = tmp_path / "model" / "additional_chat_templates"
    named.mkdir()
    (named / "tool_use.jinja").write_text("tools")
    tok = HfTokenizer(tmp_path / "model")
    assert tok.render_chat({"messages": [user("u")]}) == "default"
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert tok.render_chat({"messages": [user("u")], "tools": tools}) == "tools"


def test_a_trusted_request_template_is_used(make_tok: MakeModel) -> None:
    tok = make_tok(trust_request_chat_template=True)
    assert tok.render_chat({"messages": [user("u")], "chat_template": "X{{ messages[0].content }}"}) == "Xu"


def test_the_model_template_from_the_config(make_tok: MakeModel) -> None:
    tok = make_tok({"chat_template": "C{{ messages | length }}"}, template=None)
    assert tok.render_chat({"messages": [user("u")]}) == "C1"


# ---- errors ---------------------------------------------------------------------------------------------

ERRORS: dict[str, tuple[dict[str, Any], str]] = {
    "role refused by the template": (
        {"messages": [{"role": "critic", "content": "x"}]},
        "Unknown role: critic",
    ),
    "both flags": (
        {"messages": [user("u")], "continue_final_message": True, "add_generation_prompt": True},
        "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
    ),
    "no messages": ({"messages": []}, "Cannot apply chat template to an empty conversation"),
    "messages not a list": ({"messages": "hi"}, "messages must be a list"),
    "a message without role": ({"messages": [{"content": "x"}]}, "string role"),
    "content neither string nor list": ({"messages": [user(3)]}, "must be a string or a list"),
    "unknown part type": (
        {"messages": [user([{"type": "nope"}])]},
        "Unsupported chat content part type: 'nope'",
    ),
    "part without type": ({"messages": [user([{"text": "x"}])]}, "Missing 'type' field"),
    "an image": ({"messages": [user([{"type": "image_url", "image_url": {"url": "u"}}])]}, "multimodal"),
    "untrusted template": ({"messages": [user("u")], "chat_template": "x"}, "--trust-request-chat-template"),
    "untrusted template in kwargs": (
        {"messages": [user("u")], "chat_template_kwargs": {"chat_template": "x"}},
        "--trust-request-chat-template",
    ),
    "a tool without a name": ({"messages": [user("u")], "tools": [{"function": {}}]}, "tools[0]"),
    "documents not dicts": (
        {"messages": [user("u")], "documents": ["x"]},
        "Documents should be a list of dicts",
    ),
    "a bad tool call": (
        {"messages": [{"role": "assistant", "content": "", "tool_calls": [{"type": "x", "function": {}}]}]},
        "of type 'function'",
    ),
}


@pytest.mark.parametrize(("body", "message"), ERRORS.values(), ids=ERRORS.keys())
def test_chat_errors_carry_vllms_message(tok: HfTokenizer, body: dict[str, Any], message: str) -> None:
    with pytest.raises(TokenizeError, match=None) as caught:
        tok.prompt_ids(body, chat=True)
    assert message in str(caught.value)


PROMPT_ERRORS = {
    "no prompt": ({}, "prompt is required"),
    "a batch": ({"prompt": ["a", "b"]}, "one-element list"),
    "out of vocabulary": ({"prompt": [1, 100000]}, "Token id 100000 is out of vocabulary"),
    "negative": ({"prompt": [-1]}, "Token id -1 is out of vocabulary"),
    "bad truncation": ({"prompt": "a", "truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
}


@pytest.mark.parametrize(("body", "message"), PROMPT_ERRORS.values(), ids=PROMPT_ERRORS.keys())
def test_completion_errors(tok: HfTokenizer, body: dict[str, Any], message: str) -> None:
    with pytest.raises(TokenizeError) as caught:
        tok.prompt_ids(body, chat=False)
    assert message in str(caught.value)


BAD_TEMPLATES = {
    "raise_exception": ("{{ raise_exception('nope') }}", "nope"),
    "an undefined variable called": ("{{ missing.upper() }}", "'missing' is undefined"),
    "a syntax error": ("{% for %}", "Expected"),
    "continue_final_message not in the template": ("{{ messages | length }}", "not an accepted field"),
    "output past the cap": ("{% for i in range(2000) %}{{ 'x' * 500 }}{% endfor %}", "output"),
    "a string multiplied past the cap": ("{{ 'x' * 10 ** 8 }}", "past the output limit"),
    "a call with a huge size": ("{{ 'x'.center(100000000) }}", "size past the output limit"),
    "too slow": (
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "too long",
    ),
    "a power too large": ("{{ 2 ** 100000000 }}", "too large a power"),
    "a sandbox breach": ("{{ ''.__class__.__mro__ }}", "unsafe"),
}


@pytest.mark.parametrize(("template", "message"), BAD_TEMPLATES.values(), ids=BAD_TEMPLATES.keys())
def test_a_template_that_fails_or_runs_away_is_a_tokenize_error(
    make_tok: MakeModel, template: str, message: str
) -> None:
    tok = make_tok(template=template, max_output_chars=100_000, max_render_s=0.2)
    body = {"messages": [user("u")], "add_generation_prompt": False, "continue_final_message": True}
    if "content" in template or "not an accepted field" not in message:
        body = {"messages": [user("u")]}
    with pytest.raises(TokenizeError) as caught:
        tok.prompt_ids(body, chat=True)
    assert message in str(caught.value)


def test_no_template_is_vllms_error(make_tok: MakeModel) -> None:
    with pytest.raises(TokenizeError, match="default chat template is no longer allowed"):
        make_tok(template=None).prompt_ids({"messages": [user("u")]}, chat=True)


def test_the_fixture_template_is_in_the_string_format(tok: HfTokenizer) -> None:
    assert tok._renderer.content_format(TEMPLATE) == "string"


def test_its_counters_are_its_prefix_stores(model_dir: Path) -> None:
    tok = HfTokenizer(model_dir)
    system = "You answer in one line. " * 200
    for user in ("first question", "second question"):
        tok.prompt_ids(
            {"messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}, True
        )
    c = tok.counters()
    assert c["prefix_store_enabled"] == 1.0 and c["prefix_store_entries"] >= 1
    assert c["prefix_store_hits_total"] >= 1 and c["prefix_store_mismatches_total"] == 0
    assert HfTokenizer(model_dir, prefix_store_chars=0).counters() == {"prefix_store_enabled": 0.0}
