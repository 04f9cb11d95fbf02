"""One request inside the emulated engine: what it asked for and how far it has got (vLLM's Request)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from calroute.contract.blocks import BLOCK_TOKENS
from calroute.emulator import tokens
from calroute.errors import CalrouteError
from calroute.kvcache.pool import RequestBlocks
from calroute.routing.block_hash import block_hashes


class Phase(Enum):
    WAITING = "waiting"
    PULLING = "pulling"  # KV reserved here, being pulled from the prefill engine
    RUNNING = "running"
    FINISHED = "finished"


class PullFailed(CalrouteError):
    """The prefill engine could not hand over the KV (unreachable, refused)."""


# (remote params, tokens to pull) -> True when the blocks were there, False when unknown/expired
KvPuller = Callable[[dict[str, Any], int], Awaitable[bool]]
# (remote params) -> None: tell the prefill engine to free the blocks without reading them
KvReleaser = Callable[[dict[str, Any]], Coroutine[Any, Any, None]]


@dataclass(eq=False)
class EngineRequest:
    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    kv_pull: dict[str, Any] | None = None  # kv_transfer_params with do_remote_prefill
    hold_kv: bool = False  # do_remote_decode: keep the blocks for a decode engine
    arrival_s: float = field(default_factory=time.monotonic)
    # progress
    phase: Phase = Phase.WAITING
    computed_tokens: int = 0  # prompt (and, after a preemption, output) tokens with KV in place
    kv: RequestBlocks = field(default_factory=RequestBlocks)  # what it holds in the engine's pool
    pull_tokens: int = 0  # a decode request's: the prompt tokens past its local cache hit, to pull
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None  # set when the request failed inside the engine (HTTP 500)
    kv_transfer_params: dict[str, Any] | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    cached_tokens: int = 0
    notify_every: int = 1  # wake the reader every this many tokens (the stream interval)
    updated: asyncio.Event = field(default_factory=asyncio.Event)
    _seed: int = 0
    _hashes: list[int] = field(default_factory=list)  # its full blocks' chained hashes, as far as asked

    def __post_init__(self) -> None:
        self._seed = tokens.prompt_seed(self.prompt_ids)

    def block_hashes(self, full_blocks: int) -> list[int]:
        """The chained hashes of its first ``full_blocks`` blocks of prompt and output (as vLLM's Request
        keeps its block hashes, extended as tokens are appended)."""
        known = self._hashes
        if len(known) < full_blocks:
            start = len(known) * BLOCK_TOKENS
            end = full_blocks * BLOCK_TOKENS
            known += block_hashes(self.token_ids(start, end), BLOCK_TOKENS, known[-1] if known else None)
        return known if len(known) == full_blocks else known[:full_blocks]

    def token_ids(self, start: int = 0, end: int | None = None) -> list[int]:
        """Its prompt and output token ids from ``start`` to ``end``."""
        n = len(self.prompt_ids)
        end = self.context_tokens if end is None else end
        if end <= n:
            return self.prompt_ids[start:end]
        return self.prompt_ids[start:] + self.output_ids[max(0, start - n) : end - n]

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def finished(self) -> bool:
        return self.phase is Phase.FINISHED

    @property
    def context_tokens(self) -> int:
        return self.prompt_tokens + len(self.output_ids)
