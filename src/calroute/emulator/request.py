"""One request inside the emulated engine: what it asked for and how far it has got (vLLM's Request)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from calroute.emulator import tokens
from calroute.errors import CalrouteError


class Phase(Enum):
    WAITING = "waiting"
    PULLING = "pulling"  # KV reserved here, being pulled from the prefill engine
    RUNNING = "running"
    FINISHED = "finished"


class PullFailed(CalrouteError):
    """The prefill engine could not hand over the KV (unreachable, refused)."""


# (remote params, prompt tokens) -> True when the blocks were there, False when unknown/expired
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
    blocks: int = 0
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

    def __post_init__(self) -> None:
        self._seed = tokens.prompt_seed(self.prompt_ids)

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def finished(self) -> bool:
        return self.phase is Phase.FINISHED

    @property
    def context_tokens(self) -> int:
        return self.prompt_tokens + len(self.output_ids)
