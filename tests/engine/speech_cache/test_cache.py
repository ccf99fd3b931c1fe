"""SpeechCache as a whole: settings, the disabled cache, memory-only, statistics, and
forget_voice over every level."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.ipc.env import ConfigError
from engine.speech_cache import (
    CachedSegment,
    SegmentKey,
    SpeechCacheSettings,
    open_speech_cache,
)
from engine.speech_cache.settings import default_directory
from tests.engine.speech_cache.conftest import fetch_sync, make_key, make_segment, wait_for


def test_settings_from_env() -> None:
    default = SpeechCacheSettings.from_env({})
    assert default == SpeechCacheSettings()
    assert default.enabled and default.memory_mb == 256 and default.shared_mb == 2048
    assert (default.ttl_s, default.timeout_ms) == (604_800, 50)
    assert default.shared_store == "directory" and default.tenant_percent == 25
    assert default.cache_directory == default_directory()
    assert default.cache_directory.endswith("/ivr-gateway/speech-cache")
    assert default.secret_path.endswith("/ivr-gateway/speech-cache.secret")
    assert default.tenant_quota(1000) == 250
    assert (
        SpeechCacheSettings.from_env({"GATEWAY_REDIS_URL": "redis://r:6379/0"}).shared_store
        == "redis"
    )
    env = {
        "ENGINE_SPEECH_CACHE": "0",
        "ENGINE_SPEECH_CACHE_MEMORY_MB": "16",
        "ENGINE_SPEECH_CACHE_SHARED": "off",
        "ENGINE_SPEECH_CACHE_DIR": "/tmp/x",
        "ENGINE_SPEECH_CACHE_SHARED_MB": "10",
        "ENGINE_SPEECH_CACHE_TTL_S": "60",
        "ENGINE_SPEECH_CACHE_TIMEOUT_MS": "20",
        "ENGINE_SPEECH_CACHE_TENANT_PERCENT": "10",
        "ENGINE_SPEECH_CACHE_SECRET": "s" * 32,
    }
    custom = SpeechCacheSettings.from_env(env)
    assert not custom.enabled and custom.memory_mb == 16 and custom.shared_store is None
    assert (custom.cache_directory, custom.shared_mb, custom.ttl_s, custom.timeout_ms) == (
        "/tmp/x", 10, 60, 20
    )  # fmt: skip
    assert (custom.tenant_percent, custom.secret) == (10, "s" * 32)
    directory = SpeechCacheSettings.from_env(
        {"ENGINE_SPEECH_CACHE_SHARED": "directory", "GATEWAY_REDIS_URL": "redis://r"}
    )
    assert directory.shared_store == "directory"
    for bad in (
        {"ENGINE_SPEECH_CACHE": "maybe"},
        {"ENGINE_SPEECH_CACHE_SHARED": "nfs"},
        {"ENGINE_SPEECH_CACHE_SHARED": "redis"},  # without GATEWAY_REDIS_URL
        {"ENGINE_SPEECH_CACHE_TIMEOUT_MS": "0"},
        {"ENGINE_SPEECH_CACHE_MEMORY_MB": "lots"},
        {"ENGINE_SPEECH_CACHE_SECRET": "too short"},
        {"ENGINE_SPEECH_CACHE_TENANT_PERCENT": "0"},
    ):
        with pytest.raises(ConfigError):
            SpeechCacheSettings.from_env(bad)


def test_disabled_cache_holds_nothing(tmp_path: Path) -> None:
    cache = open_speech_cache(
        SpeechCacheSettings(enabled=False, shared="directory", directory=str(tmp_path / "c"))
    )
    key = make_key()
    cache.put(key, make_segment())
    assert not cache.enabled and not cache.has_shared
    assert cache.get_local(key) is None
    answers: list[CachedSegment | None] = []
    cache.fetch(key, lambda _, segment: answers.append(segment))
    assert answers == [None]  # at once
    assert cache.levels_holding(key) == ()
    cache.forget_voice(key.scope, "")
    assert cache.purge_scope(key.scope) == 0
    assert cache.stats().enabled is False and cache.stats().levels == ()
    assert not (tmp_path / "c").exists()
    cache.close()


def test_memory_only_cache_and_statistics() -> None:
    cache = open_speech_cache(SpeechCacheSettings(shared="off", memory_mb=1, tenant_percent=100))
    try:
        assert cache.enabled and not cache.has_shared
        hello, bye = make_key("Hello."), make_key("Goodbye.", backend="piper")
        assert cache.get_local(hello) is None
        cache.put(hello, make_segment(0.5))
        assert cache.get_local(hello) == make_segment(0.5)
        assert cache.get_local(hello) is not None
        assert cache.get_local(bye) is None
        assert cache.contains_local(hello) and not cache.contains_local(bye)  # not counted
        answers: list[tuple[SegmentKey, CachedSegment | None]] = []
        cache.fetch(hello, lambda k, s: answers.append((k, s)))
        assert answers == [(hello, None)]  # no shared level: answered at once
        for i in range(60):  # 60 x 24 kB into 1 MiB: evictions
            cache.put(make_key(f"line {i}"), make_segment(0.5, seed=i))
        stats = cache.stats()
        assert stats.enabled and len(stats.levels) == 1
        memory = stats.levels[0]
        assert (memory.level, memory.store) == ("memory", "memory")
        assert memory.hits == {"synthetic": 2}
        assert memory.misses == {"synthetic": 1, "piper": 1}
        assert memory.bytes <= 1024 * 1024 and memory.evictions > 0
        assert memory.entries == 1024 * 1024 // make_segment(0.5).size()
        assert cache.get_local(hello) is None  # the least recently used went first
        cache.put(hello, CachedSegment(pcm=b"\x00\x00" * (30 * 48_000 + 1)))  # too long
        assert cache.get_local(hello) is None
    finally:
        cache.close()


def test_forget_voice_clears_every_level(tmp_path: Path) -> None:
    settings = SpeechCacheSettings(shared="directory", directory=str(tmp_path))
    cache, other_engine = open_speech_cache(settings), open_speech_cache(settings)
    try:
        cloned, other = "12" * 32, "34" * 32
        keys = [make_key(f"line {i}", voice_digest=cloned) for i in range(5)]
        kept = [make_key("line", voice_digest=other), make_key("line")]
        for key in keys + kept:
            cache.put(key, make_segment(0.2))
        wait_for(lambda: all("shared" in cache.levels_holding(k) for k in keys + kept))
        assert fetch_sync(other_engine, keys[0]) is not None  # now in its memory too
        cache.forget_voice(keys[0].scope, cloned)
        assert [cache.levels_holding(k) for k in keys] == [()] * 5
        assert [cache.levels_holding(k) for k in kept] == [("memory", "shared")] * 2
        # The other engine still has the entry it read in its own memory: each engine
        # receives ForgetVoice itself (the gateway sends it to every engine).
        assert other_engine.levels_holding(keys[0]) == ("memory",)
        other_engine.forget_voice(keys[0].scope, cloned)
        assert other_engine.levels_holding(keys[0]) == ()
        assert fetch_sync(other_engine, keys[1]) is None
    finally:
        cache.close()
        other_engine.close()


def test_an_unusable_directory_fails_loudly(tmp_path: Path) -> None:
    """A directory the cache cannot make private stops the engine at start (a
    configuration error naming the path), instead of a warning and no shared level."""
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.raises(ConfigError, match="not a directory"):
        open_speech_cache(SpeechCacheSettings(shared="directory", directory=str(blocker)))


def test_a_voice_forgotten_after_its_stream_began_is_not_stored_again(tmp_path: Path) -> None:
    """A call that began before its voice was deleted keeps speaking it: what it
    synthesizes after the deletion (put with the epoch taken when it began) is not stored
    in any level; a stream that begins after it (the voice registered again) is."""
    cache = open_speech_cache(SpeechCacheSettings(shared="directory", directory=str(tmp_path)))
    try:
        cloned = "ab" * 32
        before, late = (
            make_key("Before.", voice_digest=cloned),
            make_key("Late.", voice_digest=cloned),
        )
        began = cache.epoch()
        cache.put(before, make_segment(0.2), since=began)
        wait_for(lambda: "shared" in cache.levels_holding(before))
        cache.forget_voice(before.scope, cloned)
        cache.put(late, make_segment(0.2), since=began)  # the old call, after the deletion
        builtin = make_key("Late.")
        cache.put(builtin, make_segment(0.2), since=began)  # other voices are not affected
        assert cache.levels_holding(before) == ()
        assert cache.levels_holding(late) == ()
        wait_for(lambda: cache.levels_holding(builtin) == ("memory", "shared"))
        again = cache.epoch()  # the voice registered again: a new call stores its speech
        cache.put(late, make_segment(0.2), since=again)
        assert "memory" in cache.levels_holding(late)
    finally:
        cache.close()


def test_forgetting_the_empty_digest_keeps_the_built_in_voices(tmp_path: Path) -> None:
    cache = open_speech_cache(SpeechCacheSettings(shared="directory", directory=str(tmp_path)))
    try:
        key = make_key()  # a built-in voice: voice digest ""
        cache.put(key, make_segment(0.2))
        wait_for(lambda: "shared" in cache.levels_holding(key))
        cache.forget_voice(key.scope, "")
        assert cache.levels_holding(key) == ("memory", "shared")
    finally:
        cache.close()
