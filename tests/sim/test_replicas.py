"""N routers in the simulator (sim/replicas.py): one router in a group is today's run byte for byte; each
router's ledger sees its own bookings, or everyone's with sharing; the balancers split as documented; every
request ends in exactly one record."""

from __future__ import annotations

import io
from collections import Counter
from dataclasses import dataclass, field

import pytest

from calroute.costmodel.profiles import get_profile
from calroute.errors import ConfigError
from calroute.results.records import RecordWriter, RequestRecord
from calroute.routing.router import Decision, Router
from calroute.sim.replicas import RouterGroup, SessionAffinity, make_balancer
from calroute.sim.routers import RouterRecipe, run_routers
from calroute.sim.simulator import ClusterShape, ClusterSim
from calroute.types import RequestSpec, RequestStatus, SloClass
from calroute.workload.source import workload_source
from tests.sim.test_simulator import workload

PROFILE = get_profile("a40-qwen2.5-3b")
SHAPE = ClusterShape(2, 4)
INSTANCES = SHAPE.instances(PROFILE.limits.kv_capacity_tokens)
KV_EVENT_DELAY_S = 0.01


def recipe(policy: str = "marginal_cost", near_best: float | None = None) -> RouterRecipe:
    return RouterRecipe(policy, {}, PROFILE.calibration, near_best=near_best)


def simulate(
    reqs: list[RequestSpec], routers: Router | RouterGroup, precise: bool = False
) -> tuple[list[RequestRecord], bytes]:
    records: list[RequestRecord] = []
    ClusterSim(PROFILE, SHAPE, routers, "p", kv_event_delay_s=KV_EVENT_DELAY_S if precise else None).run(
        reqs, records.append
    )
    buf = io.StringIO()
    w = RecordWriter(buf)
    for r in records:
        w.write(r)
    return records, buf.getvalue().encode()


def group(
    reqs: list[RequestSpec],
    n: int,
    policy: str = "marginal_cost",
    balancer: str = "round_robin",
    share_delay_s: float | None = None,
    precise: bool = False,
    seed: int = 0,
) -> RouterGroup:
    indexed = any(r.prefix_blocks for r in reqs)
    made = run_routers(
        recipe(policy), INSTANCES, seed, indexed, precise and indexed, n, balancer, share_delay_s
    )
    if isinstance(made, RouterGroup):
        return made
    return RouterGroup([made], balancer, seed, share_delay_s)


ONE_ROUTER_CASES = {
    "mixed-bursty, marginal_cost": ("mixed-bursty", 9.0, "marginal_cost", False),
    "shared-prefix on placements, marginal_cost": ("shared-prefix", 8.0, "marginal_cost", False),
    "shared-prefix on KV events, kv_overlap_cost": ("shared-prefix", 8.0, "kv_overlap_cost", True),
    "multi-turn on KV events, marginal_cost": ("multi-turn", 4.0, "marginal_cost", True),
    "multi-turn on placements, round_robin": ("multi-turn", 4.0, "round_robin", False),
}


@pytest.mark.parametrize(
    ("family", "rate", "policy", "precise"), ONE_ROUTER_CASES.values(), ids=list(ONE_ROUTER_CASES)
)
def test_one_router_in_a_group_writes_todays_records_byte_for_byte(
    family: str, rate: float, policy: str, precise: bool
) -> None:
    reqs = workload_source(family, 600).requests(rate, 3)
    indexed = any(r.prefix_blocks for r in reqs)
    plain = recipe(policy).build(INSTANCES, 3, 0, indexed, precise)
    alone = RouterGroup([recipe(policy).build(INSTANCES, 3, 0, indexed, precise)], "round_robin", 3)
    today, today_bytes = simulate(reqs, plain, precise)
    grouped, grouped_bytes = simulate(reqs, alone, precise)
    assert len(today) == 600 and grouped_bytes == today_bytes
    assert alone.stats().admissions == (sum(r.status is RequestStatus.OK for r in today),)


