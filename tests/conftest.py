"""Factories shared by the tests (vLLM-style keyword-default builders)."""

from __future__ import annotations

from typing import Any

import pytest

from calroute.costmodel.calibration import Calibration
from calroute.costmodel.profiles import HardwareProfile, get_profile
from calroute.engines.cluster import ClusterFile
from calroute.types import Admission, ClusterView, InstanceState, Role, SloClass


def make_state(instance_id: str = "decode-0", role: Role = Role.DECODE, **kw: Any) -> InstanceState:
    base: dict[str, Any] = dict(
        healthy=True,
        in_flight=0,
        backlog_s=0.0,
        kv_committed_tokens=0,
        kv_used_tokens=0,
        kv_capacity_tokens=60_000,
        running=0,
        waiting=0,
        metrics_age_s=0.0,
    )
    base.update(kw)
    return InstanceState(instance_id=instance_id, role=role, **base)


def make_view(
    prefill: list[dict[str, Any]] | int = 2,
    decode: list[dict[str, Any]] | int = 4,
    seq: int = 0,
    now_s: float = 0.0,
) -> ClusterView:
    pre = [{}] * prefill if isinstance(prefill, int) else prefill
    dec = [{}] * decode if isinstance(decode, int) else decode
    return ClusterView(
        now_s=now_s,
        seq=seq,
        prefill=tuple(make_state(f"prefill-{i}", Role.PREFILL, **kw) for i, kw in enumerate(pre)),
        decode=tuple(make_state(f"decode-{i}", Role.DECODE, **kw) for i, kw in enumerate(dec)),
    )


def make_admission(
    prompt_tokens: int = 512, predicted_output_tokens: int = 128, slo_class: SloClass = SloClass.LOOSE
) -> Admission:
    return Admission("r0", prompt_tokens, predicted_output_tokens, slo_class)


@pytest.fixture
def profile() -> HardwareProfile:
    return get_profile("a40-qwen2.5-3b")


@pytest.fixture
def calibration(profile: HardwareProfile) -> Calibration:
    return profile.calibration


def unreachable_cluster(prefill: int, decode: int) -> ClusterFile:
    """A cluster file whose engines are never contacted (tests that replace the runs or the server)."""
    engines = [(f"prefill-{i}", "prefill") for i in range(prefill)]
    engines += [(f"decode-{i}", "decode") for i in range(decode)]
    return ClusterFile.from_dict(
        {
            "kind": "emulated",
            "model": "emulated",
            "max_model_len": 32768,
            "engines": [
                {"id": e, "role": r, "url": f"http://127.0.0.1:{9 + i}", "kv_capacity_tokens": 60000}
                for i, (e, r) in enumerate(engines)
            ],
        }
    )
