import gc
import time
from collections.abc import Iterator

import pytest

from engine.ipc.heap import freeze_startup_heap


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """An unfrozen heap for the test; frozen again after it if it was (tests/conftest.py
    freezes the test process's heap after collection)."""
    was_frozen = gc.get_freeze_count() > 0
    gc.unfreeze()
    yield
    gc.unfreeze()
    if was_frozen:
        gc.freeze()


def full_collection_s() -> float:
    started = time.perf_counter()
    gc.collect()
    return time.perf_counter() - started


def test_a_frozen_heap_is_not_walked_by_later_collections(unfrozen: None) -> None:
    long_lived = [{"n": i, "peer": [i]} for i in range(200_000)]  # what imports leave
    before = min(full_collection_s() for _ in range(3))
    frozen = freeze_startup_heap("the test's start-up")
    after = min(full_collection_s() for _ in range(3))
    assert frozen >= 400_000 and gc.get_freeze_count() == frozen
    assert after < before / 5, (before, after)
    assert len(long_lived) == 200_000  # frozen objects stay alive and usable


def test_freezing_again_adds_what_was_loaded_since(unfrozen: None) -> None:
    first = freeze_startup_heap("start-up")
    lazily_loaded = [[i] for i in range(10_000)]
    second = freeze_startup_heap("the VAD model")
    assert second >= first + 10_000
    assert lazily_loaded[-1] == [9_999]
