"""The interface through which the proxy gets a prompt's token ids: the served model's tokens, which the
engines cache and publish in their KV events, so the router hashes and prices the same ids.

The proxy is handed a tokenizer and does not know which: the emulator's (emulator/api.py), or the served
model's own. Without one, text and chat prompts have no block hashes and their lengths are estimates.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from calroute.errors import CalrouteError


class TokenizeError(CalrouteError, ValueError):
    """A body whose prompt the tokenizer cannot read (the engine would refuse it too)."""


class Tokenizer(Protocol):
    """Token ids of an OpenAI request body's prompt, as the served engine would prefill them."""

    @property
    def name(self) -> str:
        """What it is, for logs and metrics (e.g. "emulator")."""
        ...

    def prompt_ids(self, body: Mapping[str, Any], chat: bool) -> list[int]:
        """The ids of ``body``'s prompt (``chat``: a /v1/chat/completions body, its messages rendered by the
        model's chat template); TokenizeError when there is no prompt it can read."""
        ...
