"""The in-process level: LRU within a byte budget, fair between scopes, and a TTL."""

from __future__ import annotations

from engine.speech_cache import SHARED_SCOPE, CachedSegment, tenant_scope
from engine.speech_cache.memory import MemoryLevel
from tests.engine.speech_cache.conftest import make_segment

A, B = tenant_scope("a"), tenant_scope("b")


def test_lru_evicts_least_recently_used_within_budget() -> None:
    seg = make_segment(0.5)  # 24 kB of PCM
    level = MemoryLevel(budget_bytes=3 * seg.size() + 10)
    for name in ("a", "b", "c"):
        assert level.put(name * 64, A, "", seg)
    assert level.usage() == (3, 3 * seg.size(), 0)
    assert level.get("a" * 64) is seg  # "a" is now the most recently used
    assert level.put("d" * 64, A, "", seg)  # evicts "b", the least recently used
    assert level.contains("a" * 64) and not level.contains("b" * 64)
    assert level.contains("c" * 64) and level.contains("d" * 64)
    entries, size, evictions = level.usage()
    assert (entries, evictions) == (3, 1) and size <= level.budget_bytes
    # A larger segment evicts as many as it needs, oldest first.
    big = make_segment(0.9)
    assert level.put("e" * 64, A, "", big)
    entries, size, evictions = level.usage()
    assert size <= level.budget_bytes and evictions == 3 and level.contains("e" * 64)
    assert level.contains("d" * 64)  # the most recent of the others stays


def test_too_large_is_not_kept_and_replacing_keeps_accounting() -> None:
    level = MemoryLevel(budget_bytes=10_000)
    assert not level.put("a" * 64, A, "", make_segment(1.0))
    assert level.usage() == (0, 0, 0)
    small = CachedSegment(pcm=b"\x01\x00" * 100)
    assert level.put("a" * 64, A, "", small) and level.put("a" * 64, A, "", small)
    assert level.usage() == (1, small.size(), 0)


def test_forget_voice_drops_only_that_voice() -> None:
    level = MemoryLevel(budget_bytes=10_000_000)
    seg = make_segment(0.1)
    level.put("a" * 64, A, "v1", seg)
    level.put("b" * 64, A, "v1", seg)
    level.put("c" * 64, A, "v2", seg)
    level.put("d" * 64, A, "", seg)
    assert level.forget_voice("v1") == 2
    assert not level.contains("a" * 64) and not level.contains("b" * 64)
    assert level.contains("c" * 64) and level.contains("d" * 64)
    assert level.usage()[:2] == (2, 2 * seg.size())


def test_a_tenants_flood_evicts_only_its_own_entries() -> None:
    """Tenant A floods far past its quota: its own oldest entries go; tenant B's prompt
    and the operator's shared one (exempt from the quota) stay."""
    seg = make_segment(0.2)
    level = MemoryLevel(budget_bytes=40 * seg.size(), scope_quota=10 * seg.size())
    assert level.put("b" * 64, B, "", seg)
    assert level.put("5" * 64, SHARED_SCOPE, "", seg)
    for i in range(200):
        assert level.put(f"{i:064x}", A, "", make_segment(0.2, seed=i))
    assert level.contains("b" * 64) and level.contains("5" * 64)
    assert level.scope_bytes(A) <= 10 * seg.size()
    assert level.contains(f"{199:064x}") and not level.contains(f"{0:064x}")
    assert not level.put("big" + "0" * 61, A, "", make_segment(2.5))  # over its quota


def test_a_full_budget_evicts_from_the_largest_scope() -> None:
    """With every tenant under its quota but the budget full, the entry that goes is the
    least recently used of the scope holding the most."""
    seg = make_segment(0.2)
    level = MemoryLevel(budget_bytes=6 * seg.size(), scope_quota=4 * seg.size())
    for i in range(4):
        level.put(f"a{i:063x}", A, "", seg)
    level.put("b" * 64, B, "", seg)
    level.put("c" * 64, tenant_scope("c"), "", seg)
    level.put("d" * 64, tenant_scope("d"), "", seg)  # full: A, the largest, loses one
    assert level.contains("b" * 64) and level.contains("c" * 64) and level.contains("d" * 64)
    assert not level.contains(f"a{0:063x}") and level.contains(f"a{3:063x}")


def test_purge_scope_and_ttl() -> None:
    now = [100.0]
    level = MemoryLevel(budget_bytes=10_000_000, ttl_s=60, clock=lambda: now[0])
    seg = make_segment(0.1)
    level.put("a" * 64, A, "", seg)
    level.put("b" * 64, B, "", seg)
    assert level.purge_scope(A) == 1 and not level.contains("a" * 64)
    assert level.get("b" * 64) is seg
    now[0] += 61  # expired: never served, and dropped when met
    assert not level.contains("b" * 64) and level.get("b" * 64) is None
    assert level.usage()[:2] == (0, 0)
