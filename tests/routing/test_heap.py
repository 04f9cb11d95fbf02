"""The shared min-heap: both implementations pop in (key, order) order, interleaved with pushes."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from calroute.routing.heap import Entry, MinHeap

# A push (key) or a pop (None); keys from a small set, so ties are common and order must break them.
_OPS = st.lists(st.one_of(st.none(), st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 1e9])), max_size=200)


@pytest.mark.parametrize("written", [False, True])
@given(ops=_OPS)
def test_pops_follow_key_then_order_like_a_sorted_list(written: bool, ops: list[float | None]) -> None:
    heap = MinHeap(written)
    reference: list[tuple[float, int]] = []
    popped: list[tuple[float, int, object]] = []
    expected: list[tuple[float, int]] = []
    for n, key in enumerate(ops):
        if key is None:
            if reference:
                reference.sort()
                expected.append(reference.pop(0))
                e = heap.pop()
                popped.append((e.key, e.order, e.item))
            continue
        reference.append((key, n))
        heap.push(Entry(key, n, f"item-{n}"))
        assert len(heap) == len(reference)
        assert heap.top_key() == min(reference)[0]
    assert [(k, o) for k, o, _ in popped] == expected
    assert all(item == f"item-{o}" for _, o, item in popped)


@pytest.mark.parametrize("written", [False, True])
def test_an_empty_heap_has_an_infinite_top_key_and_refuses_a_pop(written: bool) -> None:
    heap = MinHeap(written)
    assert len(heap) == 0 and heap.top_key() == math.inf
    heap.push(Entry(3.0, 0))
    assert heap.pop().key == 3.0
    assert heap.top_key() == math.inf
    with pytest.raises(IndexError):
        heap.pop()
