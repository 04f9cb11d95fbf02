"""A request its decode engine prefills itself (RouteDecision.local): no prefill engine, no pull; the prompt
past the engine's own cache hit computed in its steps, at the calibrated prefill curve's price, delaying the
streams running there by as much."""

from __future__ import annotations

from typing import ClassVar

import pytest

from calroute.costmodel.predictors import make_predictor
from calroute.costmodel.profiles import get_profile
from calroute.policies import make_policy
from calroute.results.records import RequestRecord
from calroute.routing.ledger import Ledger
from calroute.routing.prefix_index import PrefixIndex
from calroute.routing.router import Router
from calroute.sim.simulator import ClusterShape, ClusterSim
from calroute.types import (
    PREFIX_BLOCK_TOKENS,
    Admission,
    ClusterView,
    RequestSpec,
    RouteDecision,
    SloClass,
    local_decision,
)

PROFILE = get_profile("a40-qwen2.5-3b")
CAL = PROFILE.calibration
B = PREFIX_BLOCK_TOKENS


class Local:
    """Every request to decode-0 alone, but those whose id starts with "remote"."""

    name: ClassVar[str] = "local"
    reads_engine_samples: ClassVar[bool] = False

    def route(self, adm: Admission, view: ClusterView) -> RouteDecision:
        if adm.request_id.startswith("remote"):
            return RouteDecision("prefill-0", "decode-0")
        return local_decision("decode-0", "test")


def run(reqs: list[RequestSpec]) -> dict[str, RequestRecord]:
    shape = ClusterShape(1, 1)
    instances = shape.instances(PROFILE.limits.kv_capacity_tokens)
    router = Router(
        Local(), make_predictor("bucket"), Ledger(instances, CAL), prefix=PrefixIndex(instances, B)
    )
    records: list[RequestRecord] = []
    ClusterSim(PROFILE, shape, router, "local", kv_event_delay_s=0.0).run(reqs, records.append)
    return {r.request_id: r for r in records}


def prefill_s(tokens: int, done: int = 0) -> float:
    c = CAL.prefill
    return c.per_token_s * (tokens - done) + c.attn_s_per_token2 * (tokens * tokens - done * done) / 2


def step_s(streams: int, context: int) -> float:
    d = CAL.decode
    return d.base_s + d.per_seq_s * streams + d.per_ctx_token_s * context


def test_a_local_request_never_meets_a_prefill_engine() -> None:
    rec = run([RequestSpec("a", 0.0, 4 * B + 100, 10, SloClass.LOOSE, (1, 2, 3, 4))])["a"]
    assert (rec.prefill_id, rec.decode_id, rec.local_prefill, rec.path_reason) == (
        "decode-0",
        "decode-0",
        True,
        "test",
    )
    # alone: its prefill and one decode step, nothing else (no queue, no pull)
    assert rec.first_token_s == pytest.approx(prefill_s(4 * B + 100) + step_s(1, 4 * B + 100))
    assert rec.prefill_done_s == rec.first_token_s and rec.cached_tokens == 0


@pytest.mark.parametrize(
    ("first", "second_blocks", "hit_tokens"),
    [
        # a second turn on the blocks the first one computed here: they are not computed again
        ("a", (1, 2, 3, 4, 5), 4 * B),
        # the first one remote: the decode engine cached the blocks it pulled
        ("remote-a", (1, 2, 3, 4, 5), 4 * B),
        # nothing in common
        ("a", (7, 8, 9, 10, 11), 0),
    ],
)
def test_a_local_prefill_computes_only_what_its_engine_lacks(
    first: str, second_blocks: tuple[int, ...], hit_tokens: int
) -> None:
    prompt = 5 * B + 100
    recs = run(
        [
            RequestSpec(first, 0.0, 4 * B + 100, 2, SloClass.LOOSE, (1, 2, 3, 4)),
            RequestSpec("b", 100.0, prompt, 2, SloClass.LOOSE, second_blocks),
        ]
    )
    b = recs["b"]
    assert b.cached_tokens == hit_tokens and b.ttft_s is not None
    assert b.ttft_s == pytest.approx(prefill_s(prompt, hit_tokens) + step_s(1, prompt))


