"""Hardware profiles: the service model of an engine (its curves and limits), named and with provenance.

``a40-qwen2.5-3b`` is derived here from first principles (GPU datasheet bandwidth and FLOPs, the model's
shape); docs/hardware-profile.md walks through the numbers. A profile can also be built from a
calibration file, so the simulator runs on the constants measured on a real or emulated cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from calroute.costmodel.calibration import (
    Calibration,
    DecodeCurve,
    PrefillCurve,
    TransferModel,
    derive_calibration,
)
from calroute.errors import ConfigError


@dataclass(frozen=True)
class GpuSpec:
    name: str
    mem_bw_bytes_per_s: float
    dense_bf16_flops_per_s: float


@dataclass(frozen=True)
class ModelSpec:
    name: str
    params: float  # all parameters, embeddings included (tied: the LM head reuses them)
    non_embedding_params: float
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    max_model_len: int

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        # K and V, every layer, the KV heads only (GQA).
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


@dataclass(frozen=True)
class Efficiency:
    """The assumptions of a roofline derivation; each is documented in docs/hardware-profile.md."""

    bandwidth_fraction: float = 0.7  # achieved fraction of peak memory bandwidth (weights and KV reads)
    gemm_fraction: float = 0.6  # achieved fraction of peak dense FLOPs in prefill GEMMs
    attention_fraction: float = 0.4  # achieved fraction in prefill attention kernels
    step_overhead_s: float = 0.003  # per engine iteration: scheduling, sampling, kernel launches
    transfer_latency_s: float = 0.001  # per KV transfer: NIXL notification and descriptor setup
    transfer_bandwidth_bytes_per_s: float = 20e9  # GPU to GPU over PCIe Gen4 x16 within one node


@dataclass(frozen=True)
class EngineLimits:
    kv_capacity_tokens: int = 60_000  # the paper's per-engine budget
    max_model_len: int = 32_768
    max_batched_tokens: int = 8_192  # prefill token budget per iteration (chunked beyond it)
    max_num_seqs: int = 256
    kv_watermark_frac: float = 0.01  # decode admission keeps this fraction free, as vLLM does

    def __post_init__(self) -> None:
        for name in ("kv_capacity_tokens", "max_model_len", "max_batched_tokens", "max_num_seqs"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"engine limit {name} must be > 0, got {getattr(self, name)!r}")
        if not 0 <= self.kv_watermark_frac < 0.5:
            raise ConfigError(f"kv_watermark_frac must be in [0, 0.5), got {self.kv_watermark_frac!r}")

    @property
    def max_request_tokens(self) -> int:
        """A request longer than this (prompt + output) can never run: it is rejected at admission."""
        return min(self.max_model_len, self.kv_capacity_tokens)


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    calibration: Calibration
    limits: EngineLimits


def roofline_profile(
    name: str, gpu: GpuSpec, model: ModelSpec, eff: Efficiency, limits: EngineLimits
) -> HardwareProfile:
    """Curves from a roofline: weight and KV reads at achieved bandwidth, GEMMs and attention at achieved
    FLOPs.

    Terms are added, not overlapped (no max()): an upper bound of the roofline, and what a linear curve of
    the calibrated form can represent.
    """
    bw = gpu.mem_bw_bytes_per_s * eff.bandwidth_fraction
    weights_read_s = model.weight_bytes / bw
    attn_flops_per_token2 = 4 * model.layers * model.q_heads * model.head_dim
    prefill = PrefillCurve(
        base_s=eff.step_overhead_s + weights_read_s,
        per_token_s=2 * model.non_embedding_params / (gpu.dense_bf16_flops_per_s * eff.gemm_fraction),
        attn_s_per_token2=attn_flops_per_token2 / (gpu.dense_bf16_flops_per_s * eff.attention_fraction),
    )
    decode = DecodeCurve(
        base_s=eff.step_overhead_s + weights_read_s,
        per_seq_s=2 * model.params / (gpu.dense_bf16_flops_per_s * eff.gemm_fraction),
        per_ctx_token_s=model.kv_bytes_per_token / bw,
    )
    transfer = TransferModel(eff.transfer_latency_s, eff.transfer_bandwidth_bytes_per_s)
    provenance = {
        "source": f"profile:{name}",
        "method": "first-principles roofline (docs/hardware-profile.md)",
        "gpu": gpu.name,
        "model": model.name,
        "efficiency": {k: v for k, v in vars(eff).items()},
    }
    cal = derive_calibration(prefill, decode, transfer, model.kv_bytes_per_token, provenance)
    return HardwareProfile(
        name=name, calibration=cal, limits=replace(limits, max_model_len=model.max_model_len)
    )


# NVIDIA A40 datasheet: 696 GB/s GDDR6, 149.7 TFLOPS dense BF16 (tensor cores, without sparsity).
A40 = GpuSpec(name="NVIDIA A40", mem_bw_bytes_per_s=696e9, dense_bf16_flops_per_s=149.7e12)
# Qwen2.5-3B model card and config.json: 3.09 B parameters (2.77 B non-embedding), 36 layers, 16 query heads,
# 2 KV heads, head_dim 128 (hidden 2048), tied embeddings, 32,768 context; served in BF16.
QWEN25_3B = ModelSpec(
    name="Qwen2.5-3B",
    params=3.09e9,
    non_embedding_params=2.77e9,
    layers=36,
    q_heads=16,
    kv_heads=2,
    head_dim=128,
    dtype_bytes=2,
    max_model_len=32_768,
)


DEFAULT_PROFILE = "a40-qwen2.5-3b"  # what every command uses unless told otherwise


def _builtin() -> dict[str, HardwareProfile]:
    return {
        DEFAULT_PROFILE: roofline_profile(DEFAULT_PROFILE, A40, QWEN25_3B, Efficiency(), EngineLimits()),
    }


def profile_names() -> list[str]:
    return sorted(_builtin())


def get_profile(name: str) -> HardwareProfile:
    profiles = _builtin()
    if name not in profiles:
        raise ConfigError(f"unknown hardware profile {name!r}; known: {', '.join(sorted(profiles))}")
    return profiles[name]


def profile_from_calibration(cal: Calibration, limits: EngineLimits | None = None) -> HardwareProfile:
    """A profile whose curves are the ones fitted in a calibration file."""
    source = str(cal.provenance.get("source", "calibration"))
    return HardwareProfile(name=f"calibrated:{source}", calibration=cal, limits=limits or EngineLimits())
