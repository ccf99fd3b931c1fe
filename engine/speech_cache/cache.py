"""SpeechCache: the two levels behind one thread-safe object, and how it is opened.

Besides the levels it keeps the *declared* keys: prompts an operator or a tenant asked
to keep warm (the prompts file, the SIP flows, the API). A declared segment is kept
whole even when it carries personal data (docs/speech-cache.md, "What may be kept"),
and an operator's (the shared scope) is heard by every tenant. At most
:data:`MAX_DECLARED` keys, the least recently declared dropped first.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping

from engine.ipc.schema import CacheLevelStats, SpeechCacheStats
from engine.speech_cache.counts import LookupCounts
from engine.speech_cache.directory import DirectoryStore
from engine.speech_cache.key import SHARED_SCOPE, SegmentKey
from engine.speech_cache.memory import MemoryLevel
from engine.speech_cache.private import private_directory, read_or_create_secret
from engine.speech_cache.sealing import Sealer
from engine.speech_cache.settings import SpeechCacheSettings
from engine.speech_cache.shared import SharedLevel, SharedStore
from engine.speech_cache.value import CachedSegment

log = logging.getLogger(__name__)

Done = Callable[[SegmentKey, CachedSegment | None], None]

#: Voices and scopes forgotten lately, remembered so that a stream (or warm-up) that began
#: before one was forgotten cannot store its speech again afterwards (``put(since=...)``).
MAX_FORGOTTEN = 4096
MAX_DECLARED = 100_000


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
        self._forgets = 0  # bumped by forget_voice and purge_scope (the cache's epoch)
        # "voice:<digest>" / "scope:<scope>" -> the epoch it was forgotten at
        self._forgotten: OrderedDict[str, int] = OrderedDict()
        self._declared: OrderedDict[str, None] = OrderedDict()  # key digests
        self._lock = threading.Lock()

    @classmethod
    def disabled(cls) -> SpeechCache:
        return cls(None, None, enabled=False)

    # --- declared prompts ----------------------------------------------------------------

    def declare(self, key: SegmentKey) -> None:
        """``key`` belongs to a declared prompt: kept whole, and (in the shared scope)
        served to every tenant's call of its text."""
        if self._memory is None:
            return
        digest = key.digest()
        with self._lock:
            self._declared[digest] = None
            self._declared.move_to_end(digest)
            while len(self._declared) > MAX_DECLARED:
                self._declared.popitem(last=False)

    def is_declared(self, key: SegmentKey) -> bool:
        with self._lock:
            return key.digest() in self._declared

    # --- lookups -------------------------------------------------------------------------

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

    def peek_local(self, key: SegmentKey) -> CachedSegment | None:
        """The in-process level's segment of ``key``, not counted as a lookup and not a
        use for the LRU (a stream that may not play it yet). Never blocks on I/O."""
        if self._memory is None or not self._memory.contains(key.digest()):
            return None
        return self._memory.get_quietly(key.digest())

    def contains_local(self, key: SegmentKey) -> bool:
        """Whether the in-process level holds ``key``: not counted as a lookup and not a
        use for the LRU (for warm-up checks, which are not calls). Never blocks on I/O."""
        return self._memory is not None and self._memory.contains(key.digest())

    def epoch(self) -> int:
        """How many voices and scopes were forgotten so far. Taken when a stream opens
        (or a warm-up is asked for) and given back to :meth:`put` as ``since``: a segment
        of a voice or scope forgotten after that is not stored (the stream began before
        the deletion)."""
        with self._lock:
            return self._forgets

    def _forgotten_since(self, key: SegmentKey, since: int) -> bool:
        """Whether ``key``'s voice or scope was forgotten after epoch ``since`` (caller
        holds the lock). Past :data:`MAX_FORGOTTEN`, an epoch too old to tell counts as
        forgotten."""
        names = [f"scope:{key.scope}"]
        if key.voice_digest:
            names.append(f"voice:{key.voice_digest}")
        for name in names:
            forgotten = self._forgotten.get(name)
            if forgotten is not None and forgotten > since:
                return True
        oldest = next(iter(self._forgotten.values()), None)
        return len(self._forgotten) >= MAX_FORGOTTEN and oldest is not None and since < oldest

    def _forget(self, name: str) -> None:
        with self._lock:
            self._forgets += 1
            self._forgotten[name] = self._forgets
            self._forgotten.move_to_end(name)
            while len(self._forgotten) > MAX_FORGOTTEN:
                self._forgotten.popitem(last=False)

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
                    if not self._forgotten_since(key, since):
                        memory.put(digest, key.scope, key.voice_digest, segment)
            done(key, segment)

        self._shared.lookup(key, answer)

    def put(self, key: SegmentKey, segment: CachedSegment, *, since: int | None = None) -> None:
        """Keep ``segment`` in memory now and queue it for the shared level; never blocks.
        A segment too large to cache (over ~30 s at 48 kHz) is skipped, and so is one of a
        voice or scope forgotten after epoch ``since`` (:meth:`epoch`, taken when its
        stream began). Whether a segment *may* be kept is the caller's to decide
        (engine/scheduler/retention.py)."""
        if self._memory is None:
            return
        try:
            segment.check()
        except ValueError as exc:
            log.debug("speech cache: not caching a segment: %s", exc)
            return
        digest = key.digest()
        with self._lock:  # a forget either sees this entry or refuses it
            if since is not None and self._forgotten_since(key, since):
                log.debug("speech cache: not caching a segment of a forgotten voice or tenant")
                return
            self._memory.put(digest, key.scope, key.voice_digest, segment)
            if self._shared is not None:
                self._shared.write(key, segment)  # queued before a later forget

    def levels_holding(self, key: SegmentKey) -> tuple[str, ...]:
        """The levels holding ``key``: a subset of ("memory", "shared"). May block up to
        about the lookup timeout: call it off the coordinator thread and the event loop."""
        if self._memory is None:
            return ()
        levels: list[str] = []
        if self._memory.contains(key.digest()):
            levels.append("memory")
        if self._shared is not None and self._shared.contains(key):
            levels.append("shared")
        return tuple(levels)

    # --- removal -------------------------------------------------------------------------

    def forget_voice(self, scope: str, voice_digest: str) -> None:
        """Remove every entry of ``voice_digest`` (a registered voice of ``scope``) from
        every level (blocks briefly: the shared level's removal runs after the writes
        queued before it, up to 5 s)."""
        if self._memory is None or not voice_digest:
            return  # "" is every built-in voice: never forgotten
        self._forget(f"voice:{voice_digest}")
        self._memory.forget_voice(voice_digest)
        if self._shared is not None and not self._shared.forget_voice(scope, voice_digest):
            log.warning("speech cache: the shared level may still hold a forgotten voice")

    def purge_scope(self, scope: str) -> int:
        """Remove every entry of ``scope`` (a tenant's erasure) from every level; the
        entries the memory level held. Blocks up to 30 s for the shared level."""
        if self._memory is None or scope == SHARED_SCOPE:
            return 0
        self._forget(f"scope:{scope}")
        removed = self._memory.purge_scope(scope)
        if self._shared is not None and not self._shared.purge_scope(scope):
            log.warning("speech cache: the shared level may still hold a purged tenant's")
        return removed

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


