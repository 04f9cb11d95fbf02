"""The Ray executor: a local Ray instance started for the job, or an existing cluster joined by address.

Items run as Ray tasks, at most ``workers`` at a time (on a joined cluster, the cluster's CPUs by default);
results come back in the items' order like every executor's. The work functions must be importable on the
workers: a local instance inherits this process's environment (PYTHONPATH, working directory); a joined
cluster needs calroute installed on its nodes (and trace files at the same paths).

Ray listens on every interface even when started locally (it refuses the loopback address, to stay
reachable by other nodes); Ray 2.60 protects such a cluster with a token that ``ray.init`` creates.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import ray
from ray.exceptions import RayTaskError

from calroute.errors import ConfigError
from calroute.executors.base import Closing

T = TypeVar("T")
R = TypeVar("R")

# How long a joined cluster's address gets to accept a TCP connection before we call it unreachable:
# ray.init on a dead address retries for a minute or more before failing.
PROBE_TIMEOUT_S = 3.0
# The object store holds only items and results (kilobytes each): Ray's default (30 % of RAM) would
# reserve gigabytes of a machine other jobs share.
LOCAL_OBJECT_STORE_BYTES = 128 * 1024 * 1024


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (a cluster's GCS, as ``ray start --head`` prints it) or ``ray://HOST:PORT`` (its
    Ray Client server)."""
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--address must be HOST:PORT or ray://HOST:PORT, got {address!r}")
    return host.strip("[]"), int(port)


def probe_address(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """A ConfigError naming ``address`` unless something accepts a TCP connection there within
    ``timeout_s``."""
    host, port = parse_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as e:
        raise ConfigError(
            f"--address {address}: no Ray cluster answers there within {timeout_s:g} s ({e})"
        ) from e


class RayExecutor(Closing):
    kind = "ray"

    def __init__(self, workers: int | None = None, address: str | None = None) -> None:
        if address is not None:
            probe_address(address)
        # A driver left connected by someone else in this process would make ray.init fail or, worse,
        # send our tasks to their cluster.
        if ray.is_initialized():
            raise ConfigError("Ray is already initialized in this process; close the other executor first")
        # Ray's own loggers print start-up notices and warnings (token authentication, the usage-stats
        # prompt) that say nothing about the job; errors still show.
        quiet: dict[str, Any] = dict(logging_level=logging.ERROR, log_to_driver=False)
        if address is None:
            self.workers = workers or os.cpu_count() or 1
            ray.init(
                # "local": a new instance even when RAY_ADDRESS names a cluster (joining is --address's job)
                address="local",
                num_cpus=self.workers,
                include_dashboard=False,
                object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                **quiet,
            )
        else:
            try:
                ray.init(address=address, **quiet)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise ConfigError(f"--address {address}: could not join a Ray cluster there ({e})") from e
            # ray.cluster_resources has no annotations (a dict of resource name to amount)
            cpus = ray.cluster_resources().get("CPU", 1)  # type: ignore[no-untyped-call]
            self.workers = workers or max(1, int(cpus))
        self.address = address
        self._open = True

    def map(
        self,
        fn: Callable[[T], R],
        items: Sequence[T],
        on_result: Callable[[int, R], None] | None = None,
    ) -> list[R]:
        if not self._open:
            raise RuntimeError("the Ray executor is closed")
        # max_retries=0: an item that kills its worker is an error to report, not to run again.
        task = ray.remote(num_cpus=1, max_retries=0)(fn)
        index: dict[ray.ObjectRef[R], int] = {}
        results: dict[int, R] = {}
        next_item = 0
        try:
            while len(results) < len(items):
                # At most `workers` in flight: on a joined cluster, --workers is the share of it this job
                # takes; locally the CPUs Ray was started with already bound it.
                while next_item < len(items) and len(index) < self.workers:
                    index[task.remote(items[next_item])] = next_item
                    next_item += 1
                [ref], _ = ray.wait(list(index), num_returns=1)
                i = index.pop(ref)
                try:
                    r: R = ray.get(ref)
                except RayTaskError as e:
                    # The item's own exception, as the caller would have seen it on the local executor
                    # (RayTaskError wraps it; its cause is the original, when it could be pickled).
                    if isinstance(e.cause, Exception):
                        raise e.cause from e
                    raise
                results[i] = r
                if on_result is not None:
                    on_result(i, r)
        finally:
            for ref in index:
                ray.cancel(ref, force=True)
        return [results[i] for i in range(len(items))]

    def close(self) -> None:
        """Disconnect; a Ray instance this executor started stops with it (its raylet, GCS and workers)."""
        if self._open:
            self._open = False
            ray.shutdown()
