"""The emulator's KV-event publisher: vLLM's ``--kv-events-config`` on vLLM's transport and wire format
(contract/kv_events.py encodes the batches).

vLLM (vllm/distributed/kv_events.py, ZmqEventPublisher) sends each engine step's events as one ZMQ PUB
message of three frames: the topic, an 8-byte big-endian sequence number counting from 0, and a msgpack
``EventBatch``. The emulator's block hashes are 64-bit integers (contract/blocks.block_hashes, not vLLM's
sha256: an index fed by the emulator only matches prompts hashed by the same function).

Sending happens on the engine's event loop: a PUB socket never blocks (past its high-water mark it drops,
as vLLM's does), so no thread is needed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import zmq

from calroute.contract.kv_events import KvEvent, encode_batch


class ZmqPublisher:
    """One engine's PUB socket: bound at ``endpoint``, or connected to a subscriber bound there."""

    def __init__(self, endpoint: str, bind: bool, topic: str = "", hwm: int = 100_000) -> None:
        self._sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)
        self._sock.setsockopt(zmq.SNDHWM, hwm)
        self._sock.setsockopt(zmq.LINGER, 0)
        if bind:
            self._sock.bind(endpoint)
            # the address subscribers connect to (a wildcard port resolved)
            self.endpoint: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        else:
            self._sock.connect(endpoint)
            self.endpoint = endpoint
        self._topic = topic.encode()
        self._seq = 0
        self.dropped = 0

    def publish(self, events: Sequence[KvEvent]) -> None:
        if not events:
            return
        payload = encode_batch(events, time.time())
        try:
            self._sock.send_multipart([self._topic, self._seq.to_bytes(8, "big"), payload], zmq.NOBLOCK)
        except zmq.Again:
            # PUB drops at its high-water mark rather than block; counted, and the seq still advances so
            # subscribers see the gap.
            self.dropped += 1
        self._seq += 1

    def close(self) -> None:
        self._sock.close(linger=0)
