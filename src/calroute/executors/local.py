"""The local executor: inline for one worker, a process pool for more."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ProcessPoolExecutor, wait
from typing import TypeVar

from calroute.executors.base import Closing

T = TypeVar("T")
R = TypeVar("R")


class LocalExecutor(Closing):
    kind = "local"

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or os.cpu_count() or 1
        self._pool: ProcessPoolExecutor | None = None

    def _get_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # spawn, not fork: the parent may hold threads (progress bars, an event loop) that fork would
            # copy mid-state; a spawned worker imports calroute afresh, once per pool.
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
        return self._pool

    def map(
        self,
        fn: Callable[[T], R],
        items: Sequence[T],
        on_result: Callable[[int, R], None] | None = None,
    ) -> list[R]:
        if self.workers == 1 or len(items) <= 1:
            out = []
            for i, item in enumerate(items):
                r = fn(item)
                if on_result is not None:
                    on_result(i, r)
                out.append(r)
            return out
        pool = self._get_pool()
        futures: dict[Future[R], int] = {pool.submit(fn, item): i for i, item in enumerate(items)}
        results: dict[int, R] = {}
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_EXCEPTION)
                for f in sorted(done, key=futures.__getitem__):
                    r = f.result()  # re-raises the item's exception here
                    results[futures[f]] = r
                    if on_result is not None:
                        on_result(futures[f], r)
        finally:
            for f in pending:
                f.cancel()
        return [results[i] for i in range(len(items))]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
