"""A request its decode engine prefills itself (RouteDecision.local): one request on one engine, its
computed prompt tokens pending there until its prefill is done, nothing on the prefill pool."""

from __future__ import annotations

import pytest

from calroute.costmodel.profiles import get_profile
from calroute.errors import ConfigError
from calroute.routing.ledger import Ledger
from calroute.types import InstanceSpec, InstanceState, Role, RouteDecision, local_decision

CAL = get_profile("a40-qwen2.5-3b").calibration


def ledger() -> Ledger:
    return Ledger([InstanceSpec("p0", Role.PREFILL, 60_000), InstanceSpec("d0", Role.DECODE, 60_000)], CAL)


def states(led: Ledger, now_s: float) -> tuple[InstanceState, InstanceState]:
    view = led.view(now_s)
    return view.prefill[0], view.decode[0]


@pytest.mark.parametrize(
    ("events", "in_flight", "pending_prefill", "committed"),
    [
        ((), 1, 1_000 - 512, 1_000 + 100),
        (("first_token",), 1, 0, 1_000 + 100),
        (("prefill_done",), 1, 0, 1_000 + 100),
        (("first_token", "done"), 0, 0, 0),
        (("done",), 0, 0, 0),  # failed before its first token
    ],
)
def test_a_local_request_is_one_request_on_its_decode_engine(
    events: tuple[str, ...], in_flight: int, pending_prefill: int, committed: int
) -> None:
    led = ledger()
    led.admit("r", "d0", "d0", 1_000, 100, 0.0, cached_tokens=512, local=True)
    for i, event in enumerate(events, start=1):
        if event == "done":
            led.done("r", float(i), 100, ok=True)
        else:
            getattr(led, event)("r", float(i))
    pre, dec = states(led, 10.0)
    assert (pre.in_flight, pre.pending_prefill_tokens, pre.kv_committed_tokens) == (0, 0, 0)
    assert (dec.in_flight, dec.pending_prefill_tokens, dec.kv_committed_tokens) == (
        in_flight,
        pending_prefill,
        committed,
    )
    assert dec.active_tokens == (1_000 if in_flight else 0)


def test_a_local_prefill_runs_on_a_decode_engine_only() -> None:
    with pytest.raises(ConfigError, match="not one"):
        ledger().admit("r", "p0", "p0", 1_000, 100, 0.0, local=True)


def test_a_local_decision_names_its_decode_engine_twice() -> None:
    d = local_decision("d0", "cheaper")
    assert (d.prefill_id, d.decode_id, d.local, d.reason) == ("d0", "d0", True, "cheaper")
    with pytest.raises(ValueError, match="decode engine"):
        RouteDecision("p0", "d0", local=True)
