"""The Redis store: segments shared by every instance that uses ``GATEWAY_REDIS_URL``.

Keys: ``<prefix>{<voice label>}:<digest>`` (the voice in a hash tag, so one voice's
entries share a cluster slot), written with ``SET ... EX ttl``; Redis's own
``maxmemory-policy`` (an LRU one) bounds the memory. Every call is bounded by a timeout
(connect and read), and the client never retries: the cache's shared level
decides what a failure means (a miss). ``forget_voice`` is ``SCAN MATCH`` + ``UNLINK`` in
batches.

Two connection pools: lookups (GET, EXISTS) run with the lookup timeout; writes and
removals (SET, UNLINK, SCAN) with ``write_timeout_s`` (1 s), because a 144 KB SET on a
busy host can take longer than a lookup may wait, and only the write thread waits for it.

Entries and bytes are what *this engine* wrote since it started (Redis expires entries by
TTL and may evict them; counting the real keyspace would cost a SCAN of every key).
"""

from __future__ import annotations

import threading
from typing import Any, cast

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from engine.speech_cache.key import voice_label

DEFAULT_PREFIX = "speechcache:v1:"
_SCAN_COUNT = 500
_MAX_SCAN_CALLS = 10_000  # forget_voice gives up after this many SCAN pages


def _client(url: str, timeout_s: float, max_connections: int) -> redis.Redis:
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=timeout_s,
        socket_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
        max_connections=max_connections,
        health_check_interval=0,
    )


def _escape_glob(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


class RedisStore:
    name = "redis"

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float,
        ttl_s: int,
        prefix: str = DEFAULT_PREFIX,
        write_timeout_s: float = 1.0,
        max_connections: int = 4,
    ) -> None:
        self.prefix = prefix
        self.ttl_s = max(1, int(ttl_s))
        self._reader = _client(url, timeout_s, max_connections)
        self._client = _client(url, max(timeout_s, write_timeout_s), max_connections)
        self._lock = threading.Lock()
        self._written = 0
        self._written_bytes = 0

    def key(self, voice_digest: str, digest: str) -> str:
        return f"{self.prefix}{{{voice_label(voice_digest)}}}:{digest}"

    def get(self, voice_digest: str, digest: str) -> bytes | None:
        value: Any = self._reader.get(self.key(voice_digest, digest))
        return cast("bytes | None", value)

    def contains(self, voice_digest: str, digest: str) -> bool:
        return bool(self._reader.exists(self.key(voice_digest, digest)))

    def set(self, voice_digest: str, digest: str, data: bytes) -> None:
        self._client.set(self.key(voice_digest, digest), data, ex=self.ttl_s)
        with self._lock:
            self._written += 1
            self._written_bytes += len(data)

    def delete(self, voice_digest: str, digest: str) -> None:
        self._client.unlink(self.key(voice_digest, digest))

    def forget_voice(self, voice_digest: str) -> int:
        pattern = f"{_escape_glob(self.prefix)}{{{voice_label(voice_digest)}}}:*"
        removed = 0
        cursor = 0
        for _ in range(_MAX_SCAN_CALLS):
            page: Any = self._client.scan(cursor, match=pattern, count=_SCAN_COUNT)
            cursor, keys = cast("tuple[int, list[bytes]]", page)
            if keys:
                removed += int(self._client.unlink(*keys))
            if cursor == 0:
                break
        return removed

    def usage(self) -> tuple[int, int, int]:
        """(entries, bytes) this engine wrote since it started; no evictions counted."""
        with self._lock:
            return self._written, self._written_bytes, 0

    def maintain(self, now: float) -> None:
        pass  # Redis expires entries itself (EX) and bounds memory with maxmemory-policy

    def close(self) -> None:
        self._reader.close()
        self._client.close()
