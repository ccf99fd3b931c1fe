"""Redis as the shared level: on the host's Redis (unique prefix, cleaned up), and on a
redis-server the test kills or freezes: lookups give None within about the timeout, never
raise, count errors, back off, and recover when Redis is back."""

from __future__ import annotations

import threading
import time

import redis

from engine.speech_cache import (
    CachedSegment,
    SegmentKey,
    SpeechCache,
    SpeechCacheSettings,
    open_speech_cache,
)
from engine.speech_cache.memory import MemoryLevel
from engine.speech_cache.redis_store import RedisStore
from engine.speech_cache.shared import SharedLevel
from tests.engine.speech_cache.conftest import (
    RedisProcess,
    fetch_sync,
    make_key,
    make_segment,
    wait_for,
)

TIMEOUT_S = 0.05
LIMIT_S = 2 * TIMEOUT_S + 0.05  # ~2x the timeout, and slack for a loaded 2-core VM


def redis_cache(
    url: str, prefix: str = "speechcache:v1:", back_off_s: float = 0.5, queue_items: int = 1024
) -> SpeechCache:
    store = RedisStore(url, timeout_s=TIMEOUT_S, ttl_s=600, prefix=prefix)
    shared = SharedLevel(store, timeout_s=TIMEOUT_S, back_off_s=back_off_s, queue_items=queue_items)
    return SpeechCache(MemoryLevel(64 * 1024 * 1024), shared, enabled=True)


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
    settings = SpeechCacheSettings(redis_url=real_redis_url, redis_prefix=redis_prefix)
    assert settings.shared_store == "redis"
    a, b = open_speech_cache(settings), open_speech_cache(settings)
    client = redis.Redis.from_url(real_redis_url)
    try:
        voice = "cd" * 32
        key, segment = make_key(voice_digest=voice), make_segment(3.0)
        a.put(key, segment)
        wait_for(lambda: b.levels_holding(key) == ("shared",))
        assert fetch_sync(b, key) == segment
        assert b.levels_holding(key) == ("memory", "shared")
        name = f"{redis_prefix}{{{voice}}}:{key.digest()}"
        assert client.get(name) == segment.encode()
        assert 0 < client.ttl(name) <= settings.ttl_s
        shared = b.stats().levels[1]
        assert shared.store == "redis" and shared.hits == {"synthetic": 1}
        assert a.stats().levels[1].entries == 1  # what this engine wrote
    finally:
        a.close()
        b.close()
        client.close()


def test_forget_voice_in_redis_leaves_other_voices(real_redis_url: str, redis_prefix: str) -> None:
    cache = redis_cache(real_redis_url, prefix=redis_prefix)
    client = redis.Redis.from_url(real_redis_url)
    try:
        gone, kept = "ee" * 32, "ff" * 32
        keys = [make_key(f"line {i}", voice_digest=gone) for i in range(700)]
        others = [make_key("line", voice_digest=kept), make_key("line")]
        small = CachedSegment(pcm=b"\x00\x00" * 8)
        for key in keys + others:
            cache.put(key, small)
        wait_for(lambda: len(list(client.scan_iter(match=f"{redis_prefix}*", count=1000))) == 702)
        assert cache.stats().levels[1].errors == 0
        cache.forget_voice(gone)
        left = sorted(k.decode() for k in client.scan_iter(match=f"{redis_prefix}*", count=1000))
        assert left == sorted(
            f"{redis_prefix}{{{k.voice_digest or '_'}}}:{k.digest()}" for k in others
        )
        assert cache.levels_holding(keys[0]) == ()
        assert cache.levels_holding(others[0]) == ("memory", "shared")
    finally:
        cache.close()
        client.close()


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


def test_watchdog_answers_when_the_store_hangs_past_the_timeout(
    redis_process: RedisProcess,
) -> None:
    """A store call that hangs far longer than the lookup timeout (a Redis client with a
    2 s socket timeout here; a hung network filesystem for the directory) still gives the
    caller None at about 1.5x the lookup timeout: the watchdog answers, not the store."""
    store = RedisStore(redis_process.url, timeout_s=2.0, ttl_s=60)
    shared = SharedLevel(store, timeout_s=TIMEOUT_S, back_off_s=5.0)
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
