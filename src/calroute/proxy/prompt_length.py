"""Prompt length at admission, before any engine has seen the request.

A prompt of token ids is counted exactly. For text, the proxy estimates tokens from characters with a
ratio it keeps learning from the prompt_tokens the prefill engines report (starting at 4 characters per
token), so the estimate converges on the served model's tokenizer without loading it.
"""

from __future__ import annotations

from typing import Any


class PromptLength:
    def __init__(self, chars_per_token: float = 4.0, decay: float = 0.98) -> None:
        self.chars_per_token = chars_per_token
        self._decay = decay

    @staticmethod
    def _text(body: dict[str, Any]) -> str | list[int] | None:
        if "messages" in body:
            messages = body.get("messages")
            if not isinstance(messages, list):
                return None
            parts = []
            for m in messages:
                content = m.get("content") if isinstance(m, dict) else None
                if isinstance(content, list):
                    content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
                parts.append(
                    str(m.get("role", "")) + ": " + str(content or "") if isinstance(m, dict) else ""
                )
            return "\n".join(parts)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return prompt
        return prompt if isinstance(prompt, str) else None

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
