"""vLLM's /metrics names that calroute reads: the proxy's live signals and the calibration's KV size.

Names as vLLM 0.32 serves them (vllm/v1/metrics/loggers.py); ``GPU_CACHE_USAGE`` is the KV usage gauge's
name before vLLM 0.11. The emulator serves the same names (emulator/metrics.py).
"""

from __future__ import annotations

KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"  # 0..1, blocks in use over the engine's blocks
GPU_CACHE_USAGE = "vllm:gpu_cache_usage_perc"  # the same gauge, vLLM < 0.11
NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
# An info gauge whose labels carry the cache's configuration (num_gpu_blocks, block_size, ...).
CACHE_CONFIG_INFO = "vllm:cache_config_info"
