"""The simulator's mutable per-request state (the workload's RequestSpec plus what happened to it)."""

from __future__ import annotations

from calroute.kvcache.pool import RequestBlocks
from calroute.types import SloClass


class SimRequest:
    """A plain class with its own ``__init__``, not a dataclass: the compiled build (setup.py) compiles a
    written ``__init__`` to C, while a dataclass's generated one stays interpreted, once per request."""

    __slots__ = (
        "request_id",
        "arrival_s",
        "prompt_tokens",
        "output_tokens",
        "slo_class",
        "prefix_blocks",
        "predicted_output_tokens",
        "prefill_id",
        "decode_id",
        "cached_prefill_tokens",
        "cached_decode_tokens",
        "predicted_cached_tokens",
        "prefill_left_tokens",
        "prefill_kv_held",
        "prefill_kv",
        "decode_kv",
        "join_step",
        "join_order",
        "emitted_tokens",
        "recompute_tokens",
        "running",
        "prefill_done_s",
        "first_token_s",
        "last_token_s",
        "local",
        "path_reason",
        "answer_blocks",
    )

    def __init__(
        self,
        request_id: str,
        arrival_s: float,
        prompt_tokens: int,
        output_tokens: int,
        slo_class: SloClass,
        predicted_output_tokens: int,
        prefill_id: str,
        decode_id: str,
        prefix_blocks: tuple[int, ...] = (),
        predicted_cached_tokens: int = 0,
        local: bool = False,
        path_reason: str = "",
        answer_blocks: tuple[int, ...] = (),
    ) -> None:
        self.request_id = request_id
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        # the true length: the engines know it (max_tokens + ignore_eos), the router does not
        self.output_tokens = output_tokens
        self.slo_class = slo_class
        self.prefix_blocks = prefix_blocks
        self.predicted_output_tokens = predicted_output_tokens
        self.prefill_id = prefill_id
        self.decode_id = decode_id
        # prompt tokens each engine served from its prefix cache
        self.cached_prefill_tokens = 0
        self.cached_decode_tokens = 0
        self.predicted_cached_tokens = predicted_cached_tokens  # what the router's index expected of it
        # prefill progress
        self.prefill_left_tokens = 0
        self.prefill_kv_held = False
        # what the request holds in each engine's pool (kvcache/pool.py), while it holds it
        self.prefill_kv: RequestBlocks | None = None
        self.decode_kv: RequestBlocks | None = None
        # decode progress: emitted tokens = instance steps done - join_step while running
        self.join_step = 0
        self.join_order = 0
        self.emitted_tokens = 0
        self.recompute_tokens = 0  # after a preemption: tokens to recompute on rejoining
        self.running = False
        # timestamps
        self.prefill_done_s: float | None = None
        self.first_token_s: float | None = None
        self.last_token_s: float | None = None
        # its decode engine prefills it (RouteDecision.local): no prefill engine, no pull
        self.local = local
        self.path_reason = path_reason  # RouteDecision.reason
        self.answer_blocks = answer_blocks  # RequestSpec.answer_blocks: cached where it is decoded

    def __repr__(self) -> str:
        return f"SimRequest({self.request_id!r}, prefill={self.prefill_id}, decode={self.decode_id})"
