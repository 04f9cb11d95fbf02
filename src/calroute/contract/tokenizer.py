"""The interface through which the proxy gets a prompt's token ids: the served model's tokens, which the
engines cache and publish in their KV events, so the router hashes and prices the same ids.

The proxy is handed a tokenizer and does not know which: the emulator's (emulator/api.py), the served
model's own (tokenizer/hf.py), or, answering over the network, the engines' /tokenize
(proxy/engine_tokenizer.py). Without one, text and chat prompts have no block hashes and their lengths are
estimates.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from calroute.errors import CalrouteError


class TokenizeError(CalrouteError, ValueError):
    """A body whose prompt the tokenizer cannot read (the engine would refuse it too)."""


class TokenizerUnavailable(CalrouteError):
    """A tokenizer that could not answer this time (an engine's /tokenize unreachable, slow or broken): the
    prompt's length is estimated instead."""


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

    def counters(self) -> Mapping[str, float]:
        """What it counts, for the proxy's /metrics as ``calroute_tokenizer_NAME`` (a NAME ending in
        ``_total`` is a counter, any other a gauge); empty when it counts nothing."""
        ...


@runtime_checkable
class AsyncTokenizer(Protocol):
    """The same, answered over the network (an engine's /tokenize): awaited on the proxy's event loop."""

    @property
    def name(self) -> str: ...

    async def prompt_ids_async(self, body: Mapping[str, Any], chat: bool) -> list[int]:
        """As Tokenizer.prompt_ids; TokenizerUnavailable when it could not answer."""
        ...

    def counters(self) -> Mapping[str, float]:
        """As Tokenizer.counters."""
        ...

    def close(self) -> None:
        """Close its connections (the proxy's stop)."""
        ...
