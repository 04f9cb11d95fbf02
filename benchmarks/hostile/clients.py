"""The attacker of benchmarks/attack.py (its own process: its work does not slow the load generator's loop):
slow-head, slow-body and large-body connections held open for the whole attack, each opened again whenever
the proxy closes it, and garbage request heads on fresh connections. ``attack`` returns its counts."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import Callable

SLOW_HEADS = 300
SLOW_BODIES = 100
LARGE_BODIES = 25
GARBAGE_WORKERS = 4
GARBAGE_GAP_S = 0.1  # per worker: about 40 garbage heads a second in all
TICK_S = 1.0  # a slow client's byte (slow body) or header line (slow head) every second
LARGE_BODY_BYTES = 8 * 1024 * 1024 - 1024  # just under the proxy's 8 MiB body limit
CHUNK_BYTES = 256 * 1024
RECONNECT_GAP_S = 0.5  # after the proxy closed an attacking connection, before opening it again


class Tally:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def add(self, kind: str, what: str) -> None:
        self.counts[f"{kind}.{what}"] += 1


async def _answer_or_close(reader: asyncio.StreamReader, wait_s: float) -> bytes | None:
    """What the proxy sent within ``wait_s``: None if nothing (the connection is still open), b"" if it
    closed the connection, else the bytes of its answer (read to the close, at most 64 KiB)."""
    try:
        first = await asyncio.wait_for(reader.read(65536), wait_s)
    except TimeoutError:
        return None
    except ConnectionError:
        return b""
    if not first:
        return b""
    with contextlib.suppress(TimeoutError, ConnectionError):
        first += await asyncio.wait_for(reader.read(65536), 1.0)
    return first


def _status(answer: bytes) -> str:
    parts = answer.split(b" ", 2)
    return parts[1].decode(errors="replace") if len(parts) > 1 and parts[0].startswith(b"HTTP/") else "other"


async def _hold(
    port: int, kind: str, head: bytes, first: bytes, tick: bytes | None, stop_at: float, tally: Tally
) -> None:
    """One attacking connection, opened again whenever the proxy closes it, until ``stop_at``: ``head``
    and ``first`` sent at once, then ``tick`` every TICK_S (None: nothing more)."""
    loop = asyncio.get_running_loop()
    while loop.time() < stop_at:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5.0)
        except (OSError, TimeoutError):
            tally.add(kind, "connect_failed")
            await asyncio.sleep(RECONNECT_GAP_S)
            continue
        tally.add(kind, "opened")
        try:
            writer.write(head)
            view = memoryview(first)
            for at in range(0, len(view), CHUNK_BYTES):  # in pieces: no copy of a large body in the buffer
                writer.write(view[at : at + CHUNK_BYTES])
                await asyncio.wait_for(writer.drain(), max(0.1, stop_at - loop.time()))
            while loop.time() < stop_at:
                answer = await _answer_or_close(reader, min(TICK_S, max(0.01, stop_at - loop.time())))
                if answer is not None:
                    tally.add(kind, f"answered_{_status(answer)}" if answer else "closed_by_proxy")
                    break
                if tick is not None:
                    writer.write(tick)
                    await asyncio.wait_for(writer.drain(), max(0.1, stop_at - loop.time()))
        except (ConnectionError, TimeoutError):
            tally.add(kind, "closed_by_proxy")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)
        await asyncio.sleep(RECONNECT_GAP_S)


def _garbage(rng: random.Random) -> bytes:
    """One malformed request head. Those that parse go to a path that is no route: no record."""
    choices: list[Callable[[], bytes]] = [
        lambda: rng.randbytes(rng.randint(1, 600)),
        lambda: b"POST /x HTTP/1.1\r\nHost: x\r\n" + rng.randbytes(200) + b"\r\n\r\n",
        lambda: b"POST /x HTTP/1.1\r\nno colon here\r\n\r\n",
        lambda: b"POST /x HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
        lambda: b"POST /x HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\n",
        lambda: b"POST /x HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
        lambda: b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        lambda: b"POST /x HTTP/1.1\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
        lambda: b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n",
        lambda: b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + rng.randbytes(64),  # a TLS hello
        lambda: b"\r\n" * 2000,
        lambda: b"POST /x HTTP/9.9\r\nHost: \x00\x01\x02\r\n\r\n",
    ]
    return rng.choice(choices)()


async def _garbage_worker(port: int, seed: int, stop_at: float, tally: Tally) -> None:
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    while loop.time() < stop_at:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5.0)
        except (OSError, TimeoutError):
            tally.add("garbage", "connect_failed")
            await asyncio.sleep(GARBAGE_GAP_S)
            continue
        tally.add("garbage", "sent")
        try:
            writer.write(_garbage(rng))
            await asyncio.wait_for(writer.drain(), 2.0)
            answer = await _answer_or_close(reader, 2.0)
            tally.add(
                "garbage",
                "no_answer" if answer is None else f"answered_{_status(answer)}" if answer else "closed",
            )
        except (ConnectionError, TimeoutError):
            tally.add("garbage", "closed")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)
        await asyncio.sleep(GARBAGE_GAP_S)


async def attack(port: int, duration_s: float) -> dict[str, int]:
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + duration_s
    tally = Tally()
    head = b"POST /v1/completions HTTP/1.1\r\nHost: calroute\r\nContent-Type: application/json\r\n"
    big = b"x" * (LARGE_BODY_BYTES - 1)
    tasks = [
        *(
            _hold(port, "slow_head", head, b"", b"X-Slow: %d\r\n" % i, stop_at, tally)
            for i in range(SLOW_HEADS)
        ),
        *(
            _hold(port, "slow_body", head + b"Content-Length: 1000000\r\n\r\n", b"{", b" ", stop_at, tally)
            for _ in range(SLOW_BODIES)
        ),
        *(
            _hold(
                port,
                "large_body",
                head + b"Content-Length: %d\r\n\r\n" % LARGE_BODY_BYTES,
                big,
                None,
                stop_at,
                tally,
            )
            for _ in range(LARGE_BODIES)
        ),
        *(_garbage_worker(port, seed, stop_at, tally) for seed in range(GARBAGE_WORKERS)),
    ]
    await asyncio.gather(*tasks)
    return dict(sorted(tally.counts.items()))
