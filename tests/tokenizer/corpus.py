"""Request bodies for the tokenizer's parity with vLLM, generated from a seed (the same ones every run).

Each is a body both vLLM's /tokenize and HfTokenizer read the same way: a completions body ({"prompt": ...},
``add_special_tokens`` either way) or a chat body (``messages`` with ``add_generation_prompt`` either way or
``continue_final_message``). The text mixes plain words, unicode and emoji (multi-byte, joined and flag
sequences), whitespace at both ends and inside (tabs, CRLF, runs of spaces) and spellings of the special
tokens, whole and broken.
"""

from __future__ import annotations

import random
from typing import Any

WORDS = (
    "the cache block prefill decode router engine token prompt model latency queue scheduler budget "
    "request answer system user assistant tool call hash index shard"
).split()
UNICODE = [
    "café",
    "naïve",
    "Straße",
    "中文字符",
    "русский",
    "日本語",
    "ελληνικά",
    "עברית",
    "한국어",
    "µs",
    "½",
]
EMOJI = ["😀", "🚀", "👩‍👩‍👧", "🇫🇷", "👍🏽", "❤️", "🤖", "✨"]
SPECIAL = ["<s>", "</s>", "<pad>", "<s", "s>", "</s >", "<<s>>", "<s><s>", "<pad></s>"]
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\n\n", " \n ", "   "]


def text(rng: random.Random, words: int) -> str:
    pieces = []
    for _ in range(words):
        roll = rng.random()
        if roll < 0.6:
            pieces.append(rng.choice(WORDS))
        elif roll < 0.75:
            pieces.append(rng.choice(UNICODE))
        elif roll < 0.87:
            pieces.append(rng.choice(EMOJI))
        else:
            pieces.append(rng.choice(SPECIAL))
        pieces.append(rng.choice(SPACES) if rng.random() < 0.15 else " ")
    body = "".join(pieces).strip(" ")
    lead = rng.choice(["", "", " ", "\n", "  \t"])
    trail = rng.choice(["", "", " ", "\n", "\t ", "  "])
    return lead + body + trail


def _content(rng: random.Random, words: int, parts: bool) -> Any:
    if not parts:
        return text(rng, words)
    n = rng.randint(2, 4)
    out: list[Any] = [{"type": "text", "text": text(rng, max(1, words // n))} for _ in range(n)]
    if rng.random() < 0.3:
        out.insert(rng.randrange(len(out)), {"type": "text", "text": ""})
    return out


def chat(
    rng: random.Random, turns: int, words: int, parts: float = 0.0, roles: str = "sua"
) -> dict[str, Any]:
    """``roles``: which turns appear (s system, d developer, u user, a assistant, t tool)."""
    messages: list[dict[str, Any]] = []
    if "s" in roles:
        messages.append({"role": "system", "content": _content(rng, words, rng.random() < parts)})
    if "d" in roles:
        messages.append({"role": "developer", "content": _content(rng, words, rng.random() < parts)})
    for i in range(turns):
        messages.append({"role": "user", "content": _content(rng, words, rng.random() < parts)})
        if "a" in roles and i < turns - 1:
            messages.append({"role": "assistant", "content": _content(rng, words, rng.random() < parts)})
        if "t" in roles and i < turns - 1:
            call = {"id": f"call_{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            messages.append(
                {"role": "tool", "tool_call_id": f"call_{i}", "content": _content(rng, words, True)}
            )
    return {"messages": messages}


def corpus(seed: int = 35, long_words: int = 2600) -> list[tuple[str, dict[str, Any]]]:
    """(case id, body) pairs: 221 of them, a few with ~8k-token prompts (``long_words`` words)."""
    rng = random.Random(seed)
    cases: list[tuple[str, dict[str, Any]]] = []
    for i in range(50):
        body: dict[str, Any] = {"prompt": text(rng, rng.randint(1, 120))}
        if i % 3 == 1:
            body["add_special_tokens"] = False
        elif i % 3 == 2:
            body["add_special_tokens"] = True
        cases.append((f"text-{i}", body))
    for i in range(10):
        cases.append((f"text-edge-{i}", {"prompt": rng.choice(SPECIAL + SPACES + EMOJI + [""])}))
    for i in range(60):
        body = chat(rng, rng.randint(1, 4), rng.randint(1, 60))
        body["add_generation_prompt"] = i % 2 == 0
        cases.append((f"chat-{i}", body))
    for i in range(30):
        body = chat(rng, rng.randint(1, 3), rng.randint(4, 40), parts=0.8)
        body["add_generation_prompt"] = i % 3 != 0
        cases.append((f"parts-{i}", body))
    for i in range(25):
        body = chat(rng, rng.randint(1, 3), rng.randint(1, 40), parts=0.3)
        body["messages"].append(
            {"role": "assistant", "content": _content(rng, rng.randint(1, 20), i % 4 == 0)}
        )
        body["add_generation_prompt"] = False
        body["continue_final_message"] = True
        cases.append((f"continue-{i}", body))
    for i in range(15):
        body = chat(rng, rng.randint(1, 3), rng.randint(1, 30), parts=0.3, roles="sdua" if i % 2 else "dua")
        cases.append((f"developer-{i}", body))
    for i in range(15):
        body = chat(rng, rng.randint(2, 3), rng.randint(1, 30), parts=0.2, roles="suat")
        cases.append((f"tools-{i}", body))
    for i in range(10):
        body = chat(rng, 1, rng.randint(1, 30))
        body["add_special_tokens"] = True
        cases.append((f"chat-bos-{i}", body))
    for i in range(3):
        cases.append((f"long-text-{i}", {"prompt": text(rng, long_words)}))
    for i in range(3):
        system = text(rng, long_words * 7 // 8)
        body = {
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": text(rng, 300)}]
        }
        cases.append((f"long-chat-{i}", body))
    return cases
