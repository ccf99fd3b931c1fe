"""The in-process level: segments by key digest, per scope, within a byte budget.

Fairness between tenants: each scope (one tenant's, or the operator's shared prompts)
may hold at most ``scope_quota`` bytes, and a scope over it evicts its own least
recently used entries, never another's; when the whole budget is full, the entry that
goes is the least recently used of the scope holding the most bytes. So one tenant's
flood empties only its own share. The operator's shared scope (declared prompts) is
exempt from the per-scope quota (the operator chose what it holds) but not from the
budget. Entries older than ``ttl_s`` are never served (and are dropped when met).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.speech_cache.key import SHARED_SCOPE
from engine.speech_cache.value import CachedSegment


@dataclass(slots=True)
class _Entry:
    segment: CachedSegment
    size: int
    scope: str
    voice_digest: str
    stored_at: float


@dataclass(slots=True)
class _Scope:
    order: OrderedDict[str, None] = field(default_factory=OrderedDict)  # LRU first
    bytes: int = 0


class MemoryLevel:
    """Thread-safe (one lock). Every operation is O(1) but an eviction for the whole
    budget (O(scopes)), :meth:`forget_voice` and :meth:`purge_scope` (O(their entries))."""

    def __init__(
        self,
        budget_bytes: int,
        *,
        scope_quota: int | None = None,
        ttl_s: float = float("inf"),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.budget_bytes = max(0, budget_bytes)
        self.scope_quota = self.budget_bytes if scope_quota is None else max(0, scope_quota)
        self.ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._scopes: dict[str, _Scope] = {}
        self._by_voice: dict[str, set[str]] = {}
        self._bytes = 0
        self._evictions = 0

    def get(self, digest: str) -> CachedSegment | None:
        with self._lock:
            entry = self._entries.get(digest)
            if entry is None:
                return None
            if self._clock() - entry.stored_at > self.ttl_s:
                self._drop(digest, entry)
                return None
            self._scopes[entry.scope].order.move_to_end(digest)
            return entry.segment

    def get_quietly(self, digest: str) -> CachedSegment | None:
        """The segment of ``digest``, not a use for the LRU (None: absent or expired)."""
        with self._lock:
            entry = self._entries.get(digest)
            if entry is None or self._clock() - entry.stored_at > self.ttl_s:
                return None
            return entry.segment

    def contains(self, digest: str) -> bool:
        """Whether the level holds ``digest`` (does not count as a use)."""
        with self._lock:
            entry = self._entries.get(digest)
            return entry is not None and self._clock() - entry.stored_at <= self.ttl_s

    def put(self, digest: str, scope: str, voice_digest: str, segment: CachedSegment) -> bool:
        """Keep ``segment``; False when it cannot fit (larger than the budget, or than
        its scope's quota)."""
        size = segment.size()
        limited = scope != SHARED_SCOPE
        if size > self.budget_bytes or (limited and size > self.scope_quota):
            return False
        with self._lock:
            old = self._entries.get(digest)
            if old is not None:
                self._drop(digest, old)
            own = self._scopes.setdefault(scope, _Scope())
            while limited and own.order and own.bytes + size > self.scope_quota:
                self._evict_from(own)
            while self._entries and self._bytes + size > self.budget_bytes:
                self._evict_from(max(self._scopes.values(), key=lambda s: s.bytes))
            self._entries[digest] = _Entry(segment, size, scope, voice_digest, self._clock())
            own = self._scopes.setdefault(scope, _Scope())  # emptied scopes are removed
            own.order[digest] = None
            own.bytes += size
            self._bytes += size
            self._by_voice.setdefault(voice_digest, set()).add(digest)
            return True

    def forget_voice(self, voice_digest: str) -> int:
        """Drop every segment of ``voice_digest``; returns how many."""
        with self._lock:
            digests = list(self._by_voice.get(voice_digest, ()))
            for digest in digests:
                self._drop(digest, self._entries[digest])
            return len(digests)

    def purge_scope(self, scope: str) -> int:
        """Drop every segment of ``scope``; returns how many."""
        with self._lock:
            own = self._scopes.get(scope)
            digests = list(own.order) if own is not None else []
            for digest in digests:
                self._drop(digest, self._entries[digest])
            return len(digests)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._scopes.clear()
            self._by_voice.clear()
            self._bytes = 0

    def usage(self) -> tuple[int, int, int]:
        """(entries, bytes, evictions so far)."""
        with self._lock:
            return len(self._entries), self._bytes, self._evictions

    def scope_bytes(self, scope: str) -> int:
        with self._lock:
            own = self._scopes.get(scope)
            return own.bytes if own is not None else 0

    def _evict_from(self, scope: _Scope) -> None:
        digest = next(iter(scope.order))
        self._drop(digest, self._entries[digest])
        self._evictions += 1

    def _drop(self, digest: str, entry: _Entry) -> None:
        del self._entries[digest]
        self._bytes -= entry.size
        own = self._scopes[entry.scope]
        del own.order[digest]
        own.bytes -= entry.size
        if not own.order:
            del self._scopes[entry.scope]
        voice = self._by_voice.get(entry.voice_digest)
        if voice is not None:
            voice.discard(digest)
            if not voice:
                del self._by_voice[entry.voice_digest]
