"""SpeechCache: the two levels behind one thread-safe object, and how it is opened."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable

from engine.ipc.schema import CacheLevelStats, SpeechCacheStats
from engine.speech_cache.counts import LookupCounts
from engine.speech_cache.directory import DirectoryStore
from engine.speech_cache.key import SegmentKey
from engine.speech_cache.memory import MemoryLevel
from engine.speech_cache.redis_store import RedisStore
from engine.speech_cache.settings import SpeechCacheSettings
from engine.speech_cache.shared import SharedLevel, SharedStore
from engine.speech_cache.value import CachedSegment

log = logging.getLogger(__name__)

Done = Callable[[SegmentKey, CachedSegment | None], None]

#: Voices forgotten lately, remembered so that a stream (or warm-up) that began before a
#: voice was forgotten cannot store its speech again afterwards (``put(since=...)``).
MAX_FORGOTTEN = 4096


class SpeechCache:
    """Segments by key in an in-process LRU ("memory") and an optional shared level
    ("shared": a host directory or Redis). Thread-safe. With ``enabled`` False it holds
    nothing: every lookup is a miss and nothing is counted."""

    def __init__(
        self, memory: MemoryLevel | None, shared: SharedLevel | None = None, *, enabled: bool
    ) -> None:
        self.enabled = enabled and memory is not None
        self.has_shared = self.enabled and shared is not None
        self._memory = memory if self.enabled else None
        self._shared = shared if self.has_shared else None
        self._memory_counts = LookupCounts()
        self._forgets = 0  # bumped by forget_voice (the cache's epoch)
        self._forgotten: OrderedDict[str, int] = OrderedDict()  # voice digest -> epoch
        self._lock = threading.Lock()

    @classmethod
    def disabled(cls) -> SpeechCache:
        return cls(None, None, enabled=False)

    def get_local(self, key: SegmentKey) -> CachedSegment | None:
        """The in-process level only; never blocks on I/O; counts a memory hit or miss."""
        if self._memory is None:
            return None
        segment = self._memory.get(key.digest())
        if segment is None:
            self._memory_counts.miss(key.backend)
        else:
            self._memory_counts.hit(key.backend)
        return segment

    def contains_local(self, key: SegmentKey) -> bool:
        """Whether the in-process level holds ``key``: not counted as a lookup and not a
        use for the LRU (for warm-up checks, which are not calls). Never blocks on I/O."""
        return self._memory is not None and self._memory.contains(key.digest())

    def epoch(self) -> int:
        """How many voices were forgotten so far. Taken when a stream opens (or a warm-up
        is asked for) and given back to :meth:`put` as ``since``: a segment of a voice
        forgotten after that is not stored (the stream began before the deletion)."""
        with self._lock:
            return self._forgets

    def _forgotten_since(self, voice_digest: str, since: int) -> bool:
        """Whether ``voice_digest`` was forgotten after epoch ``since`` (caller holds the
        lock). Past :data:`MAX_FORGOTTEN` voices, an epoch too old to tell counts as
        forgotten."""
        if not voice_digest:
            return False
        forgotten = self._forgotten.get(voice_digest)
        if forgotten is not None:
            return forgotten > since
        oldest = next(iter(self._forgotten.values()), None)
        return len(self._forgotten) >= MAX_FORGOTTEN and oldest is not None and since < oldest

    def fetch(self, key: SegmentKey, done: Done) -> None:
        """Look in the shared level on the I/O thread; ``done(key, segment or None)`` is
        called once from that thread (a hit fills the memory level first), or at once on
        the caller's thread when there is no shared level, its queue is full or it is
        backing off after failures. ``done`` must not block."""
        if self._shared is None or self._memory is None:
            done(key, None)
            return
        digest = key.digest()
        memory = self._memory
        since = self.epoch()

        def answer(segment: CachedSegment | None) -> None:
            if segment is not None:
                with self._lock:  # not refilled by a lookup begun before a forget
                    if not self._forgotten_since(key.voice_digest, since):
                        memory.put(digest, key.voice_digest, segment)
            done(key, segment)

        self._shared.lookup(key, digest, answer)

    def put(self, key: SegmentKey, segment: CachedSegment, *, since: int | None = None) -> None:
        """Keep ``segment`` in memory now and queue it for the shared level; never blocks.
        A segment too large to cache (over ~30 s at 48 kHz) is skipped, and so is one of a
        voice forgotten after epoch ``since`` (:meth:`epoch`, taken when its stream began).
        """
        if self._memory is None:
            return
        try:
            segment.check()
        except ValueError as exc:
            log.debug("speech cache: not caching a segment: %s", exc)
            return
        digest = key.digest()
        with self._lock:  # a forget_voice either sees this entry or refuses it
            if since is not None and self._forgotten_since(key.voice_digest, since):
                log.debug("speech cache: not caching a segment of a forgotten voice")
                return
            self._memory.put(digest, key.voice_digest, segment)
            if self._shared is not None:
                self._shared.write(key, digest, segment)  # queued before a later forget

    def levels_holding(self, key: SegmentKey) -> tuple[str, ...]:
        """The levels holding ``key``: a subset of ("memory", "shared"). May block up to
        about the lookup timeout: call it off the coordinator thread and the event loop."""
        if self._memory is None:
            return ()
        digest = key.digest()
        levels: list[str] = []
        if self._memory.contains(digest):
            levels.append("memory")
        if self._shared is not None and self._shared.contains(key, digest):
            levels.append("shared")
        return tuple(levels)

    def forget_voice(self, voice_digest: str) -> None:
        """Remove every entry of ``voice_digest`` from every level (blocks briefly: the
        shared level's removal runs after the writes queued before it, up to 5 s)."""
        if self._memory is None or not voice_digest:
            return  # "" is every built-in voice: never forgotten
        with self._lock:
            self._forgets += 1
            self._forgotten[voice_digest] = self._forgets
            self._forgotten.move_to_end(voice_digest)
            while len(self._forgotten) > MAX_FORGOTTEN:
                self._forgotten.popitem(last=False)
        self._memory.forget_voice(voice_digest)
        if self._shared is not None and not self._shared.forget_voice(voice_digest):
            log.warning("speech cache: the shared level may still hold a forgotten voice")

    def stats(self) -> SpeechCacheStats:
        if self._memory is None:
            return SpeechCacheStats(enabled=False)
        hits, misses, errors = self._memory_counts.snapshot()
        entries, size, evictions = self._memory.usage()
        levels = [
            CacheLevelStats(
                level="memory",
                store="memory",
                hits=hits,
                misses=misses,
                entries=entries,
                bytes=size,
                evictions=evictions,
                errors=errors,
            )
        ]
        if self._shared is not None:
            levels.append(self._shared.stats())
        return SpeechCacheStats(enabled=True, levels=tuple(levels))

    def close(self) -> None:
        if self._shared is not None:
            self._shared.close()


def open_shared_store(settings: SpeechCacheSettings) -> SharedStore | None:
    """The shared store the settings name, or None (off, or it cannot be opened: the
    cache then runs with its memory level only, and says so)."""
    kind = settings.shared_store
    timeout_s = settings.timeout_ms / 1000
    try:
        if kind == "redis" and settings.redis_url:
            return RedisStore(
                settings.redis_url,
                timeout_s=timeout_s,
                ttl_s=settings.ttl_s,
                prefix=settings.redis_prefix,
            )
        if kind == "directory":
            return DirectoryStore(
                settings.cache_directory,
                budget_bytes=settings.shared_mb * 1024 * 1024,
                ttl_s=settings.ttl_s,
            )
    except (OSError, ValueError) as exc:
        log.warning("speech cache: no shared level (%s store: %s)", kind, exc)
    return None


def open_speech_cache(settings: SpeechCacheSettings) -> SpeechCache:
    """The cache the settings describe (``enabled`` False: one that holds nothing)."""
    if not settings.enabled:
        return SpeechCache.disabled()
    memory = MemoryLevel(settings.memory_mb * 1024 * 1024)
    store = open_shared_store(settings)
    shared = None
    if store is not None:
        shared = SharedLevel(store, timeout_s=settings.timeout_ms / 1000)
    return SpeechCache(memory, shared, enabled=True)
