"""Emulated engines started with engine limits in place of the profile's (`calroute engines up
--kv-capacity-tokens ...`): the cluster file says them, and the engines keep to them."""

from __future__ import annotations

from pathlib import Path

from calroute.cluster import launch
from calroute.emulator.tokens import text_of_tokens
from tests.emulator.http import metric, request


def test_emulated_engines_keep_to_the_limits_they_are_given(tmp_path: Path) -> None:
    limits = {"kv_capacity_tokens": 4096, "max_model_len": 2048}
    launched = launch.up_emulated(1, 1, tmp_path, process_per_engine=True, limits=limits)
    try:
        c = launched.file
        assert c.max_model_len == 2048 and {e.kv_capacity_tokens for e in c.engines} == {4096}
        prefill = c.prefill[0].url
        body = {"model": "emulated", "prompt": text_of_tokens(1500), "max_tokens": 1, "ignore_eos": True}
        status, _ = request(
            f"{prefill}/v1/completions", {**body, "kv_transfer_params": {"do_remote_decode": True}}
        )
        assert status == 200
        # the held prompt's 1,500 tokens of a 4,096-token cache: a usage the profile's 60,000 would not show
        assert metric(prefill, "vllm:kv_cache_usage_perc") > 0.3
        too_long = {**body, "prompt": text_of_tokens(2100)}
        assert request(f"{prefill}/v1/completions", too_long)[0] == 400  # past --max-model-len
    finally:
        launched.stop()