def speech_cache_secret(settings: SpeechCacheSettings) -> bytes:
    """The secret that names and seals shared entries: ``ENGINE_SPEECH_CACHE_SECRET``, or
    the file ``ENGINE_SPEECH_CACHE_SECRET_FILE`` (created 0600 with a random one when
    missing). Raises :class:`ConfigError` for a file that is not private."""
    if settings.secret:
        return settings.secret.encode("utf-8")
    secret, created = read_or_create_secret(settings.secret_path)
    if created:
        log.info("speech cache: generated a new secret in %s", settings.secret_path)
    if settings.shared_store == "redis":
        log.warning(
            "speech cache: ENGINE_SPEECH_CACHE_SECRET is not set: this host names and seals "
            "its Redis entries with its own secret (%s), so other instances cannot read "
            "them; give every instance the same ENGINE_SPEECH_CACHE_SECRET",
            settings.secret_path,
        )
    return secret


def prepare_speech_cache(environ: Mapping[str, str]) -> None:
    """Make (or check) the private places the settings in ``environ`` name: the cache
    directory and the secret file. Run by the gateway before it starts its engine, so a
    squatted or foreign path stops the gateway at start (exit 2, naming the path) rather
    than an engine restarting for ever; raises :class:`ConfigError`."""
    settings = SpeechCacheSettings.from_env(environ)
    if not settings.enabled or settings.shared_store is None:
        return
    if settings.shared_store == "directory":
        private_directory(settings.cache_directory)
    if not settings.secret:
        read_or_create_secret(settings.secret_path)


def open_shared_store(settings: SpeechCacheSettings, sealer: Sealer) -> SharedStore | None:
    """The shared store the settings name, or None (off). A directory that is not
    private fails loudly (:class:`ConfigError`); a Redis that cannot be reached now is
    not an error (the client connects on use, and the level backs off while it fails)."""
    kind = settings.shared_store
    timeout_s = settings.timeout_ms / 1000
    budget = settings.shared_mb * 1024 * 1024
    shared_label = sealer.label("scope", SHARED_SCOPE)
    if kind == "redis" and settings.redis_url:
        # Imported here: redis-py takes about 0.5 s to import, paid by every engine
        # start-up (tests start hundreds) though most engines have no Redis level.
        from engine.speech_cache.redis_store import RedisStore

        try:
            return RedisStore(
                settings.redis_url,
                timeout_s=timeout_s,
                ttl_s=settings.ttl_s,
                prefix=settings.redis_prefix,
                scope_quota=settings.tenant_quota(budget),
                shared_label=shared_label,
            )
        except (OSError, ValueError) as exc:  # a malformed URL
            log.warning("speech cache: no shared level (redis: %s)", exc)
            return None
    if kind == "directory":
        return DirectoryStore(
            settings.cache_directory,
            budget_bytes=budget,
            ttl_s=settings.ttl_s,
            scope_quota=settings.tenant_quota(budget),
            shared_label=shared_label,
        )
    return None


def open_speech_cache(settings: SpeechCacheSettings) -> SpeechCache:
    """The cache the settings describe (``enabled`` False: one that holds nothing)."""
    if not settings.enabled:
        return SpeechCache.disabled()
    budget = settings.memory_mb * 1024 * 1024
    memory = MemoryLevel(budget, scope_quota=settings.tenant_quota(budget), ttl_s=settings.ttl_s)
    shared = None
    if settings.shared_store is not None:
        sealer = Sealer(speech_cache_secret(settings))
        store = open_shared_store(settings, sealer)
        if store is not None:
            shared = SharedLevel(
                store, sealer, timeout_s=settings.timeout_ms / 1000, ttl_s=settings.ttl_s
            )
    return SpeechCache(memory, shared, enabled=True)
