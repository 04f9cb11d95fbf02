"""The proxy's KV-event subscriber: it feeds the prefix index, survives what a stream may send, and falls
back to the router's own placements while a stream is dead, silent or garbled."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
import zmq
from prometheus_client import CollectorRegistry

from calroute.contract.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, encode_batch
from calroute.proxy.kv_events import KvEventSubscriber, PreciseIndex
from calroute.routing.block_hash import block_hashes
from calroute.types import InstanceSpec, Role

SPECS = [InstanceSpec("p0", Role.PREFILL, 16 * 100), InstanceSpec("d0", Role.DECODE, 16 * 100)]


class Harness:
    def __init__(self, **kw: Any) -> None:
        self.pub: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind("tcp://127.0.0.1:*")
        self.endpoint: str = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.registry = CollectorRegistry()
        self.index = PreciseIndex(SPECS, block_tokens=16)
        self.sub = KvEventSubscriber({"p0": self.endpoint}, self.index, self.registry, time.monotonic, **kw)
        self.seq = 0

    def live(self) -> float | None:
        return self.registry.get_sample_value("calroute_kv_events_live", {"engine": "p0"})

    def errors(self, kind: str) -> float:
        v = self.registry.get_sample_value("calroute_kv_events_errors_total", {"engine": "p0", "kind": kind})
        return v or 0.0

    def send(self, payload: bytes, seq: int | None = None, parts: list[bytes] | None = None) -> None:
        if parts is None:
            parts = [b"kv", (self.seq if seq is None else seq).to_bytes(8, "big"), payload]
        self.pub.send_multipart(parts)
        self.seq = (self.seq if seq is None else seq) + 1

    def stored(self, blocks: list[int], seq: int | None = None) -> None:
        self.send(encode_batch([BlockStored(blocks, None, [])], time.time()), seq)

    def rebind(self) -> None:
        self.pub = zmq.Context.instance().socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind(self.endpoint)


async def until(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def run(test: Callable[[Harness], Awaitable[None]], **kw: Any) -> None:
    async def main() -> None:
        h = Harness(**kw)
        h.sub.start()
        try:
            await until(lambda: h.live() == 1.0)
            await asyncio.sleep(0.2)  # PUB/SUB: the subscription reaches the publisher after the connection
            await asyncio.wait_for(test(h), timeout=30)
        finally:
            await h.sub.stop()
            h.pub.close(linger=0)

    asyncio.run(main())


def test_events_feed_the_index_and_live_engines_ignore_placements() -> None:
    async def test(h: Harness) -> None:
        h.stored([1, 2, 3])
        await until(lambda: h.index.match([1, 2, 3]) == {"p0": 48})
        h.send(encode_batch([BlockRemoved([3])], time.time()))
        await until(lambda: h.index.match([1, 2, 3]) == {"p0": 32})
        # while live, the router's placements do not count for p0 (d0 has no stream: they do)
        h.index.placed("p0", [7, 8])
        h.index.placed("d0", [7, 8])
        assert h.index.match([7, 8]) == {"d0": 32}
        h.send(encode_batch([AllBlocksCleared()], time.time()))
        await until(lambda: h.index.blocks_held("p0") == 0)
        # vLLM's newer map layout, bytes hashes folded to the same ints as the int form
        b5 = (5).to_bytes(32, "big")
        h.send(
            msgpack.packb(
                {
                    "ts": 1.0,
                    "events": [
                        {"type": "BlockStored", "block_hashes": [b5, 6], "medium": "GPU"},
                        # another tier: skipped
                        {"type": "BlockStored", "block_hashes": [9], "medium": "CPU"},
                        {"type": "SomethingNew", "x": 1},  # unknown tag: skipped
                    ],
                    "data_parallel_rank": 0,
                }
            )
        )
        await until(lambda: h.index.match([5, 6]) == {"p0": 32})
        assert h.index.match([9]) == {}
        assert h.errors("decode") == h.errors("schema") == h.errors("gap") == 0

    run(test)


def test_garbage_is_counted_and_skipped_and_repeated_garbage_makes_the_stream_stale() -> None:
    async def test(h: Harness) -> None:
        h.stored([1, 2])
        await until(lambda: h.index.blocks_held("p0") == 2)
        h.send(b"\xc1 not msgpack")  # 0xc1 is never used in msgpack
        await until(lambda: h.errors("decode") == 1)
        assert h.live() == 1.0  # one bad message: still live, but its events are lost: view cleared
        assert h.index.blocks_held("p0") == 0
        h.send(msgpack.packb({"ts": 1.0, "events": [{"type": "BlockStored", "block_hashes": "x"}]}))
        h.send(b"", parts=[b"kv", b"short"])
        await until(lambda: h.errors("schema") == 1 and h.errors("frames") == 1)
        assert h.live() == 0.0  # three in a row: stale, placements count again
        h.index.placed("p0", [4])
        assert h.index.match([4]) == {"p0": 16}
        h.stored([1, 2])  # a good message: live again, from an empty view
        await until(lambda: h.live() == 1.0)
        assert h.index.match([1, 2]) == {"p0": 32} and h.index.match([4]) == {}
        assert h.errors("gap") == 0

    run(test)


def test_an_oversized_message_drops_the_connection_which_recovers() -> None:
    async def test(h: Harness) -> None:
        h.stored([1])
        await until(lambda: h.index.blocks_held("p0") == 1)
        h.send(b"\x00" * 8192)  # over max_message_bytes: libzmq drops the connection rather than read it
        await until(lambda: h.errors("disconnect") >= 1)
        await until(lambda: h.live() == 1.0)  # reconnected: live again, view cleared (events were missed)
        assert h.index.blocks_held("p0") == 0
        await asyncio.sleep(0.2)
        h.stored([2])
        await until(lambda: h.index.match([2]) == {"p0": 16})

    run(test, max_message_bytes=4096)


def test_a_seq_gap_clears_the_view_then_applies_the_batch() -> None:
    async def test(h: Harness) -> None:
        h.stored([1, 2])
        await until(lambda: h.index.blocks_held("p0") == 2)
        h.stored([3], seq=h.seq + 4)
        await until(lambda: h.errors("gap") == 1)
        assert h.index.match([1, 2]) == {} and h.index.match([3]) == {"p0": 16}
        assert h.live() == 1.0

    run(test)


def test_a_dead_stream_falls_back_to_placements_and_recovers_on_reconnect() -> None:
    async def test(h: Harness) -> None:
        h.stored([1, 2])
        await until(lambda: h.index.blocks_held("p0") == 2)
        h.pub.close(linger=0)  # the engine died
        await until(lambda: h.live() == 0.0)
        assert h.errors("disconnect") == 1
        h.index.placed("p0", [1, 2, 3])  # stale: the router's own placements stand in
        assert h.index.match([1, 2, 3]) == {"p0": 48}
        h.rebind()  # the engine is back (with an empty cache)
        await until(lambda: h.live() == 1.0)
        assert h.index.blocks_held("p0") == 0
        await asyncio.sleep(0.2)
        h.stored([5], seq=0)
        await until(lambda: h.index.match([5]) == {"p0": 16})

    run(test)


def test_a_silent_stream_goes_stale_when_events_are_owed() -> None:
    async def test(h: Harness) -> None:
        await asyncio.sleep(0.4)  # idle and silent: nothing owed, still live
        assert h.live() == 1.0
        h.sub.expect("p0")
        await until(lambda: h.live() == 0.0)
        assert h.errors("silent") == 1
        h.stored([1])
        await until(lambda: h.live() == 1.0)

    run(test, silence_timeout_s=0.2)


def test_something_not_zmq_at_the_endpoint_never_makes_the_stream_live() -> None:
    async def main() -> None:
        async def babble(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"HTTP/1.1 200 OK\r\n\r\n" + b"\xff" * 4096)
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(babble, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        registry = CollectorRegistry()
        index = PreciseIndex(SPECS, block_tokens=16)
        sub = KvEventSubscriber({"p0": f"tcp://127.0.0.1:{port}"}, index, registry, time.monotonic)
        sub.start()
        try:
            await asyncio.sleep(1.0)
            assert registry.get_sample_value("calroute_kv_events_live", {"engine": "p0"}) == 0.0
            index.placed("p0", [1])  # the router's placements stand in
            assert index.match([1]) == {"p0": 16}
        finally:
            await sub.stop()
            server.close()
            await server.wait_closed()

    asyncio.run(main())


def test_real_vllms_hashes_are_translated_into_the_routers() -> None:
    """With translate_hashes (real vLLM), the index holds the router's hashes of what the events' tokens
    say, whatever vLLM's own hashes are: a prompt the proxy hashes matches where the engine would hit."""
    prompt = list(range(1000, 1000 + 3 * 16 + 5))
    own = block_hashes(prompt, 16)

    def stored(hashes: list[Any], parent: Any, first: int, **extra: Any) -> dict[str, Any]:
        tokens = prompt[first * 16 : (first + len(hashes)) * 16]
        return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
                "token_ids": tokens, "block_size": 16, "lora_id": None, "medium": "GPU",
                "lora_name": None, "group_idx": 0, **extra}  # fmt: skip

    def skipped(h: Harness, reason: str) -> float:
        v = h.registry.get_sample_value(
            "calroute_kv_events_skipped_blocks_total", {"engine": "p0", "reason": reason}
        )
        return v or 0.0

    def batch(*events: dict[str, Any]) -> bytes:
        payload: bytes = msgpack.packb([time.time(), list(events), 0], use_bin_type=True)
        return payload

    vllm = [b"\xaa" * 32, b"\xbb" * 32, b"\xcc" * 32]  # sha256-sized, as vLLM's default

    async def test(h: Harness) -> None:
        h.send(batch(stored(vllm[:2], None, 0)))
        await until(lambda: h.index.match(own) == {"p0": 32})
        h.send(batch(stored(vllm[2:], vllm[1], 2)))  # chained on block 1, one step later
        await until(lambda: h.index.match(own) == {"p0": 48})
        h.send(batch({"type": "BlockRemoved", "block_hashes": [vllm[2]], "medium": "GPU"}))
        await until(lambda: h.index.match(own) == {"p0": 32})
        # a parent never seen: skipped, counted, nothing placed
        h.send(batch(stored([b"\xdd" * 32], b"\xee" * 32, 2)))
        await until(lambda: skipped(h, "unknown_parent") == 1)
        assert h.index.blocks_held("p0") == 2
        # blocks the engine hashed with a cache salt would not hit a plain prompt
        h.send(batch(stored([b"\x01" * 32], None, 0, extra_keys=[["salt"]])))
        await until(lambda: skipped(h, "keyed") == 1)
        h.send(batch({"type": "AllBlocksCleared"}))
        await until(lambda: h.index.blocks_held("p0") == 0)
        h.send(batch(stored(vllm[2:], vllm[1], 2)))  # the clear forgot the translations too
        await until(lambda: skipped(h, "unknown_parent") == 2)
        assert h.index.blocks_held("p0") == 0 and h.live() == 1.0
        assert h.errors("schema") == h.errors("decode") == h.errors("gap") == 0

    run(test, translate_hashes=True)


def test_each_batchs_delay_from_its_ts_is_measured() -> None:
    # a batch stamped 0.3 s ago (the publisher's wall clock) and one with no usable ts: one observation, of
    # at least 0.3 s; what the simulator's --kv-event-delay-s stands for
    async def test(h: Harness) -> None:
        h.send(encode_batch([BlockStored([1], None, [])], time.time() - 0.3))
        h.send(msgpack.packb([None, [["BlockStored", [2], None, [], 16, None, "GPU", None]], 0]))
        await until(lambda: h.index.match([2]) == {"p0": 16})
        count = h.registry.get_sample_value("calroute_kv_events_delay_seconds_count")
        total = h.registry.get_sample_value("calroute_kv_events_delay_seconds_sum")
        assert count == 1 and total is not None and 0.3 <= total < 5.0

    run(test)
