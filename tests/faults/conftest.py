"""The fault tests reuse the proxy tests' fresh clusters and in-thread proxies."""

from tests.proxy.conftest import fresh_cluster, proxy_for

__all__ = ["fresh_cluster", "proxy_for"]
