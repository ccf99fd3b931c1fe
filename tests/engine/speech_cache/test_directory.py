"""The host directory as the shared level: two engines (two SpeechCache instances) on one
directory, keyed names and sealed values, TTL (with and without an engine), the per-tenant
quotas and the budget sweep, atomic writes under concurrent writers, forget_voice and a
tenant's purge, and a private root (squatting refused)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.ipc.env import ConfigError
from engine.speech_cache import (
    SHARED_SCOPE,
    CachedSegment,
    SpeechCache,
    SpeechCacheSettings,
    open_speech_cache,
    tenant_scope,
)
from engine.speech_cache.directory import DirectoryStore
from engine.speech_cache.private import private_directory
from tests.engine.speech_cache.conftest import (
    SEALER,
    TEST_SECRET,
    address,
    fetch_sync,
    make_key,
    make_segment,
    sealed,
    wait_for,
)

REPO = Path(__file__).resolve().parents[3]
NOBODY = 65534


def settings(root: Path, **changes: object) -> SpeechCacheSettings:
    base: dict[str, object] = {"shared": "directory", "directory": str(root),
                               "secret": TEST_SECRET}  # fmt: skip
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
    assert shared.errors == 0 and shared.rejected == 0
    root = tmp_path / "cache"
    (file,) = [p for p in root.rglob("*") if p.is_file()]
    written = a.stats().levels[1]
    assert (written.entries, written.bytes) == (1, file.stat().st_size)


def test_names_are_keyed_and_values_sealed(tmp_path: Path) -> None:
    """Nothing in the tree gives a text away: a file's name is a keyed hash (not the
    key's plain sha256, which anyone can compute from a guessed text), its folders are
    keyed hashes of the tenant and the voice, and its bytes hold neither the words nor
    the audio in clear. Every folder is 0700, every file 0600."""
    cache = open_speech_cache(settings(tmp_path))
    key = make_key("Your reference is alpha bravo.", scope=tenant_scope("acme"))
    segment = CachedSegment(make_segment(1.0).pcm, (("reference", 0, 300), ("alpha", 300, 500)))
    try:
        cache.put(key, segment)
    finally:
        cache.close()
    (file,) = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert file.name == SEALER.name(key) != key.digest()
    assert file.parent.parent.parent.name == SEALER.label("scope", key.scope)
    assert "acme" not in str(file) and file.parent.parent.name == "_"  # built-in voice
    data = file.read_bytes()
    assert b"reference" not in data and b"alpha" not in data
    assert segment.pcm[1000:1064] not in data
    for folder in [p for p in tmp_path.rglob("*") if p.is_dir()] + [tmp_path]:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    assert stat.S_IMODE(file.stat().st_mode) == 0o600
    # Another deployment's secret finds nothing under the same key.
    other = open_speech_cache(settings(tmp_path, secret="another-deployment-secret-0123456"))
    try:
        assert fetch_sync(other, key) is None
    finally:
        other.close()


def test_a_modified_entry_is_rejected_deleted_and_counted(tmp_path: Path) -> None:
    """A changed byte, an entry copied under another key's name, or one sealed with
    another secret fails authentication: a miss, deleted, counted as rejected."""
    cache = open_speech_cache(settings(tmp_path))
    store = DirectoryStore(tmp_path, budget_bytes=10**9, ttl_s=60)
    try:
        flipped, moved = make_key("Flipped."), make_key("Moved.")
        good = sealed(flipped, make_segment(0.2))
        bad = good[:200] + bytes([good[200] ^ 1]) + good[201:]
        store.set(address(flipped), bad)
        store.set(address(moved), sealed(make_key("Another."), make_segment(0.2, seed=9)))
        assert fetch_sync(cache, flipped) is None and fetch_sync(cache, moved) is None
        assert store.get(address(flipped)) is None and store.get(address(moved)) is None
        shared = cache.stats().levels[1]
        assert shared.rejected == 2 and shared.misses == {"synthetic": 2}
        store.set(address(flipped), good)  # the genuine entry opens
        assert fetch_sync(cache, flipped) == make_segment(0.2)
    finally:
        cache.close()


def test_expired_entry_is_a_miss_and_deleted(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path, budget_bytes=10**9, ttl_s=60)
    key, data = make_key(), sealed(make_key(), make_segment(0.2))
    store.set(address(key), data)
    path = store.path(address(key))
    assert store.get(address(key)) == data
    old = time.time() - 61
    os.utime(path, (old, old))
    assert not store.contains(address(key))
    assert store.get(address(key)) is None
    assert not path.exists()
    assert store.usage()[:2] == (0, 0)


def test_the_sealed_write_time_holds_whatever_the_mtime_says(tmp_path: Path) -> None:
    """Touching an expired file (a backup restore, a copy) does not bring it back: the
    time it was written is sealed with it."""
    cache = open_speech_cache(settings(tmp_path, ttl_s=60))
    try:
        key = make_key()
        store = DirectoryStore(tmp_path, budget_bytes=10**9, ttl_s=60)
        store.set(address(key), sealed(key, make_segment(0.2), written_at=time.time() - 3600))
        assert fetch_sync(cache, key) is None
        assert store.get(address(key)) is None  # deleted
    finally:
        cache.close()


def test_expired_entries_are_swept_when_the_store_opens(tmp_path: Path) -> None:
    """The TTL holds without a running engine: what expired while none ran is gone
    before the first lookup of the next one."""
    store = DirectoryStore(tmp_path, budget_bytes=10**9, ttl_s=60)
    old, fresh = make_key("Old."), make_key("Fresh.")
    store.set(address(old), sealed(old, make_segment(0.2)))
    store.set(address(fresh), sealed(fresh, make_segment(0.2)))
    long_ago = time.time() - 3600
    os.utime(store.path(address(old)), (long_ago, long_ago))
    DirectoryStore(tmp_path, budget_bytes=10**9, ttl_s=60)  # the next engine starts
    assert not store.path(address(old)).exists() and store.path(address(fresh)).exists()


def test_budget_sweep_deletes_least_recently_used(tmp_path: Path) -> None:
    data = sealed(make_key(), make_segment(0.5))
    size = len(data)
    store = DirectoryStore(tmp_path, budget_bytes=5 * size, ttl_s=3600, sweep_to=0.9)
    keys = [make_key(f"prompt {i}") for i in range(8)]
    now = time.time()
    for i, key in enumerate(keys):
        store.set(address(key), data)
        # Written over the last hour, key 0 used (atime) most recently of all.
        used = now - 3000 + i * 10 if i else now
        os.utime(store.path(address(key)), (used, now - 3000 + i * 10))
    assert store.due(time.monotonic())  # tracked bytes over the budget
    store.maintain(time.monotonic())
    entries, total, evictions = store.usage()
    assert total <= 0.9 * 5 * size and entries == 4 and evictions == 4
    kept = [i for i, k in enumerate(keys) if store.contains(address(k))]
    assert kept == [0, 5, 6, 7]
    assert not store.due(time.monotonic())


def test_a_tenants_flood_is_held_to_its_quota(tmp_path: Path) -> None:
    """Tenant A writes far past its quota: the sweep deletes its own least recently used
    entries; tenant B's entry and the operator's shared prompt stay."""
    data = sealed(make_key(), make_segment(0.5))
    size = len(data)
    shared_label = SEALER.label("scope", SHARED_SCOPE)
    store = DirectoryStore(
        tmp_path, budget_bytes=100 * size, ttl_s=3600, scope_quota=4 * size,
        shared_label=shared_label,
    )  # fmt: skip
    b_key = make_key("B's prompt.", scope=tenant_scope("b"))
    shared = make_key("Welcome.", scope=SHARED_SCOPE)
    shared_keys = [make_key(f"Welcome {i}.", scope=SHARED_SCOPE) for i in range(6)]
    for key in (b_key, shared, *shared_keys):
        store.set(address(key), data)
    flood = [make_key(f"A's {i}.", scope=tenant_scope("a")) for i in range(30)]
    for key in flood:
        store.set(address(key), data)
        store.maintain(time.monotonic())  # as the write thread does after each write
    a_label = SEALER.label("scope", tenant_scope("a"))
    assert store.scope_bytes(a_label) <= 4 * size
    assert store.contains(address(b_key)) and store.contains(address(shared))
    assert all(store.contains(address(k)) for k in shared_keys)  # exempt from the quota
    assert store.contains(address(flood[-1])) and not store.contains(address(flood[0]))


def test_a_full_budget_evicts_from_the_largest_scope(tmp_path: Path) -> None:
    data = sealed(make_key(), make_segment(0.5))
    size = len(data)
    store = DirectoryStore(tmp_path, budget_bytes=6 * size, ttl_s=3600, scope_quota=5 * size)
    a_keys = [make_key(f"a{i}", scope=tenant_scope("a")) for i in range(5)]
    others = [make_key("b", scope=tenant_scope("b")), make_key("c", scope=tenant_scope("c"))]
    for key in a_keys + others:
        store.set(address(key), data)
    store.maintain(time.monotonic())
    assert all(store.contains(address(k)) for k in others)
    assert sum(store.contains(address(k)) for k in a_keys) <= 3


def test_write_thread_keeps_the_directory_within_budget(tmp_path: Path) -> None:
    cache = open_speech_cache(settings(tmp_path, shared_mb=1, tenant_percent=100))
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
        cache.forget_voice(ka.scope, voice_a)
        assert cache.levels_holding(ka) == ()
        assert cache.levels_holding(kb) == ("memory", "shared")
        assert cache.levels_holding(kbuilt) == ("memory", "shared")
        assert not store_path(tmp_path, ka).parent.exists()
        assert store_path(tmp_path, kb).is_file()
        assert cache.stats().levels[1].entries == 2
    finally:
        cache.close()


def store_path(root: Path, key: object) -> Path:
    addr = address(key)  # type: ignore[arg-type]
    return root / addr.scope / addr.voice / addr.name[:2] / addr.name


def test_purge_removes_one_tenants_entries_only(tmp_path: Path) -> None:
    cache = open_speech_cache(settings(tmp_path))
    try:
        acme = [make_key(f"acme {i}", scope=tenant_scope("acme")) for i in range(3)]
        kept = [make_key("other", scope=tenant_scope("other")), make_key(scope=SHARED_SCOPE)]
        for key in acme + kept:
            cache.put(key, make_segment(0.2))
        wait_for(lambda: all("shared" in cache.levels_holding(k) for k in acme + kept))
        assert cache.purge_scope(tenant_scope("acme")) == 3
        assert [cache.levels_holding(k) for k in acme] == [()] * 3
        assert [cache.levels_holding(k) for k in kept] == [("memory", "shared")] * 2
        assert cache.purge_scope(SHARED_SCOPE) == 0  # the operator's: never purged this way
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
    with pytest.raises(ConfigError, match="symbolic link"):
        DirectoryStore(link, budget_bytes=1, ttl_s=1)
    made = private_directory(tmp_path / "a" / "b" / "c")  # every level made 0700
    for folder in (tmp_path / "a", tmp_path / "a" / "b", made):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to make a folder another user's")
def test_a_squatted_path_fails_loudly(tmp_path: Path) -> None:
    """Another local user created the cache's path first (or a folder above it they may
    change): the cache refuses it at start, naming the path, rather than write tenants'
    speech where that user can read it or turning the shared level off silently."""
    squatted = tmp_path / "speech-cache"
    squatted.mkdir(mode=0o777)
    os.chown(squatted, NOBODY, NOBODY)
    with pytest.raises(ConfigError, match="another user created it first"):
        open_speech_cache(settings(squatted))
    shared_parent = tmp_path / "open"
    shared_parent.mkdir()
    os.chmod(shared_parent, 0o777)  # writable by all, not sticky
    with pytest.raises(ConfigError, match="may be changed by other users"):
        open_speech_cache(settings(shared_parent / "cache"))
    foreign_parent = tmp_path / "theirs"
    foreign_parent.mkdir()
    os.chown(foreign_parent, NOBODY, NOBODY)
    with pytest.raises(ConfigError, match="belongs to uid"):
        open_speech_cache(settings(foreign_parent / "cache"))


WRITER = """
import sys, time
from engine.speech_cache.directory import DirectoryStore
from tests.engine.speech_cache.conftest import address, make_key, make_segment, sealed
store = DirectoryStore(sys.argv[1], budget_bytes=10**9, ttl_s=3600)
seed = int(sys.argv[2])
data = sealed(make_key(), make_segment(3.0, seed=seed), written_at=1)
end = time.monotonic() + float(sys.argv[3])
n = 0
while time.monotonic() < end:
    store.set(address(make_key()), data)
    n += 1
print(n)
"""


def test_concurrent_writers_never_give_a_torn_read(tmp_path: Path) -> None:
    """Two engine processes rewrite one entry (different bytes) while this one reads it:
    every read is one complete version."""
    versions = {sealed(make_key(), make_segment(3.0, seed=s), written_at=1) for s in (1, 2)}
    assert len(versions) == 2
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
    where = address(make_key())
    reads = 0
    while any(w.poll() is None for w in writers):
        data = reader.get(where)
        if data is not None:
            assert len(data) == len(next(iter(versions))), "torn read"
            SEALER.open(where.name, data)  # whole and authentic
            reads += 1
    counts = [int(w.communicate(timeout=10)[0]) for w in writers]
    assert all(w.returncode == 0 for w in writers)
    assert min(counts) > 10 and reads > 10
    assert not [p for p in tmp_path.rglob("*.tmp")]  # no temporary file left behind
