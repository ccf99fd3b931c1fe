"""The in-process level: LRU within a byte budget."""

from __future__ import annotations

from engine.speech_cache import CachedSegment
from engine.speech_cache.memory import MemoryLevel
from tests.engine.speech_cache.conftest import make_segment


def test_lru_evicts_least_recently_used_within_budget() -> None:
    seg = make_segment(0.5)  # 24 kB of PCM
    level = MemoryLevel(budget_bytes=3 * seg.size() + 10)
    for name in ("a", "b", "c"):
        assert level.put(name * 64, "", seg)
    assert level.usage() == (3, 3 * seg.size(), 0)
    assert level.get("a" * 64) is seg  # "a" is now the most recently used
    assert level.put("d" * 64, "", seg)  # evicts "b", the least recently used
    assert level.contains("a" * 64) and not level.contains("b" * 64)
    assert level.contains("c" * 64) and level.contains("d" * 64)
    entries, size, evictions = level.usage()
    assert (entries, evictions) == (3, 1) and size <= level.budget_bytes
    # A larger segment evicts as many as it needs, oldest first.
    big = make_segment(0.9)
    assert level.put("e" * 64, "", big)
    entries, size, evictions = level.usage()
    assert size <= level.budget_bytes and evictions == 3 and level.contains("e" * 64)
    assert level.contains("d" * 64)  # the most recent of the others stays


def test_too_large_is_not_kept_and_replacing_keeps_accounting() -> None:
    level = MemoryLevel(budget_bytes=10_000)
    assert not level.put("a" * 64, "", make_segment(1.0))
    assert level.usage() == (0, 0, 0)
    small = CachedSegment(pcm=b"\x01\x00" * 100)
    assert level.put("a" * 64, "", small) and level.put("a" * 64, "", small)
    assert level.usage() == (1, small.size(), 0)


def test_forget_voice_drops_only_that_voice() -> None:
    level = MemoryLevel(budget_bytes=10_000_000)
    seg = make_segment(0.1)
    level.put("a" * 64, "v1", seg)
    level.put("b" * 64, "v1", seg)
    level.put("c" * 64, "v2", seg)
    level.put("d" * 64, "", seg)
    assert level.forget_voice("v1") == 2
    assert not level.contains("a" * 64) and not level.contains("b" * 64)
    assert level.contains("c" * 64) and level.contains("d" * 64)
    assert level.usage()[:2] == (2, 2 * seg.size())