def test_a_local_prefill_delays_the_streams_running_on_its_engine() -> None:
    """A stream's tokens after a local prefill joined come that prefill's time later than without it."""
    long = RequestSpec("remote-long", 0.0, 200, 2_000, SloClass.LOOSE)
    alone = run([long])["remote-long"]
    late = run([long, RequestSpec("a", 5.0, 8 * B, 2, SloClass.LOOSE)])["remote-long"]
    assert late.last_token_s is not None and alone.last_token_s is not None
    delay = late.last_token_s - alone.last_token_s
    # the prefill's compute, and the slightly slower steps while "a" ran beside it
    assert prefill_s(8 * B) < delay < prefill_s(8 * B) + 0.05


def test_marginal_cost_with_local_prefill_keeps_a_conversation_on_its_decode_engine() -> None:
    """Its second turn extends what a decode engine computed: cheaper there than on a prefill engine plus a
    transfer, so it stays, and that engine's cache serves it."""
    policy = make_policy("marginal_cost", {"local_prefill": "true"}, CAL)
    shape = ClusterShape(2, 4)
    instances = shape.instances(PROFILE.limits.kv_capacity_tokens)
    router = Router(
        policy, make_predictor("bucket"), Ledger(instances, CAL), prefix=PrefixIndex(instances, B)
    )
    records: list[RequestRecord] = []
    reqs = [
        RequestSpec("t0", 0.0, 16 * B + 10, 50, SloClass.LOOSE, tuple(range(16))),
        RequestSpec("t1", 30.0, 17 * B + 10, 50, SloClass.LOOSE, tuple(range(17))),
    ]
    ClusterSim(PROFILE, shape, router, "marginal_cost", kv_event_delay_s=0.01).run(reqs, records.append)
    t0, t1 = sorted(records, key=lambda r: r.request_id)
    assert t1.local_prefill and t1.path_reason == "cheaper_local" and t1.decode_id == t0.decode_id
    assert t1.cached_tokens == 16 * B


@pytest.mark.parametrize(("first", "hit_blocks"), [("a", 6), ("remote-a", 6)])
def test_the_engine_that_decoded_an_answer_holds_it(first: str, hit_blocks: int) -> None:
    """A conversation's next turn repeats the previous prompt and answer: the decode engine that generated
    the answer cached its whole blocks (RequestSpec.answer_blocks), so the turn hits past the prompt."""
    recs = run(
        [
            # 4 blocks of prompt + 100 tokens, then 1,000 answer tokens: 2 more whole blocks
            RequestSpec(first, 0.0, 4 * B + 100, 1_000, SloClass.LOOSE, (1, 2, 3, 4), (5, 6)),
            RequestSpec("b", 100.0, 7 * B + 50, 2, SloClass.LOOSE, (1, 2, 3, 4, 5, 6, 7)),
        ]
    )
    assert recs["b"].cached_tokens == hit_blocks * B


def test_two_local_prefills_at_one_instant_each_pay_their_own() -> None:
    """The second arrives as the first's step is planned: it waits for that step's end, and the first's
    prefill stays in its step (planning again at the same instant once dropped it: the request ended before
    the first token the engine had announced for it, and the ledger failed on it)."""
    recs = run(
        [
            RequestSpec("a", 1.0, 2 * B + 100, 1, SloClass.TIGHT, (1, 2)),
            RequestSpec("b", 1.0, 2 * B + 300, 1, SloClass.TIGHT, (5, 6)),
        ]
    )
    a, b = recs["a"], recs["b"]
    assert a.ttft_s == pytest.approx(prefill_s(2 * B + 100) + step_s(1, 2 * B + 100))
    assert a.last_token_s == a.first_token_s
    # b joins at the end of a's step, then pays its own prefill in the next
    assert b.first_token_s is not None and a.first_token_s is not None
    assert b.first_token_s - a.first_token_s >= prefill_s(2 * B + 300)
