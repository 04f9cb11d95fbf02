"""Prompt length at admission, before any engine has seen the request.

A prompt of token ids is counted exactly, and so is text or chat when the proxy has the served model's
tokenizer (``exact_prompt``; docs/proxy.md, "Tokens"). Without one, the proxy estimates tokens from
characters with a ratio it keeps learning from the prompt_tokens the prefill engines report (starting at 4
characters per token): a length that converges on the model's, but no token ids to match against the
engines' caches.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping
from concurrent.futures import Executor
from typing import Any, NamedTuple

from calroute.contract.tokenizer import AsyncTokenizer, TokenizeError, Tokenizer, TokenizerUnavailable

# A text prompt up to this many characters (about 1,000 tokens, well under a millisecond to tokenize) is
# tokenized on the event loop: a hop to the tokenizer's thread and back costs more.
INLINE_TOKENIZE_CHARS = 4096


class PromptLength:
    def __init__(self, chars_per_token: float = 4.0, decay: float = 0.98) -> None:
        self.chars_per_token = chars_per_token
        self._decay = decay

    @staticmethod
    def _text(body: dict[str, Any]) -> str | list[int] | None:
        """The prompt's text, or its token ids; None when there is neither. Only strings count as text: a
        body the proxy did not validate (flight.validate) is read as far as it makes sense, never raises."""
        if "messages" in body:
            messages = body.get("messages")
            if not isinstance(messages, list):
                return None
            parts = []
            for m in messages:
                if not isinstance(m, dict):
                    parts.append("")
                    continue
                content = m.get("content")
                if isinstance(content, list):
                    content = "".join(
                        text
                        for p in content
                        if isinstance(p, dict) and isinstance(text := p.get("text"), str)
                    )
                parts.append(str(m.get("role", "")) + ": " + (content if isinstance(content, str) else ""))
            return "\n".join(parts)
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return prompt
        if not isinstance(prompt, list):
            return None
        if all(type(t) is int for t in prompt):  # token ids (not bools)
            return prompt
        if all(isinstance(p, str) for p in prompt):  # a batch of texts
            return "".join(prompt)
        if all(isinstance(p, list) and all(type(t) is int for t in p) for p in prompt):  # of token ids
            return list(itertools.chain.from_iterable(prompt))
        return None

    def estimate(self, body: dict[str, Any]) -> tuple[int, int | None]:
        """(estimated tokens, characters): characters is None when the count is exact (token ids)."""
        text = self._text(body)
        if isinstance(text, list):
            return max(1, len(text)), None
        chars = len(text or "")
        return max(1, round(chars / self.chars_per_token)), chars

    def learn(self, chars: int | None, prompt_tokens: int) -> None:
        if chars is None or prompt_tokens <= 0 or chars <= 0:
            return
        self.chars_per_token = self.chars_per_token * self._decay + (chars / prompt_tokens) * (
            1 - self._decay
        )


class Refused(NamedTuple):
    """A prompt the engine would refuse, with vLLM's message and the field at fault."""

    message: str
    param: str | None = None


async def exact_prompt(
    tokenizer: Tokenizer | AsyncTokenizer,
    pool: Executor | None,
    body: Mapping[str, Any],
    chat: bool,
    prompt_chars: int | None,
    max_model_len: int,
) -> list[int] | Refused | None:
    """The prompt's token ids as the engine will prefill them; Refused when the engine would answer 400 (a
    chat template that fails or refuses the messages, a prompt past the model's length); None for a
    completions prompt the tokenizer does not read (a batch of prompts: the engine judges it), or when an
    AsyncTokenizer could not answer. A prompt of more than INLINE_TOKENIZE_CHARS characters is tokenized
    on ``pool``, off the event loop; an AsyncTokenizer is awaited."""
    try:
        if isinstance(tokenizer, AsyncTokenizer):
            ids = await tokenizer.prompt_ids_async(body, chat)
        elif pool is None or (prompt_chars or 0) <= INLINE_TOKENIZE_CHARS:
            ids = tokenizer.prompt_ids(body, chat)
        else:
            ids = await asyncio.get_running_loop().run_in_executor(pool, tokenizer.prompt_ids, body, chat)
    except TokenizerUnavailable:
        return None
    except TokenizeError as e:
        return Refused(str(e)) if chat else None
    if len(ids) > max_model_len:
        # vLLM's words (renderers/params.py, _token_len_check), before any engine spends a prefill on it
        return Refused(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt contains "
            f"{len(ids)} input tokens, which exceeds this limit even without any output tokens. Please "
            "reduce the length of the input prompt.",
            "input_tokens",
        )
    return ids
