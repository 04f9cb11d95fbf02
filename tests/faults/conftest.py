"""The fault tests reuse the proxy tests' fresh clusters and in-thread proxies."""

from tests.proxy.conftest import cluster, fresh_cluster, proxy_for

__all__ = ["cluster", "fresh_cluster", "proxy_for"]