@dataclass
class Watch:
    """Per router, at each of its decisions: its ledger's requests in flight and its view's decode
    in-flight counts, against what is really in flight (its own requests, and everyone's)."""

    group: RouterGroup
    live: dict[str, tuple[int, str]] = field(default_factory=dict)  # request -> (router, decode engine)
    seen: list[tuple[int, int, Counter[str], Counter[str], Counter[str]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for i, r in enumerate(self.group.routers):
            r.on_decision = lambda d, i=i: self.decided(i, d)

    def decided(self, i: int, d: Decision) -> None:
        own = Counter(dec for router, dec in self.live.values() if router == i)
        everyone = Counter(dec for _, dec in self.live.values())
        view = Counter({s.instance_id: s.in_flight for s in d.view.decode if s.in_flight})
        self.seen.append((i, self.group.routers[i].ledger.in_flight_requests(), view, own, everyone))
        self.live[d.admission.request_id] = (i, d.route.decode_id)

    def done(self, rec: RequestRecord) -> None:
        self.live.pop(rec.request_id, None)


@pytest.mark.parametrize("precise", [False, True], ids=["placements", "kv-events"])
def test_without_sharing_each_ledger_sees_only_its_own_half(precise: bool) -> None:
    reqs = workload(500, 20.0, seed=5, prefixes=3)
    g = group(reqs, 2, precise=precise)
    watch = Watch(g)
    ClusterSim(PROFILE, SHAPE, g, "p", kv_event_delay_s=KV_EVENT_DELAY_S if precise else None).run(
        reqs, watch.done
    )
    assert {i for i, *_ in watch.seen} == {0, 1}
    for _, in_flight, view, own, _ in watch.seen:
        assert in_flight == sum(own.values()) and view == own
    assert any(own != everyone for *_, own, everyone in watch.seen)  # there was a half it missed


def test_with_sharing_at_delay_zero_each_ledger_sees_everything_booked_once() -> None:
    reqs = workload(500, 20.0, seed=5, prefixes=3)
    g = group(reqs, 3, share_delay_s=0.0)
    watch = Watch(g)
    ClusterSim(PROFILE, SHAPE, g, "p").run(reqs, watch.done)
    assert {i for i, *_ in watch.seen} == {0, 1, 2}
    for _, in_flight, view, _, everyone in watch.seen:
        # the admitting router's own bookings, shared back to it, would count twice
        assert in_flight == sum(everyone.values()) and view == everyone


def test_with_a_share_delay_a_ledger_misses_only_the_bookings_younger_than_it() -> None:
    reqs = workload(500, 40.0, seed=6)
    delay_s = 0.05
    g = group(reqs, 2, share_delay_s=delay_s)
    admitted: dict[str, float] = {}
    seen: list[tuple[float, int, int, int]] = []

    def hook(i: int, d: Decision) -> None:
        now = d.view.now_s
        young = sum(1 for t in admitted.values() if t > now - delay_s)
        seen.append((now, g.routers[i].ledger.in_flight_requests(), len(admitted), young))
        admitted[d.admission.request_id] = now

    for i, r in enumerate(g.routers):
        r.on_decision = lambda d, i=i: hook(i, d)

    def done(rec: RequestRecord) -> None:
        admitted.pop(rec.request_id, None)

    ClusterSim(PROFILE, SHAPE, g, "p").run(reqs, done)
    # finished requests leave the others' ledgers late too: the ledger may hold a few already done
    assert all(in_flight >= everyone - young for _, in_flight, everyone, young in seen)
    assert any(young and in_flight < everyone for _, in_flight, everyone, young in seen)


@pytest.mark.parametrize(
    ("n", "balancer", "share_delay_s", "precise"),
    [
        (2, "round_robin", None, False),
        (4, "random", 0.01, True),
        (3, "session", None, True),
        (8, "round_robin", 0.0, False),
    ],
)
def test_every_request_ends_in_exactly_one_record(
    n: int, balancer: str, share_delay_s: float | None, precise: bool
) -> None:
    reqs = workload(400, 30.0, seed=n, max_prompt=12_000, prefixes=3)
    g = group(reqs, n, balancer=balancer, share_delay_s=share_delay_s, precise=precise)
    records, _ = simulate(reqs, g, precise)
    assert sorted(r.request_id for r in records) == sorted(r.request_id for r in reqs)
    ok = [r for r in records if r.status is RequestStatus.OK]
    assert sum(g.stats().admissions) == len(ok)
    if share_delay_s is None:  # (with sharing, the last completions' news is still on its way at the end)
        assert all(r.ledger.in_flight_requests() == 0 for r in g.routers)


def test_a_group_run_is_deterministic() -> None:
    reqs = workload(300, 30.0, seed=2, prefixes=3)
    runs = [
        simulate(reqs, group(reqs, 4, balancer="random", share_delay_s=0.01, seed=9))[1] for _ in range(2)
    ]
    assert runs[0] == runs[1]
    other = simulate(reqs, group(reqs, 4, balancer="random", share_delay_s=0.01, seed=10))[1]
    assert other != runs[0]


def _blocks(first: int) -> tuple[int, ...]:
    return (first, first + 1)


@pytest.mark.parametrize(
    ("balancer", "picks", "want"),
    [
        ("round_robin", [(), (), (), (), ()], [0, 1, 2, 0, 1]),
        # without blocks, round-robin; with, the first block's router, whatever follows it
        ("session", [(), _blocks(7), (), (7, 99), ()], None),
    ],
)
def test_the_deterministic_balancers(
    balancer: str, picks: list[tuple[int, ...]], want: list[int] | None
) -> None:
    b = make_balancer(balancer, 3, seed=0)
    got = [b.pick(blocks) for blocks in picks]
    if want is not None:
        assert got == want
    else:
        assert [got[0], got[2], got[4]] == [0, 1, 2] and got[1] == got[3]


def test_session_affinity_keeps_a_first_block_on_one_router_and_spreads_first_blocks() -> None:
    b = SessionAffinity(4)
    firsts = range(1000, 1400)
    routers = {f: b.pick((f, 5)) for f in firsts}
    assert all(b.pick((f, 6, 7)) == routers[f] for f in firsts)
    shares = Counter(routers.values())
    assert set(shares) == {0, 1, 2, 3} and min(shares.values()) > 60  # about 100 each


def test_the_random_balancer_is_seeded_and_about_uniform() -> None:
    a = make_balancer("random", 4, seed=1)
    b = make_balancer("random", 4, seed=1)
    c = make_balancer("random", 4, seed=2)
    seq_a = [a.pick(()) for _ in range(2000)]
    assert seq_a == [b.pick(()) for _ in range(2000)] and seq_a != [c.pick(()) for _ in range(2000)]
    assert all(400 < n < 600 for n in Counter(seq_a).values())


def test_the_balancer_splits_a_run_as_documented() -> None:
    reqs = workload(300, 20.0, seed=4, prefixes=5)
    g = group(reqs, 3, balancer="session")
    decided: dict[str, int] = {}
    for i, r in enumerate(g.routers):
        r.on_decision = lambda d, i=i: decided.__setitem__(d.admission.request_id, i)
    simulate(reqs, g)
    by_first: dict[int, set[int]] = {}
    for spec in reqs:
        if spec.prefix_blocks:
            by_first.setdefault(spec.prefix_blocks[0], set()).add(decided[spec.request_id])
    assert by_first and all(len(routers) == 1 for routers in by_first.values())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"balancer": "least_conn"}, "unknown balancer"),
        ({"share_delay_s": -0.1}, "share_delay_s must be >= 0"),
    ],
)
def test_bad_group_settings_are_config_errors(kwargs: dict[str, object], message: str) -> None:
    routers = [recipe().build(INSTANCES, 0, i, False, False) for i in range(2)]
    with pytest.raises(ConfigError, match=message):
        RouterGroup(routers, **kwargs)  # type: ignore[arg-type]


def test_routers_of_a_group_need_their_own_ledgers_and_the_truth_runs_alone() -> None:
    r = recipe().build(INSTANCES, 0, 0, False, False)
    with pytest.raises(ConfigError, match="ledger of its own"):
        RouterGroup([r, r])
    seer = [recipe("clairvoyant").build(INSTANCES, 0, i, False, False) for i in range(2)]
    with pytest.raises(ConfigError, match="simulator's truth"):
        RouterGroup(seer)


def test_rejected_requests_reach_no_router() -> None:
    reqs = [
        RequestSpec("ok", 0.1, 100, 10, SloClass.LOOSE),
        RequestSpec("long", 0.2, 40_000, 10, SloClass.LOOSE),
        RequestSpec("ok2", 0.3, 100, 10, SloClass.LOOSE),
    ]
    g = group(reqs, 2)
    records, _ = simulate(reqs, g)
    assert {r.request_id: r.status for r in records}["long"] is RequestStatus.REJECTED
    assert g.stats().admissions == (1, 1)
