"""The engines' limits on the command line: every command that models engines (simulate, tune, experiment
--backend sim, engines up and emulate) takes them, in place of the hardware profile's (costmodel/profiles.py,
EngineLimits; the paper's 60,000-token KV budget for a40-qwen2.5-3b). Each command declares the four
options with these types and passes what it got to ``overrides``, then to cli.common.load_profile."""

from __future__ import annotations

from typing import Annotated

import typer

from calroute.errors import ConfigError

KvCapacity = Annotated[
    int | None,
    typer.Option(
        "--kv-capacity-tokens",
        help=(
            "each engine's KV capacity in tokens (default: the profile's, the paper's 60,000; an A40 "
            "serving Qwen2.5-3B holds about 1,000,000 at 36 KiB a token)"
        ),
    ),
]
MaxModelLen = Annotated[
    int | None,
    typer.Option("--max-model-len", help="the engines' longest prompt + output (default: the profile's)"),
]
MaxBatchedTokens = Annotated[
    int | None,
    typer.Option(
        "--max-batched-tokens",
        help="prefill tokens per engine step, chunked beyond it (default: the profile's)",
    ),
]
MaxNumSeqs = Annotated[
    int | None, typer.Option("--max-num-seqs", help="sequences per engine batch (default: the profile's)")
]
# EngineLimits' fields, in the order ``overrides`` takes them, and their options
OPTIONS = {
    "kv_capacity_tokens": "--kv-capacity-tokens",
    "max_model_len": "--max-model-len",
    "max_batched_tokens": "--max-batched-tokens",
    "max_num_seqs": "--max-num-seqs",
}


def overrides(
    kv_capacity_tokens: int | None,
    max_model_len: int | None,
    max_batched_tokens: int | None,
    max_num_seqs: int | None,
) -> dict[str, int]:
    """The limits a command was given, by EngineLimits' field names; a ConfigError names the option of a
    value below 1."""
    given = dict(
        zip(OPTIONS, (kv_capacity_tokens, max_model_len, max_batched_tokens, max_num_seqs), strict=True)
    )
    out = {}
    for name, value in given.items():
        if value is None:
            continue
        if value < 1:
            raise ConfigError(f"{OPTIONS[name]} must be >= 1, got {value}")
        out[name] = value
    return out
