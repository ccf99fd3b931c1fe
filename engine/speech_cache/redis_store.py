"""The Redis store: segments shared by every instance that uses ``GATEWAY_REDIS_URL``.

Keys (labels and names are keyed hashes, sealing.py; the scope in a hash tag, so one
tenant's entries and its index share a cluster slot):

- ``<prefix>{<scope>}:<voice>:<name>``: an entry, written with ``SET ... EX ttl``;
- ``<prefix>{<scope>}:~index`` (sorted set: member ``<voice>:<name>``, score the write
  time), ``~sizes`` (hash: member -> bytes) and ``~bytes`` (the scope's total): the
  per-tenant quota. Each write runs one Lua script that sets the entry, drops index
  members older than the TTL, and, while the scope is over ``scope_quota``, deletes its
  oldest entries (at most :data:`MAX_EVICTIONS_PER_WRITE` a write): a tenant's flood
  evicts its own entries. The operator's shared scope (``shared_label``) has no quota.

Redis's own ``maxmemory`` with an LRU ``maxmemory-policy`` bounds the whole keyspace;
size it at least the per-tenant quota times the tenants that may fill theirs
(docs/speech-cache.md). Every call is bounded by a timeout (connect and read), and the
client never retries: the cache's shared level decides what a failure means (a miss).
``forget_voice`` and ``purge_scope`` are ``SCAN MATCH`` + ``UNLINK`` in batches.

Two connection pools: lookups (GET, EXISTS) run with the lookup timeout; writes and
removals with ``write_timeout_s`` (1 s), because a 144 KB SET on a busy host can take
longer than a lookup may wait, and only the write thread waits for it. Credentials and
TLS come with the URL (``redis://user:password@host:6379/0``, ``rediss://`` for TLS,
``?ssl_ca_certs=...``), as redis-py reads them.

Entries and bytes are what *this engine* wrote since it started (Redis expires entries by
TTL and may evict them; counting the real keyspace would cost a SCAN of every key).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Final, cast

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from engine.speech_cache.settings import DEFAULT_PREFIX

if TYPE_CHECKING:
    from engine.speech_cache.shared import Address

MAX_EVICTIONS_PER_WRITE: Final = 64
_SCAN_COUNT = 500
_MAX_SCAN_CALLS = 10_000  # forget_voice and purge_scope give up after this many pages

# KEYS: entry, index, sizes, bytes. ARGV: value, ttl_s, now_s, quota (0: none), member,
# max evictions, the scope's entry prefix. Returns the entries evicted. The entries it
# evicts are named from the index (same hash slot as KEYS), not declared in KEYS.
_WRITE = """
local size = string.len(ARGV[1])
local ttl = tonumber(ARGV[2])
redis.call('SET', KEYS[1], ARGV[1], 'EX', ttl)
local old = redis.call('HGET', KEYS[3], ARGV[5])
if old then redis.call('DECRBY', KEYS[4], old) end
redis.call('HSET', KEYS[3], ARGV[5], size)
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[5])
local total = redis.call('INCRBY', KEYS[4], size)
local cutoff = tonumber(ARGV[3]) - ttl
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', cutoff, 'LIMIT', 0, 100)) do
  local s = redis.call('HGET', KEYS[3], m)
  if s then total = redis.call('DECRBY', KEYS[4], s) end
  redis.call('HDEL', KEYS[3], m)
  redis.call('ZREM', KEYS[2], m)
end
local quota = tonumber(ARGV[4])
local evicted = 0
while quota > 0 and total > quota and evicted < tonumber(ARGV[6]) do
  local popped = redis.call('ZPOPMIN', KEYS[2])
  if #popped == 0 then break end
  local m = popped[1]
  local s = redis.call('HGET', KEYS[3], m)
  if s then total = redis.call('DECRBY', KEYS[4], s) end
  redis.call('HDEL', KEYS[3], m)
  redis.call('UNLINK', ARGV[7] .. m)
  evicted = evicted + 1
