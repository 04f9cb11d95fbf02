from __future__ import annotations

import pytest

from calroute.errors import ConfigError
from calroute.executors import make_executor


def _square(x: int) -> int:
    return x * x


def _fail_on_three(x: int) -> int:
    if x == 3:
        raise ValueError("three")
    return x


@pytest.mark.parametrize("workers", [1, 2])
def test_map_returns_results_in_item_order(workers: int) -> None:
    seen: list[int] = []
    with make_executor("local", workers) as ex:
        assert ex.map(_square, list(range(7)), on_result=lambda i, r: seen.append(i)) == [
            x * x for x in range(7)
        ]
    assert sorted(seen) == list(range(7))


@pytest.mark.parametrize("workers", [1, 2])
def test_an_items_exception_reaches_the_caller(workers: int) -> None:
    with make_executor("local", workers) as ex, pytest.raises(ValueError, match="three"):
        ex.map(_fail_on_three, [1, 2, 3, 4])


@pytest.mark.parametrize(
    ("kind", "workers", "address", "message"),
    [
        ("threads", None, None, "unknown executor 'threads'"),
        ("local", 0, None, "--workers must be >= 1"),
        ("local", 2, "10.0.0.1:6379", "--address is for --executor ray"),
    ],
)
def test_bad_executor_settings_are_named(
    kind: str, workers: int | None, address: str | None, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        make_executor(kind, workers, address)
