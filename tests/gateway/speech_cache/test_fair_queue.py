"""The warm-up queue served round-robin by tenant, bounded per tenant and in all."""

from __future__ import annotations

import pytest

from gateway.speech_cache.fair_queue import FairQueue


def test_tenants_are_served_in_turn() -> None:
    queue: FairQueue[str] = FairQueue(per_tenant=100, total=1000)
    for i in range(50):
        assert queue.push("flood", f"f{i}")
    queue.push("acme", "a0")
    queue.push("acme", "a1")
    queue.push("other", "o0")
    served = [queue.pop() for _ in range(6)]
    assert served == ["f0", "a0", "o0", "f1", "a1", "f2"]
    assert len(queue) == 47 and queue.queued("flood") == 47


def test_bounds_per_tenant_and_in_all() -> None:
    queue: FairQueue[int] = FairQueue(per_tenant=3, total=5)
    assert [queue.push("a", i) for i in range(4)] == [True, True, True, False]
    assert queue.push("b", 10) and queue.push("b", 11)
    assert not queue.push("c", 20)  # the queue is full
    assert queue.pop() == 0 and queue.push("c", 20)


def test_remove_takes_that_very_item_out() -> None:
    queue: FairQueue[list[int]] = FairQueue(per_tenant=10, total=10)
    first, twin = [1], [1]  # equal, not the same
    queue.push("a", first)
    queue.push("a", twin)
    assert queue.remove("a", twin) and not queue.remove("a", twin)
    assert queue.pop() is first and queue.pop() is None
    assert not queue.remove("nobody", first)


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError):
        FairQueue(per_tenant=0, total=1)
