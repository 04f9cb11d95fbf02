"""Where independent pieces of work run: in this process, in a local process pool, or on Ray.

One contract (``Executor.map``): a picklable module-level function over a sequence of picklable items,
results returned in the items' order whatever order they finish in. Work items carry their own seeds, so
the same items give the same results on every executor and any number of workers (a test holds each
executor to it). ``on_result`` is called in this process as each result arrives, for progress bars.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Protocol, TypeVar

from calroute.errors import ConfigError

T = TypeVar("T")
R = TypeVar("R")

EXECUTORS = ("local", "ray")


class Executor(Protocol):
    kind: str
    workers: int

    def map(
        self,
        fn: Callable[[T], R],
        items: Sequence[T],
        on_result: Callable[[int, R], None] | None = None,
    ) -> list[R]:
        """``[fn(x) for x in items]``, run on the executor's workers; the first exception raised by any
        item is raised here (the remaining items are cancelled where the executor can)."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Executor: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


def make_executor(kind: str = "local", workers: int | None = None, address: str | None = None) -> Executor:
    """``local``: ``workers`` processes (default: the machine's cores; 1 runs inline, without a pool).
    ``ray``: starts a local Ray instance with ``workers`` CPUs, or joins the cluster at ``address``."""
    if workers is not None and workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")
    if kind == "local":
        if address is not None:
            raise ConfigError("--address is for --executor ray; the local executor has no address")
        from calroute.executors.local import LocalExecutor

        return LocalExecutor(workers)
    if kind == "ray":
        try:
            # imported here, not above: calroute.executors.ray imports ray, an optional extra
            from calroute.executors.ray import RayExecutor
        except ImportError as e:
            raise ConfigError(
                f"--executor ray needs Ray, an optional extra: pip install 'calroute[ray]' ({e})"
            ) from e
        return RayExecutor(workers, address)
    raise ConfigError(f"unknown executor {kind!r}; known: {', '.join(EXECUTORS)}")


__all__ = ["EXECUTORS", "Executor", "make_executor"]