end
for i = 2, 4 do redis.call('EXPIRE', KEYS[i], ttl) end
return evicted
"""

# KEYS: index, sizes, bytes. ARGV: members removed elsewhere.
_DROP_MEMBERS = """
for _, m in ipairs(ARGV) do
  local s = redis.call('HGET', KEYS[2], m)
  if s then redis.call('DECRBY', KEYS[3], s) end
  redis.call('HDEL', KEYS[2], m)
  redis.call('ZREM', KEYS[1], m)
end
return #ARGV
"""


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
        scope_quota: int = 0,
        shared_label: str = "",
        write_timeout_s: float = 1.0,
        max_connections: int = 4,
    ) -> None:
        self.prefix = prefix
        self.ttl_s = max(1, int(ttl_s))
        self.scope_quota = scope_quota
        self.shared_label = shared_label
        self._reader = _client(url, timeout_s, max_connections)
        self._client = _client(url, max(timeout_s, write_timeout_s), max_connections)
        self._write = self._client.register_script(_WRITE)
        self._drop_members = self._client.register_script(_DROP_MEMBERS)
        self._lock = threading.Lock()
        self._written = 0
        self._written_bytes = 0
        self._evictions = 0

    def scope_prefix(self, scope: str) -> str:
        return f"{self.prefix}{{{scope}}}:"

    def key(self, address: Address) -> str:
        return f"{self.scope_prefix(address.scope)}{address.voice}:{address.name}"

    def _index_keys(self, scope: str) -> list[str]:
        base = self.scope_prefix(scope)
        return [f"{base}~index", f"{base}~sizes", f"{base}~bytes"]

    def get(self, address: Address) -> bytes | None:
        value: Any = self._reader.get(self.key(address))
        return cast("bytes | None", value)

    def contains(self, address: Address) -> bool:
        return bool(self._reader.exists(self.key(address)))

    def set(self, address: Address, data: bytes) -> None:
        quota = 0 if address.scope == self.shared_label else self.scope_quota
        evicted: Any = self._write(
            keys=[self.key(address), *self._index_keys(address.scope)],
            args=[
                data,
                self.ttl_s,
                f"{time.time():.3f}",
                quota,
                f"{address.voice}:{address.name}",
                MAX_EVICTIONS_PER_WRITE,
                self.scope_prefix(address.scope),
            ],
        )
        with self._lock:
            self._written += 1
            self._written_bytes += len(data)
            self._evictions += int(evicted or 0)

    def delete(self, address: Address) -> None:
        self._client.unlink(self.key(address))
        self._drop_members(
            keys=self._index_keys(address.scope), args=[f"{address.voice}:{address.name}"]
        )

    def scope_bytes(self, scope: str) -> int:
        value: Any = self._client.get(self._index_keys(scope)[2])
        return int(value or 0)

    def forget_voice(self, scope: str, voice: str) -> int:
        base = self.scope_prefix(scope)
        removed = self._unlink_matching(f"{_escape_glob(base)}{_escape_glob(voice)}:*")
        if removed:
            self._drop_members(
                keys=self._index_keys(scope),
                args=[key[len(base) :] for key in removed],
            )
        return len(removed)

    def purge_scope(self, scope: str) -> int:
        """Every key of ``scope``: its entries and its index (a tenant's erasure)."""
        removed = self._unlink_matching(f"{_escape_glob(self.scope_prefix(scope))}*")
        return sum(1 for key in removed if ":~" not in key)

    def _unlink_matching(self, pattern: str) -> list[str]:
        removed: list[str] = []
        cursor = 0
        for _ in range(_MAX_SCAN_CALLS):
            page: Any = self._client.scan(cursor, match=pattern, count=_SCAN_COUNT)
            cursor, keys = cast("tuple[int, list[bytes]]", page)
            if keys:
                self._client.unlink(*keys)
                removed += [k.decode("ascii", "replace") for k in keys]
            if cursor == 0:
                break
        return removed

    def usage(self) -> tuple[int, int, int]:
        """(entries, bytes) this engine wrote since it started; the entries its writes
        evicted for the tenants' quotas."""
        with self._lock:
            return self._written, self._written_bytes, self._evictions

    def maintain(self, now: float) -> None:
        pass  # Redis expires entries itself (EX); the quota is kept by each write

    def close(self) -> None:
        self._reader.close()
        self._client.close()
