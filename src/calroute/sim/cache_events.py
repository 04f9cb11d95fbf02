"""What a simulated engine's cache tells the router: vLLM's KV events, as the engine publishes them.

The engines' caches are ``kvcache.BlockPool``s, the emulator's model too. vLLM's engine core takes the block
pool's events once per step and publishes them after it (the scheduler collects them as it schedules), so a
prefill engine's events here wait for the end of the iteration that caused them; a decode engine caches a
prompt when its pull is done, between steps, and says so at once. The simulator then delays each by the
KV-event delay it is given (simulator.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

# (stored, blocks): True for BlockStored, False for BlockRemoved
CacheListener = Callable[[bool, tuple[int, ...]], None]


class CacheEvents:
    """A pool's listener (kvcache.PoolListener) that hands its events to ``listener``, at once or, while
    ``buffering``, when ``flush`` is called."""

    __slots__ = ("listener", "buffering", "_pending")

    def __init__(self, listener: CacheListener, buffering: bool = False) -> None:
        self.listener = listener
        self.buffering = buffering
        self._pending: list[tuple[bool, tuple[int, ...]]] = []

    def stored(
        self, hashes: list[int], parent: int | None, first_block: int, tokens: Sequence[int] | None
    ) -> None:
        self._say(True, tuple(hashes))

    def removed(self, hashes: list[int]) -> None:
        self._say(False, tuple(hashes))

    def cleared(self) -> None:  # the simulator never resets a cache mid-run
        pass

    def _say(self, stored: bool, blocks: tuple[int, ...]) -> None:
        if self.buffering:
            self._pending.append((stored, blocks))
        else:
            self.listener(stored, blocks)

    def flush(self) -> None:
        if self._pending:
            pending = self._pending
            self._pending = []
            for stored, blocks in pending:
                self.listener(stored, blocks)
