"""The in-process level: an LRU of segments within a byte budget."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from engine.speech_cache.value import CachedSegment


@dataclass(slots=True)
class _Entry:
    segment: CachedSegment
    size: int
    voice_digest: str


class MemoryLevel:
    """Segments by key digest, least recently used first, within ``budget_bytes``.

    Thread-safe (one lock; every operation is O(1) but :meth:`forget_voice`, which is
    O(entries of that voice)). A segment larger than the whole budget is not kept.
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = max(0, budget_bytes)
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._by_voice: dict[str, set[str]] = {}
        self._bytes = 0
        self._evictions = 0

    def get(self, digest: str) -> CachedSegment | None:
        with self._lock:
            entry = self._entries.get(digest)
            if entry is None:
                return None
            self._entries.move_to_end(digest)
            return entry.segment

    def contains(self, digest: str) -> bool:
        """Whether the level holds ``digest`` (does not count as a use)."""
        with self._lock:
            return digest in self._entries

    def put(self, digest: str, voice_digest: str, segment: CachedSegment) -> bool:
        """Keep ``segment``, evicting the least recently used; False when it cannot fit."""
        size = segment.size()
        if size > self.budget_bytes:
            return False
        with self._lock:
            old = self._entries.pop(digest, None)
            if old is not None:
                self._drop_accounting(digest, old)
            while self._entries and self._bytes + size > self.budget_bytes:
                victim_digest, victim = self._entries.popitem(last=False)
                self._drop_accounting(victim_digest, victim)
                self._evictions += 1
            self._entries[digest] = _Entry(segment, size, voice_digest)
            self._bytes += size
            self._by_voice.setdefault(voice_digest, set()).add(digest)
            return True

    def forget_voice(self, voice_digest: str) -> int:
        """Drop every segment of ``voice_digest``; returns how many."""
        with self._lock:
            digests = self._by_voice.pop(voice_digest, set())
            for digest in digests:
                entry = self._entries.pop(digest, None)
                if entry is not None:
                    self._bytes -= entry.size
            return len(digests)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._by_voice.clear()
            self._bytes = 0

    def usage(self) -> tuple[int, int, int]:
        """(entries, bytes, evictions so far)."""
        with self._lock:
            return len(self._entries), self._bytes, self._evictions

    def _drop_accounting(self, digest: str, entry: _Entry) -> None:
        self._bytes -= entry.size
        voice = self._by_voice.get(entry.voice_digest)
        if voice is not None:
            voice.discard(digest)
            if not voice:
                del self._by_voice[entry.voice_digest]
