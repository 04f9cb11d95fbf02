"""The simulator's mutable per-request state (the workload's RequestSpec plus what happened to it)."""

from __future__ import annotations

from dataclasses import dataclass

from calroute.types import SloClass


@dataclass(slots=True, eq=False)
class SimRequest:
    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int  # the true length: the engines know it (max_tokens + ignore_eos), the router does not
    slo_class: SloClass
    predicted_output_tokens: int
    prefill_id: str
    decode_id: str
    # prefill progress
    prefill_left_tokens: int = 0
    prefill_kv_held: bool = False
    # decode progress: emitted tokens = instance steps done - join_step while running
    join_step: int = 0
    join_order: int = 0
    emitted_tokens: int = 0
    recompute_tokens: int = 0  # after a preemption: tokens to recompute on rejoining
    running: bool = False
    # timestamps
    prefill_done_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
