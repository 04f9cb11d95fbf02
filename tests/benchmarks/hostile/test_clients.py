"""The attack benchmark's attacker (benchmarks/hostile/clients.py) against a proxy in process: what it
counts, and that every garbage head it sends gets a 4xx answer or the close, never a 2xx, a 5xx or
silence."""

from __future__ import annotations

import asyncio
from pathlib import Path

from benchmarks.hostile import clients
from calroute.aio import run
from calroute.proxy.config import ClientLimits
from tests.proxy.fakes import FakeCluster, ProxyOnFakes


def test_status_reads_an_answer_or_says_other() -> None:
    assert clients._status(b"HTTP/1.1 408 Request Timeout\r\n") == "408"
    assert clients._status(b"\x15\x03\x01") == "other"


def test_garbage_heads_get_a_4xx_or_the_close(tmp_path: Path) -> None:
    async def go() -> dict[str, int]:
        # Short deadlines: a head cut short gets its 408 soon; so much as empty lines (only CRLFs, which
        # RFC 9112 2.2 lets a server skip before a request) are an idle connection, closed without an answer.
        async with ProxyOnFakes(
            FakeCluster(1, 1),
            tmp_path,
            client_limits=ClientLimits(head_timeout_s=0.3, keepalive_timeout_s=0.3),
        ) as p:
            tally = clients.Tally()
            stop_at = asyncio.get_running_loop().time() + 1.5
            await asyncio.gather(
                *(clients._garbage_worker(p.port, seed, stop_at, tally) for seed in range(2))
            )
            assert not p.records()  # none reached a route that records
            return dict(tally.counts)

    counts = run(go())
    sent = counts.pop("garbage.sent")
    assert sent >= 4 and sum(counts.values()) == sent, counts
    outcomes = {k.removeprefix("garbage.") for k in counts}
    assert all(o == "closed" or o.startswith("answered_4") for o in outcomes), counts
