"""The decode engine's closed-form stretches against hand-computed step sums; KV budget and preemption."""

from __future__ import annotations

from dataclasses import replace

import pytest

from calroute.costmodel.calibration import DecodeCurve, PrefillCurve
from calroute.costmodel.profiles import EngineLimits
from calroute.sim.decode import DecodeInstance
from calroute.sim.kernel import Kernel
from calroute.sim.requests import SimRequest
from calroute.sim.sampling import Sample
from calroute.types import SloClass

CURVE = DecodeCurve(base_s=0.010, per_seq_s=0.001, per_ctx_token_s=1e-6)
RECOMPUTE = PrefillCurve(base_s=0.0, per_token_s=1e-4)
TRANSFER_S = 0.002


def make_req(rid: str, prompt: int, output: int) -> SimRequest:
    return SimRequest(rid, 0.0, prompt, output, SloClass.LOOSE, output, "p0", "d0")


class Harness:
    def __init__(self, limits: EngineLimits | None = None) -> None:
        self.kernel = Kernel()
        self.done: list[SimRequest] = []
        self.first: list[tuple[str, float]] = []
        self.pulled: list[str] = []
        self.engine = DecodeInstance(
            "d0",
            self.kernel,
            CURVE,
            RECOMPUTE,
            lambda tokens: TRANSFER_S,
            limits or EngineLimits(),
            lambda r: self.pulled.append(r.request_id),
            lambda t, rs: self.first.extend((r.request_id, t) for r in rs),
            self.done.append,
        )

    def submit_at(self, t: float, req: SimRequest) -> None:
        self.kernel.at(t, lambda _: self.engine.enqueue(req))


def step(batch: int, context: int) -> float:
    return CURVE.step_s(batch, context)


def test_single_request_matches_the_step_by_step_sum() -> None:
    h = Harness()
    req = make_req("a", prompt=100, output=50)
    h.submit_at(1.0, req)
    h.kernel.run()
    t = 1.0 + TRANSFER_S
    times = []
    for k in range(50):  # step k sees the prompt plus the k tokens emitted before it
        t += step(1, 100 + k)
        times.append(t)
    assert h.first == [("a", pytest.approx(times[0]))]
    assert req.first_token_s == pytest.approx(times[0])
    assert req.last_token_s == pytest.approx(times[-1])
    assert h.pulled == ["a"] and h.done == [req]


def test_a_request_joins_at_the_next_step_boundary_and_slows_the_batch() -> None:
    h = Harness()
    a, b = make_req("a", 100, 40), make_req("b", 200, 5)
    h.submit_at(0.0, a)
    h.submit_at(0.1, b)
    h.kernel.run()
    # replay by hand, one step at a time
    t, emitted_a, b_state, b_ready, b_emitted = TRANSFER_S, 0, "waiting", None, 0
    first_b = last_b = last_a = None
    while emitted_a < 40:
        batch = [("a", 100 + emitted_a)]
        if b_state == "running":
            batch.append(("b", 200 + b_emitted))
        t += step(len(batch), sum(c for _, c in batch))
        emitted_a += 1
        if b_state == "running":
            b_emitted += 1
            if b_emitted == 1:
                first_b = t
            if b_emitted == 5:
                last_b, b_state = t, "done"
        if emitted_a == 40:
            last_a = t
        # the scheduler runs at each boundary: b is admitted (transfer starts) at the first boundary
        # after it arrives, and joins at the first boundary after its transfer ends
        if b_state == "waiting" and t >= 0.1:
            b_state, b_ready = "transferring", t + TRANSFER_S
        elif b_state == "transferring" and b_ready is not None and t >= b_ready:
            b_state = "running"
    assert b.first_token_s == pytest.approx(first_b)
    assert b.last_token_s == pytest.approx(last_b)
    assert a.last_token_s == pytest.approx(last_a)


