"""The host directory as the shared level: two engines (two SpeechCache instances) on one
directory, TTL, the budget sweep, atomic writes under concurrent writers, forget_voice."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.speech_cache import (
    CachedSegment,
    SpeechCache,
    SpeechCacheSettings,
    open_speech_cache,
)
from engine.speech_cache.directory import DirectoryStore
from tests.engine.speech_cache.conftest import fetch_sync, make_key, make_segment, wait_for

REPO = Path(__file__).resolve().parents[3]


def settings(root: Path, **changes: object) -> SpeechCacheSettings:
    base: dict[str, object] = {"shared": "directory", "directory": str(root)}
    base.update(changes)
    return SpeechCacheSettings(**base)  # type: ignore[arg-type]


@pytest.fixture
def two_engines(tmp_path: Path) -> Iterator[tuple[SpeechCache, SpeechCache]]:
    a = open_speech_cache(settings(tmp_path / "cache"))
    b = open_speech_cache(settings(tmp_path / "cache"))
    yield a, b
    a.close()
    b.close()


def test_two_engines_share_entries_and_a_shared_hit_fills_memory(
    two_engines: tuple[SpeechCache, SpeechCache], tmp_path: Path
) -> None:
    a, b = two_engines
    assert a.has_shared and b.has_shared
    key, segment = make_key(), make_segment(3.0)
    assert fetch_sync(b, key) is None  # nothing yet
    a.put(key, segment)
    assert a.get_local(key) == segment  # memory level at once
    wait_for(lambda: b.levels_holding(key) == ("shared",))
    assert b.get_local(key) is None
    assert fetch_sync(b, key) == segment  # from the directory...
    assert b.get_local(key) == segment  # ...and now in b's memory
    assert b.levels_holding(key) == ("memory", "shared")
    shared = b.stats().levels[1]
    assert (shared.level, shared.store) == ("shared", "directory")
    assert shared.hits == {"synthetic": 1} and shared.misses == {"synthetic": 1}
    assert shared.errors == 0
    # Entries and bytes: the tree at the engine's last scan plus its own writes.
    written = a.stats().levels[1]
    assert (written.entries, written.bytes) == (1, len(segment.encode()))
    root = tmp_path / "cache"
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    (file,) = [p for p in root.rglob("*") if p.is_file()]
    assert file.name == key.digest() and file.parent.name == key.digest()[:2]
    assert file.parent.parent.name == "_"  # built-in voice


def test_expired_entry_is_a_miss_and_deleted(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path, budget_bytes=10**9, ttl_s=60)
    key, segment = make_key(), make_segment(0.2)
    store.set("", key.digest(), segment.encode())
    path = store.path("", key.digest())
    assert store.get("", key.digest()) == segment.encode()
    old = time.time() - 61
    os.utime(path, (old, old))
    assert not store.contains("", key.digest())
    assert store.get("", key.digest()) is None
    assert not path.exists()
    assert store.usage()[:2] == (0, 0)


def test_corrupt_file_is_a_miss_and_deleted(tmp_path: Path) -> None:
    cache = open_speech_cache(settings(tmp_path))
    try:
        key = make_key()
        store = DirectoryStore(tmp_path, budget_bytes=10**9, ttl_s=60)
        store.set("", key.digest(), make_segment(0.2).encode()[:-7])  # torn by hand
        assert fetch_sync(cache, key) is None
        assert not store.path("", key.digest()).exists()
        shared = cache.stats().levels[1]
        assert shared.errors == 1 and shared.misses == {"synthetic": 1}
    finally:
        cache.close()


def test_budget_sweep_deletes_least_recently_used(tmp_path: Path) -> None:
    segment = make_segment(0.5)
    size = len(segment.encode())
    store = DirectoryStore(tmp_path, budget_bytes=5 * size, ttl_s=3600, sweep_to=0.9)
    keys = [make_key(f"prompt {i}") for i in range(8)]
    now = time.time()
    for i, key in enumerate(keys):
        store.set("", key.digest(), segment.encode())
        # Written over the last hour, key 0 used (atime) most recently of all.
        used = now - 3000 + i * 10 if i else now
        os.utime(store.path("", key.digest()), (used, now - 3000 + i * 10))
    assert store.due(time.monotonic())  # tracked bytes over the budget
    store.maintain(time.monotonic())
    entries, total, evictions = store.usage()
    assert total <= 0.9 * 5 * size and entries == 4 and evictions == 4
    kept = [i for i, k in enumerate(keys) if store.contains("", k.digest())]
    assert kept == [0, 5, 6, 7]
    assert not store.due(time.monotonic())


def test_write_thread_keeps_the_directory_within_budget(tmp_path: Path) -> None:
    cache = open_speech_cache(settings(tmp_path, shared_mb=1))
    try:
        for i in range(12):  # 12 x 144 KB into a 1 MiB budget
            cache.put(make_key(f"prompt {i}"), make_segment(3.0, seed=i))
    finally:
        cache.close()  # flushes the queued writes
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert 0 < len(files) <= 7
    assert sum(p.stat().st_size for p in files) <= 1024 * 1024


def test_forget_voice_removes_its_subtree_only(tmp_path: Path) -> None:
    cache = open_speech_cache(settings(tmp_path))
    try:
        voice_a, voice_b = "aa" * 32, "bb" * 32
        ka, kb, kbuilt = make_key(voice_digest=voice_a), make_key(voice_digest=voice_b), make_key()
        for key in (ka, kb, kbuilt):
            cache.put(key, make_segment(0.2))
        wait_for(lambda: all("shared" in cache.levels_holding(k) for k in (ka, kb, kbuilt)))
        cache.forget_voice(voice_a)
        assert cache.levels_holding(ka) == ()
        assert cache.levels_holding(kb) == ("memory", "shared")
        assert cache.levels_holding(kbuilt) == ("memory", "shared")
        assert not (tmp_path / voice_a).exists() and (tmp_path / voice_b).is_dir()
        assert cache.stats().levels[1].entries == 2
    finally:
        cache.close()


def test_root_is_private(tmp_path: Path) -> None:
    root = tmp_path / "shared"
    root.mkdir(mode=0o777)
    os.chmod(root, 0o777)
    DirectoryStore(root, budget_bytes=1, ttl_s=1)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    link = tmp_path / "link"
    link.symlink_to(root)
    with pytest.raises(OSError):
        DirectoryStore(link, budget_bytes=1, ttl_s=1)


WRITER = """
import sys, time
from engine.speech_cache.directory import DirectoryStore
from tests.engine.speech_cache.conftest import make_key, make_segment
store = DirectoryStore(sys.argv[1], budget_bytes=10**9, ttl_s=3600)
seed = int(sys.argv[2])
data = make_segment(3.0, seed=seed).encode()
digest = make_key().digest()
end = time.monotonic() + float(sys.argv[3])
n = 0
while time.monotonic() < end:
    store.set("", digest, data)
    n += 1
print(n)
"""


def test_concurrent_writers_never_give_a_torn_read(tmp_path: Path) -> None:
    """Two engine processes rewrite one entry (different bytes) while this one reads it:
    every read is one complete version."""
    versions = {make_segment(3.0, seed=s).encode() for s in (1, 2)}
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path), str(seed), "1.5"],
            env=env,
            stdout=subprocess.PIPE,
        )
        for seed in (1, 2)
    ]
    reader = DirectoryStore(tmp_path, budget_bytes=10**9, ttl_s=3600)
    digest = make_key().digest()
    reads = 0
    seen: set[bytes] = set()
    while any(w.poll() is None for w in writers):
        data = reader.get("", digest)
        if data is not None:
            assert data in versions, "torn read"
            CachedSegment.decode(data)
            seen.add(data)
            reads += 1
    counts = [int(w.communicate(timeout=10)[0]) for w in writers]
    assert all(w.returncode == 0 for w in writers)
    assert min(counts) > 10 and reads > 10
    assert not [p for p in tmp_path.rglob("*.tmp")]  # no temporary file left behind
