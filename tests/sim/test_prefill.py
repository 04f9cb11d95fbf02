"""The prefill engine: FCFS iterations under a token budget, chunking, and KV held until pulled."""

from __future__ import annotations

import pytest

from calroute.costmodel.calibration import PrefillCurve
from calroute.sim.kernel import Kernel
from calroute.sim.prefill import PrefillInstance
from calroute.sim.requests import SimRequest
from calroute.types import SloClass

CURVE = PrefillCurve(base_s=0.01, per_token_s=1e-4, attn_s_per_token2=1e-8)


def make_req(rid: str, prompt: int) -> SimRequest:
    return SimRequest(rid, 0.0, prompt, 10, SloClass.LOOSE, 10, "p0", "d0")


def build(budget: int = 2048, kv: int = 60_000) -> tuple[Kernel, PrefillInstance, list[tuple[str, float]]]:
    kernel = Kernel()
    done: list[tuple[str, float]] = []
    inst = PrefillInstance(
        "p0", kernel, CURVE, kv, budget, lambda r: done.append((r.request_id, kernel.now_s))
    )
    return kernel, inst, done


def test_one_prompt_takes_the_curve_time() -> None:
    kernel, inst, done = build()
    kernel.at(1.0, lambda _: inst.enqueue(make_req("a", 1000)))
    kernel.run()
    assert done == [("a", pytest.approx(1.0 + CURVE.single_s(1000)))]


def test_prompts_queued_together_share_an_iteration_within_the_budget() -> None:
    kernel, inst, done = build(budget=2048)
    reqs = [make_req("busy", 500), make_req("a", 800), make_req("b", 800), make_req("c", 800)]

    def submit(_: object) -> None:
        for r in reqs:
            inst.enqueue(r)

    kernel.at(0.0, submit)
    kernel.run()
    t1 = CURVE.single_s(500)
    # a and b fit together in the next iteration (1600 <= 2048); c's first 448 tokens ride along (chunked)
    t2 = t1 + CURVE.base_s + CURVE.per_token_s * 2048 + CURVE.attn_s_per_token2 * (800 * 400 * 2 + 448 * 224)
    t3 = t2 + CURVE.base_s + CURVE.per_token_s * 352 + CURVE.attn_s_per_token2 * 352 * (448 + 176)
    assert done == [
        ("busy", pytest.approx(t1)),
        ("a", pytest.approx(t2)),
        ("b", pytest.approx(t2)),
        ("c", pytest.approx(t3)),
    ]


def test_a_long_prompt_is_chunked_across_iterations() -> None:
    kernel, inst, done = build(budget=1000)
    kernel.at(0.0, lambda _: inst.enqueue(make_req("long", 2500)))
    kernel.run()
    attn = 1000 * 500 + 1000 * 1500 + 500 * 2250
    want = 3 * CURVE.base_s + CURVE.per_token_s * 2500 + CURVE.attn_s_per_token2 * attn
    assert done == [("long", pytest.approx(want))]


def test_head_waits_for_kv_until_the_decode_side_pulls() -> None:
    kernel, inst, done = build(kv=1500)
    a, b = make_req("a", 1000), make_req("b", 1000)
    kernel.at(0.0, lambda _: inst.enqueue(a))
    kernel.at(0.0, lambda _: inst.enqueue(b))
    kernel.run()
    assert [d[0] for d in done] == ["a"]  # b cannot start: a's KV is still held
    assert inst.kv_used_tokens == 1000
    kernel.at(5.0, lambda _: inst.release_kv(a))
    kernel.run()
    assert done[1] == ("b", pytest.approx(5.0 + CURVE.single_s(1000)))
    assert inst.peak_kv_used_tokens <= 1500


def test_a_prompt_is_cached_chunk_by_chunk_and_announced_when_its_iteration_ends() -> None:
    # budget 1024 tokens, 512-token blocks: a 2,600-token prompt of 5 full blocks is computed in 3 chunks;
    # each iteration caches the blocks it fills when it is scheduled (a request scheduled beside or after it
    # hits them) and the engine announces them when the iteration ends, as vLLM publishes a step's events
    kernel = Kernel()
    heard: list[tuple[float, bool, tuple[int, ...]]] = []
    inst = PrefillInstance(
        "p0",
        kernel,
        CURVE,
        60_000,
        1024,
        lambda r: None,
        block_tokens=512,
        cache_listener=lambda stored, blocks: heard.append((kernel.now_s, stored, blocks)),
    )
    long = SimRequest("long", 0.0, 2600, 10, SloClass.LOOSE, 10, "p0", "d0", (1, 2, 3, 4, 5))
    seen: list[tuple[int, int]] = []
    kernel.at(0.0, lambda _: inst.enqueue(long))
    kernel.at(0.0, lambda _: seen.append((inst.pool.cached_blocks, len(heard))))
    kernel.run()
    assert seen == [(2, 0)]  # the first chunk's two blocks cached when scheduled, not yet announced
    t1 = CURVE.base_s + CURVE.per_token_s * 1024 + CURVE.attn_s_per_token2 * 1024 * 512
    assert [h[1:] for h in heard] == [(True, (1, 2)), (True, (3, 4)), (True, (5,))]
    assert heard[0][0] == pytest.approx(t1)


def test_a_prompt_queued_behind_its_prefix_hits_what_the_head_computed() -> None:
    kernel, inst, done = build(budget=1024)
    head = SimRequest("head", 0.0, 2600, 10, SloClass.LOOSE, 10, "p0", "d0", (1, 2, 3, 4, 5))
    tail = SimRequest("tail", 0.0, 1100, 10, SloClass.LOOSE, 10, "p0", "d0", (1, 2))
    kernel.at(0.0, lambda _: inst.enqueue(head))
    kernel.at(0.0, lambda _: inst.enqueue(tail))
    kernel.run()
    # the tail is scheduled in the head's third iteration, after the head's first chunk cached blocks 1-2
    assert tail.cached_prefill_tokens == 1024 and head.cached_prefill_tokens == 0
