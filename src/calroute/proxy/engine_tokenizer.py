"""The engines' own /tokenize as the proxy's tokenizer (the cluster file's ``tokenizer: engine``), for a
cluster without the model's tokenizer files at hand: exact by construction (the engine renders and
tokenizes as it will for the request), at the price of a round trip to an engine before every text or
chat request is routed (docs/proxy.md, "Tokens", has the measured cost against local files).

vLLM 0.32's /tokenize (entrypoints/serve/tokenize) takes a completions body's ``prompt`` and
``add_special_tokens``, or a chat body's ``messages`` with ``add_generation_prompt``,
``continue_final_message``, ``tools``, ``documents``, ``chat_template``, ``chat_template_kwargs`` and
``add_special_tokens``, and answers ``{"count", "max_model_len", "tokens"}``; a template that fails or
refuses the messages is its 400. Only those fields are sent. The engines are asked in turn; an answer is
read to a cap and within a timeout, and one that is not a list of token ids is no answer.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from calroute.contract.tokenizer import TokenizeError, TokenizerUnavailable
from calroute.proxy.config import ENGINE_KEEPALIVE_S
from calroute.proxy.engine_client import EngineClient, UpstreamError
from calroute.proxy.http import codec
from calroute.proxy.http.client import Endpoint

logger = logging.getLogger(__name__)

CHAT_FIELDS = (
    *("model", "messages", "add_generation_prompt", "continue_final_message", "tools", "documents"),
    *("chat_template", "chat_template_kwargs", "add_special_tokens"),
)
TEXT_FIELDS = ("model", "prompt", "add_special_tokens")
DEFAULT_TIMEOUT_S = 2.0
ATTEMPTS = 2  # engines asked before the prompt's length is estimated


class EngineTokenizer:
    """contract.tokenizer.AsyncTokenizer over the engines' /tokenize. ``clients``: engine id to its client
    (by default, from ``urls``: connections of its own, apart from the traffic's)."""

    def __init__(
        self,
        urls: Mapping[str, str],
        *,
        max_model_len: int,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        clients: Mapping[str, EngineClient] | None = None,
    ) -> None:
        if not urls and not clients:
            raise ValueError("an engine tokenizer needs at least one engine")
        self._clients: dict[str, EngineClient] = dict(
            clients if clients is not None else {i: Endpoint(u, ENGINE_KEEPALIVE_S) for i, u in urls.items()}
        )
        self._order = itertools.cycle(sorted(self._clients))
        self._headers = dict(headers or {})
        self._timeout_s = timeout_s
        # ids of at most 8 bytes each ("1234567,"), for prompts up to four times the model's length (past it
        # the proxy refuses the prompt, and /tokenize does not check the length), and the answer's frame
        self._max_bytes = 65536 + 8 * 4 * max_model_len
        self.unavailable = 0  # prompts it could not answer for (their lengths estimated)

    @property
    def name(self) -> str:
        return "engine (/tokenize)"

    def counters(self) -> Mapping[str, float]:
        return {"engine_unavailable_total": self.unavailable}

    async def prompt_ids_async(self, body: Mapping[str, Any], chat: bool) -> list[int]:
        payload = codec.dumps(self._request(body, chat))
        last = "no engine asked"
        for _ in range(min(ATTEMPTS, len(self._clients))):
            engine_id = next(self._order)
            try:
                status, answer = await self._ask(engine_id, payload)
            except (UpstreamError, TimeoutError) as e:
                last = f"{engine_id}: {type(e).__name__}: {e}"
                continue
            if status == 200:
                ids = _ids(answer)
                if ids is not None:
                    return ids
                last = f"{engine_id}: an answer without token ids"
            elif 400 <= status < 500:
                raise TokenizeError(_message(answer) or f"the engine refused the prompt (HTTP {status})")
            else:
                last = f"{engine_id}: HTTP {status}"
        self.unavailable += 1
        logger.warning("no engine tokenized a prompt (%s): its length is estimated", last)
        raise TokenizerUnavailable(last)

    @staticmethod
    def _request(body: Mapping[str, Any], chat: bool) -> dict[str, Any]:
        if not chat and not isinstance(body.get("prompt"), str):
            # token ids are their own count; a batch of prompts is the engine's to judge
            raise TokenizeError("only a text prompt is tokenized")
        return {k: body[k] for k in (CHAT_FIELDS if chat else TEXT_FIELDS) if k in body}

    async def _ask(self, engine_id: str, payload: bytes) -> tuple[int, bytes]:
        r = await self._clients[engine_id].request(
            "POST", "/tokenize", self._headers, payload, read_timeout_s=self._timeout_s
        )
        async with r:
            return r.status, await r.read(self._max_bytes)

    def close(self) -> None:
        for client in self._clients.values():
            client.close()


def _ids(answer: bytes) -> list[int] | None:
    try:
        out = codec.loads(answer)
    except ValueError:
        return None
    tokens = out.get("tokens") if isinstance(out, dict) else None
    if not isinstance(tokens, list) or not all(type(t) is int and t >= 0 for t in tokens):
        return None
    return tokens


def _message(answer: bytes) -> str | None:
    """vLLM's error message: ``{"error": {"message": ...}}`` (or an older top-level ``message``)."""
    try:
        out = codec.loads(answer)
    except ValueError:
        return None
    if not isinstance(out, dict):
        return None
    error = out.get("error")
    message = error.get("message") if isinstance(error, dict) else out.get("message")
    return message[:2000] if isinstance(message, str) else None


def engine_tokenizer(
    engines: Sequence[tuple[str, str]], max_model_len: int, headers: Mapping[str, str] | None = None
) -> EngineTokenizer:
    """The tokenizer a cluster file's ``tokenizer: engine`` names: its engines (id, URL), prefill first."""
    return EngineTokenizer(dict(engines), max_model_len=max_model_len, headers=headers)
