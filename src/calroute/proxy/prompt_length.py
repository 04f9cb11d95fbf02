"""Prompt length at admission, before any engine has seen the request.

A prompt of token ids is counted exactly. For text, the proxy estimates tokens from characters with a
ratio it keeps learning from the prompt_tokens the prefill engines report (starting at 4 characters per
token), so the estimate converges on the served model's tokenizer without loading it.
"""

from __future__ import annotations

import itertools
from typing import Any


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
