"""Run a proxy in a background thread with its own event loop, for tests that talk to it over HTTP."""

from __future__ import annotations

import asyncio
import threading
from types import TracebackType

from calroute.cli.common import load_tokenizer
from calroute.contract.tokenizer import AsyncTokenizer, Tokenizer
from calroute.emulator.api import EmulatorTokenizer
from calroute.proxy.app import Proxy
from calroute.proxy.config import ProxyConfig

EMULATOR = EmulatorTokenizer()
FROM_CLUSTER = "the tokenizer the cluster file names"


class RunningProxy:
    """The proxy with the tokenizer its cluster file names, as `calroute serve` builds it, unless told
    otherwise (``tokenizer=None``: none)."""

    def __init__(
        self, cfg: ProxyConfig, tokenizer: Tokenizer | AsyncTokenizer | None | str = FROM_CLUSTER
    ) -> None:
        chosen = load_tokenizer(cfg.cluster) if isinstance(tokenizer, str) else tokenizer
        self.proxy = Proxy(cfg, chosen)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._started = False
        self.url = ""
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("proxy did not start")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()

    async def _start(self) -> None:
        port = await self.proxy.start("127.0.0.1", 0)
        self._started = True
        self.url = f"http://127.0.0.1:{port}"

    def call(self, fn: object) -> None:
        """Run a plain callable on the proxy's loop (to mutate its state safely)."""
        self._loop.call_soon_threadsafe(fn)  # type: ignore[arg-type]

    def stop(self) -> None:
        async def shutdown() -> None:
            if self._started:
                await self.proxy.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=15)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> RunningProxy:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
