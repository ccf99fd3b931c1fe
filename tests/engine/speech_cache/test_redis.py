"""Redis as the shared level: on the host's Redis (unique prefix, cleaned up), and on a
redis-server the test kills, freezes or protects with a password: keyed names and sealed
values, a forged value rejected, the per-tenant quota, a tenant's purge; lookups give None
within about the timeout, never raise, count errors, back off, and recover when Redis is
back."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import redis

from engine.speech_cache import (
    SHARED_SCOPE,
    CachedSegment,
    SegmentKey,
    SpeechCache,
    SpeechCacheSettings,
    open_speech_cache,
    tenant_scope,
)
from engine.speech_cache.memory import MemoryLevel
from engine.speech_cache.redis_store import RedisStore
from engine.speech_cache.shared import SharedLevel
from tests.engine.speech_cache.conftest import (
    SEALER,
    TEST_SECRET,
    RedisProcess,
    address,
    fetch_sync,
    make_key,
    make_segment,
    sealed,
    wait_for,
)

TIMEOUT_S = 0.05
LIMIT_S = 2 * TIMEOUT_S + 0.05  # ~2x the timeout, and slack for a loaded 2-core VM


def redis_cache(
    url: str,
    prefix: str = "speechcache:v2:",
    back_off_s: float = 0.5,
    queue_items: int = 1024,
    scope_quota: int = 0,
) -> SpeechCache:
    store = RedisStore(
        url, timeout_s=TIMEOUT_S, ttl_s=600, prefix=prefix, scope_quota=scope_quota,
        shared_label=SEALER.label("scope", SHARED_SCOPE),
    )  # fmt: skip
    shared = SharedLevel(
        store, SEALER, timeout_s=TIMEOUT_S, back_off_s=back_off_s, queue_items=queue_items
    )
    return SpeechCache(MemoryLevel(64 * 1024 * 1024), shared, enabled=True)


def redis_key(prefix: str, key: SegmentKey) -> str:
    where = address(key)
    return f"{prefix}{{{where.scope}}}:{where.voice}:{where.name}"


def timed_fetch(cache: SpeechCache, key: SegmentKey) -> tuple[CachedSegment | None, float]:
    got: list[CachedSegment | None] = []
    ready = threading.Event()
    start = time.monotonic()

    def done(_: SegmentKey, segment: CachedSegment | None) -> None:
        got.append(segment)
        ready.set()

    cache.fetch(key, done)
    assert ready.wait(5.0)
    return got[0], time.monotonic() - start


def test_instances_share_entries_through_redis(real_redis_url: str, redis_prefix: str) -> None:
    settings = SpeechCacheSettings(
        redis_url=real_redis_url, redis_prefix=redis_prefix, secret=TEST_SECRET
    )
    assert settings.shared_store == "redis"
    a, b = open_speech_cache(settings), open_speech_cache(settings)
    client = redis.Redis.from_url(real_redis_url)
    try:
        voice = "cd" * 32
        key = make_key("Your reference is alpha.", voice_digest=voice)
        segment = CachedSegment(make_segment(3.0).pcm, (("alpha", 0, 300),))
        a.put(key, segment)
        wait_for(lambda: b.levels_holding(key) == ("shared",))
        assert fetch_sync(b, key) == segment
        assert b.levels_holding(key) == ("memory", "shared")
        name = redis_key(redis_prefix, key)
        value = client.get(name)
        assert value is not None and key.digest() not in name and voice not in name
        assert b"alpha" not in value and segment.pcm[:64] not in value  # sealed
        assert 0 < client.ttl(name) <= settings.ttl_s
        shared = b.stats().levels[1]
        assert shared.store == "redis" and shared.hits == {"synthetic": 1}
        assert a.stats().levels[1].entries == 1  # what this engine wrote
    finally:
        a.close()
        b.close()
        client.close()


def test_a_forged_value_is_rejected_and_deleted(real_redis_url: str, redis_prefix: str) -> None:
    """Anyone who can write the keyspace cannot make a call play other audio: a value
    written without the secret (or another key's value copied under this name) fails
    authentication, is deleted and counted, and the segment is synthesized instead."""
    cache = redis_cache(real_redis_url, prefix=redis_prefix)
    client = redis.Redis.from_url(real_redis_url)
    try:
        target, other = make_key("Welcome to Acme Bank."), make_key("Goodbye.")
        name = redis_key(redis_prefix, target)
        client.set(name, sealed(other, make_segment(1.0, seed=7)))  # copied under its name
        assert fetch_sync(cache, target) is None
        assert client.get(name) is None
        genuine = sealed(target, make_segment(1.0))
        client.set(name, genuine[:-1] + bytes([genuine[-1] ^ 1]))  # a flipped tag byte
        assert fetch_sync(cache, target) is None and client.get(name) is None
        assert cache.stats().levels[1].rejected == 2
        client.set(name, genuine)
        assert fetch_sync(cache, target) == make_segment(1.0)
    finally:
        cache.close()
        client.close()


def test_a_tenants_flood_stays_in_its_quota(real_redis_url: str, redis_prefix: str) -> None:
    """Tenant A writes far past its byte quota: its oldest entries are deleted by its own
    writes; tenant B's entry and the operator's shared prompt stay."""
    size = len(sealed(make_key(), make_segment(0.5)))
    cache = redis_cache(real_redis_url, prefix=redis_prefix, scope_quota=5 * size)
    client = redis.Redis.from_url(real_redis_url)
    try:
        b_key = make_key("B's prompt.", scope=tenant_scope("b"))
        shared = [make_key(f"Welcome {i}.", scope=SHARED_SCOPE) for i in range(8)]
        for key in (b_key, *shared):
            cache.put(key, make_segment(0.5))
        flood = [make_key(f"A's {i}.", scope=tenant_scope("a")) for i in range(40)]
        for key in flood:
            cache.put(key, make_segment(0.5))
        wait_for(lambda: client.exists(redis_key(redis_prefix, flood[-1])) == 1)
        a_keys = [redis_key(redis_prefix, k) for k in flood]
        assert sum(client.exists(k) for k in a_keys) <= 5
        assert client.exists(redis_key(redis_prefix, b_key))
        assert all(client.exists(redis_key(redis_prefix, k)) for k in shared)
        assert cache.stats().levels[1].evictions >= 35
    finally:
        cache.close()
        client.close()


def test_forget_voice_and_purge_in_redis(real_redis_url: str, redis_prefix: str) -> None:
    cache = redis_cache(real_redis_url, prefix=redis_prefix)
    client = redis.Redis.from_url(real_redis_url)
    try:
        gone, kept = "ee" * 32, "ff" * 32
        keys = [make_key(f"line {i}", voice_digest=gone) for i in range(700)]
        others = [make_key("line", voice_digest=kept), make_key("line")]
        acme = [make_key(f"acme {i}", scope=tenant_scope("acme")) for i in range(3)]
        small = CachedSegment(pcm=b"\x00\x00" * 8)
        for key in keys + others + acme:
            cache.put(key, small)

        def entries() -> list[str]:
            found = client.scan_iter(match=f"{redis_prefix}*", count=1000)
            return sorted(k.decode() for k in found if b":~" not in k)

        wait_for(lambda: len(entries()) == 705)
        assert cache.stats().levels[1].errors == 0
        cache.forget_voice(keys[0].scope, gone)
        assert entries() == sorted(redis_key(redis_prefix, k) for k in others + acme)
        assert cache.levels_holding(keys[0]) == ()
        assert cache.levels_holding(others[0]) == ("memory", "shared")
        cache.purge_scope(tenant_scope("acme"))
        assert entries() == sorted(redis_key(redis_prefix, k) for k in others)
        acme_label = SEALER.label("scope", tenant_scope("acme"))
        assert not list(client.scan_iter(match=f"{redis_prefix}{{{acme_label}}}*"))
    finally:
        cache.close()
        client.close()


def test_a_password_protected_redis(tmp_path: Path) -> None:
    """AUTH: the URL's password opens it; without it every lookup is a miss (counted),
    never an exception."""
    server = RedisProcess(tmp_path, password="a-long-redis-password-for-the-test")
    server.start()
    try:
        cache = redis_cache(server.url)
        key = make_key()
        cache.put(key, make_segment(0.2))
        wait_for(lambda: "shared" in cache.levels_holding(key))
        other = redis_cache(server.url)
        assert fetch_sync(other, key) == make_segment(0.2)
        other.close()
        cache.close()
        no_password = redis_cache(f"redis://127.0.0.1:{server.port}/0")
        assert fetch_sync(no_password, key) is None
        assert no_password.stats().levels[1].errors >= 1
        no_password.close()
    finally:
        server.kill()


@pytest.mark.realtime  # lookups answered within 0.15 s: runs alone (Makefile)
def test_killed_redis_degrades_to_misses_and_recovers(redis_process: RedisProcess) -> None:
    cache = redis_cache(redis_process.url, back_off_s=0.5)
    try:
        key, segment = make_key(), make_segment(1.0)
        cache.put(key, segment)
        wait_for(lambda: "shared" in cache.levels_holding(key))
        assert fetch_sync(cache, key) == segment

        redis_process.kill()
        for _ in range(6):  # refused connections, then backing off
            got, took = timed_fetch(cache, key)
            assert got is None and took < LIMIT_S
        cache.put(key, segment)  # a write while it is down: dropped, no exception
        assert cache.levels_holding(key) == ("memory",)
        shared = cache.stats().levels[1]
        assert shared.errors >= 6 and shared.misses["synthetic"] == 6

        redis_process.start()  # a new, empty Redis on the same port
        time.sleep(0.6)  # past the back-off
        errors = cache.stats().levels[1].errors
        got, took = timed_fetch(cache, key)
        assert got is None and took < LIMIT_S  # answered: the new Redis is empty
        assert cache.stats().levels[1].errors == errors
        cache.put(key, segment)
        wait_for(lambda: "shared" in cache.levels_holding(key))
        assert fetch_sync(cache, key) == segment
    finally:
        cache.close()


@pytest.mark.realtime  # answers within 0.15 s, 10 ms: runs alone (Makefile)
def test_frozen_redis_answers_none_within_the_timeout(redis_process: RedisProcess) -> None:
    """A Redis that accepts connections but never answers (SIGSTOP): each lookup is
    answered None within ~2x the timeout; after three the level backs off at once."""
    cache = redis_cache(redis_process.url, back_off_s=5.0)
    try:
        key = make_key()
        assert fetch_sync(cache, key) is None  # connected and answering
        redis_process.freeze()
        times = []
        for _ in range(5):
            got, took = timed_fetch(cache, key)
            assert got is None
            times.append(took)
        assert max(times) < LIMIT_S, times
        assert max(times[3:]) < 0.01, times  # backing off: answered at once
        levels_start = time.monotonic()
        assert cache.levels_holding(key) == ()
        assert time.monotonic() - levels_start < LIMIT_S
        assert cache.stats().levels[1].errors >= 5
        close_start = time.monotonic()
        cache.close()
        assert time.monotonic() - close_start < 3.0
    finally:
        redis_process.thaw()
        cache.close()


def test_full_lookup_queue_answers_at_once(redis_process: RedisProcess) -> None:
    """With the store hung and the queue full, fetch answers None synchronously."""
    cache = redis_cache(redis_process.url, back_off_s=5.0, queue_items=2)
    answers: list[tuple[int, bool]] = []  # (fetch number, answered before fetch returned)
    try:
        assert fetch_sync(cache, make_key()) is None
        redis_process.freeze()
        returned = [False]  # whether the current fetch call has returned
        for i in range(8):
            returned[0] = False

            def done(_: SegmentKey, segment: CachedSegment | None, i: int = i) -> None:
                assert segment is None
                answers.append((i, not returned[0]))

            cache.fetch(make_key(f"line {i}"), done)
            returned[0] = True
        wait_for(lambda: len(answers) == 8, 2.0)
        synchronous = [i for i, sync in answers if sync]
        assert len(synchronous) >= 5  # the thread holds 1, the queue 2: the rest at once
        assert cache.stats().levels[1].misses["synthetic"] == 9
    finally:
        redis_process.thaw()
        cache.close()


@pytest.mark.realtime  # answered within 0.15 s: runs alone (Makefile)
def test_watchdog_answers_when_the_store_hangs_past_the_timeout(
    redis_process: RedisProcess,
) -> None:
    """A store call that hangs far longer than the lookup timeout (a Redis client with a
    2 s socket timeout here; a hung network filesystem for the directory) still gives the
    caller None at about 1.5x the lookup timeout: the watchdog answers, not the store."""
    store = RedisStore(redis_process.url, timeout_s=2.0, ttl_s=60)
    shared = SharedLevel(store, SEALER, timeout_s=TIMEOUT_S, back_off_s=5.0)
    cache = SpeechCache(MemoryLevel(1 << 20), shared, enabled=True)
    try:
        assert fetch_sync(cache, make_key()) is None
        redis_process.freeze()
        got, took = timed_fetch(cache, make_key())
        assert got is None and 1.5 * TIMEOUT_S <= took < LIMIT_S, took
        assert cache.stats().levels[1].errors == 1
    finally:
        redis_process.thaw()
        cache.close()


def test_the_default_prefix_is_versioned() -> None:
    """Entries of the unsealed format (``speechcache:v1:``) are never read as sealed."""
    from engine.speech_cache.settings import DEFAULT_PREFIX

    assert DEFAULT_PREFIX.endswith(":v2:")