def test_kv_budget_is_never_exceeded_and_preempted_requests_finish() -> None:
    limits = replace(EngineLimits(), kv_capacity_tokens=3000, max_model_len=3000)
    h = Harness(limits)
    reqs = [make_req(f"r{i}", prompt=400, output=900) for i in range(6)]
    for i, r in enumerate(reqs):
        h.submit_at(0.01 * i, r)
    h.kernel.run()
    assert sorted(r.request_id for r in h.done) == sorted(r.request_id for r in reqs)
    assert h.engine.preemptions > 0
    assert h.engine.peak_kv_used_tokens <= 3000
    assert all(r.emitted_tokens == r.output_tokens for r in reqs)
    assert all(r.first_token_s is not None and r.last_token_s is not None for r in reqs)
    assert all(r.first_token_s <= r.last_token_s for r in reqs)  # type: ignore[operator]


def test_waiting_requests_are_not_admitted_beyond_the_kv_budget() -> None:
    limits = replace(EngineLimits(), kv_capacity_tokens=1000, max_model_len=1000, kv_watermark_frac=0.0)
    h = Harness(limits)
    a, b = make_req("a", 600, 10), make_req("b", 600, 10)
    h.submit_at(0.0, a)
    h.submit_at(0.0, b)
    h.kernel.run()
    # b cannot be pulled while a holds 600+ tokens: it starts after a finishes
    assert b.first_token_s is not None and a.last_token_s is not None
    assert b.first_token_s > a.last_token_s
    assert h.engine.peak_kv_used_tokens <= 1000


def test_metrics_are_held_as_of_the_last_poll_tick() -> None:
    h = Harness()
    h.submit_at(0.0, make_req("a", 100, 1000))
    h.submit_at(0.0, make_req("b", 100, 1000))
    samples: list[Sample | None] = []
    for t in (0.0, 0.0005, 0.051, 0.5):
        h.kernel.at(t, lambda _: samples.append(h.engine.metrics.read(h.kernel.now_s)))
    h.kernel.run()
    assert samples[0] is None  # no poll has happened yet
    # as polled at t=0, after the two requests arrived: both transferring, KV reserved, none running
    assert samples[1] == Sample(0.0, 200, 0, 2)
    assert samples[2] is not None and samples[2].tick_s == 0.05
    assert (samples[2].running, samples[2].waiting) == (2, 0)
    last = samples[3]
    assert last is not None
    tick, kv, running, waiting = last.tick_s, last.kv_used_tokens, last.running, last.waiting
    assert tick == pytest.approx(0.45) and (running, waiting) == (2, 0)
    steps, t = 0, TRANSFER_S  # tokens emitted by each request by the tick, from the curve
    while t + step(2, 200 + 2 * steps) <= tick:
        t += step(2, 200 + 2 * steps)
        steps += 1
    assert kv == 200 + 2 * steps


def test_a_decode_engine_pulls_what_its_cache_lacks_and_caches_it_when_pulled() -> None:
    kernel = Kernel()
    asked: list[int] = []
    heard: list[tuple[float, bool, tuple[int, ...]]] = []

    def transfer_s(tokens: int) -> float:
        asked.append(tokens)
        return TRANSFER_S

    engine = DecodeInstance(
        "d0",
        kernel,
        CURVE,
        RECOMPUTE,
        transfer_s,
        EngineLimits(),
        lambda r: None,
        lambda t, rs: None,
        lambda r: None,
        block_tokens=512,
        cache_listener=lambda stored, blocks: heard.append((kernel.now_s, stored, blocks)),
    )
    first = SimRequest("a", 0.0, 1100, 5, SloClass.LOOSE, 5, "p0", "d0", (1, 2))
    second = SimRequest("b", 0.0, 1600, 5, SloClass.LOOSE, 5, "p0", "d0", (1, 2, 3))
    kernel.at(0.0, lambda _: engine.enqueue(first))
    kernel.at(1.0, lambda _: engine.enqueue(second))
    kernel.run()
    # a: nothing cached, the whole prompt pulled, its blocks cached when the pull is done; b: hits a's two
    # blocks and pulls the 576 tokens past them
    assert asked == [1100, 1600 - 1024]
    assert heard[0] == (pytest.approx(TRANSFER_S), True, (1, 2))
    assert second.cached_decode_tokens == 1024 and first.cached_decode_tokens == 0
    assert engine.pool.used_tokens == 0 and engine.pool.cached_blocks == 3
