"""Lookup counters of one cache level: hits and misses per backend, errors, and entries
rejected because they failed authentication or had expired (shared level)."""

from __future__ import annotations

import threading


class LookupCounts:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hits: dict[str, int] = {}
        self._misses: dict[str, int] = {}
        self._errors = 0
        self._rejected = 0

    def hit(self, backend: str) -> None:
        with self._lock:
            self._hits[backend] = self._hits.get(backend, 0) + 1

    def miss(self, backend: str, *, error: bool = False) -> None:
        with self._lock:
            self._misses[backend] = self._misses.get(backend, 0) + 1
            if error:
                self._errors += 1

    def error(self) -> None:
        with self._lock:
            self._errors += 1

    def rejected(self) -> None:
        """An entry that failed authentication (changed, forged, another secret)."""
        with self._lock:
            self._rejected += 1

    @property
    def rejections(self) -> int:
        with self._lock:
            return self._rejected

    def snapshot(self) -> tuple[dict[str, int], dict[str, int], int]:
        """(hits per backend, misses per backend, errors): copies."""
        with self._lock:
            return dict(self._hits), dict(self._misses), self._errors
