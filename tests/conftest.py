"""Factories shared by the tests (vLLM-style keyword-default builders)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from calroute.cluster import launch, vllm
from calroute.cluster.file import ClusterFile
from calroute.costmodel.calibration import Calibration
from calroute.costmodel.profiles import HardwareProfile, get_profile
from calroute.types import Admission, ClusterView, InstanceState, Role, SloClass

REPO = Path(__file__).resolve().parents[1]

# The tests on real vLLM engines share one 2P+1D cluster (`real_vllm_cluster`): each start-up costs 25-40 s
# on the 2-core CI machine. Idle vLLM CPU engines keep about a core busy, which would skew every timing test
# run beside them, so the tests that use it run last, in this order of their files: the compatibility suite
# (it checks the prefill engine's KV usage drains to 0), the calibration, then the proxy's tests, whose last
# one kills the decode engine. Within a file the order is unchanged. A test marks itself with `real_vllm`
# (or requests the fixture).
REAL_VLLM_ORDER = ("tests/emulator/", "tests/calibrate/", "tests/tokenizer/", "tests/proxy/")


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


@pytest.fixture(scope="session")
def real_vllm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterFile]:
    """2 prefill + 1 decode real vLLM engines with NIXL, shared by every test on real vLLM (they run last):
    two prefill engines, so that routing on what each one caches can be seen, and KV events on, so that the
    proxy's prefix index learns it from the engines (tests/proxy/test_proxy_vllm)."""
    venv, model = vllm.default_vllm_paths(REPO)
    if not vllm.vllm_available(venv, model):
        pytest.fail("real vLLM is not installed: run `make vllm` (make test does it)")
    launched = launch.up_vllm(2, 1, tmp_path_factory.mktemp("real-vllm"), repo_root=REPO, kv_events=True)
    try:
        yield launched.file
    finally:
        launched.stop()


def _real_vllm_rank(item: pytest.Item) -> int:
    """-1 for a test off the shared real-vLLM cluster, else its file's place in REAL_VLLM_ORDER."""
    if item.get_closest_marker("real_vllm") is None and "real_vllm_cluster" not in getattr(
        item, "fixturenames", ()
    ):
        return -1
    return next((i for i, d in enumerate(REAL_VLLM_ORDER) if item.nodeid.startswith(d)), len(REAL_VLLM_ORDER))


@pytest.hookimpl(trylast=True)  # after pytest's own grouping of items by their fixtures' parameters
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests on the shared real-vLLM cluster go last (see REAL_VLLM_ORDER); the others keep their order."""
    items.sort(key=lambda item: (_real_vllm_rank(item) >= 0, _real_vllm_rank(item)))
