"""Cluster-wide per-tenant stream limits: one lease per session in Redis.

The JWT claim ``max_streams`` caps a tenant's concurrent sessions over every gateway
instance that shares a Redis.  Each session holds a *lease*: a member of one sorted set
per tenant whose score is the lease's deadline in milliseconds of **Redis's own clock**
(``TIME`` inside the scripts, never the gateway's clock, so gateways with skewed clocks
agree).  Three atomic Lua scripts do all the work, each touching exactly one key:

- ``ACQUIRE``: drop expired leases (``ZREMRANGEBYSCORE -inf now``), then add the member if
  fewer than ``limit`` remain (or just extend it if it is already there);
- ``EXTEND``: push the deadlines of this instance's live members of one tenant forward; a
  member whose deadline has passed is removed and reported as not extended;
- ``RELEASE``: ``ZREM``.

A gateway killed with SIGKILL stops renewing, so its leases pass their deadlines and the
next ``ACQUIRE`` for that tenant drops them: its slots come back within one lease period.

Keys: ``{<prefix>:tenant:<tenant>}:leases``.  The ``{...}`` hash tag puts every key of a
tenant in one Redis Cluster slot; each script touches that one key only.

One :class:`TenantLeases` per gateway process (the caller passes a random
``instance_id``) owns one renewal task that extends all of its leases every
``renew_every_s`` with one pipelined round trip (one ``EXTEND`` per tenant).  A lease that
``EXTEND`` reports gone after the session failed to renew it for a whole lease period (a
stall: blocked event loop, paused process) is *lost*: ``on_lost(lease)`` is called and the
gateway stops that session with error code ``lease_lost`` (:data:`LEASE_LOST`).

Redis unreachable (connection error, error reply, or no answer within ``timeout_s``):
``on_store_error(op)`` is called (the gateway counts it in a metric) and the policy
decides: *fail-open* grants a local-only lease while this process holds fewer than
``limit`` leases of the tenant (the local limit); *fail-closed* refuses with
``limits_unavailable``.  A renewal that fails because Redis is down does not lose the
lease (an outage is not a stall): renewal keeps retrying, and a lease whose entry expired
or vanished meanwhile (outage longer than a lease, Redis restarted without its data) is
registered again with ``ACQUIRE`` under its limit; only if the tenant is full by then is
it lost.  Local-only leases stay local for their whole life.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from redis.exceptions import NoScriptError, RedisError

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.commands.core import AsyncScript

__all__ = [
    "ACQUIRE_LUA",
    "EXTEND_LUA",
    "LEASE_LOST",
    "LIMITS_UNAVAILABLE",
    "RELEASE_LUA",
    "TENANT_LIMIT",
    "Lease",
    "LeaseError",
    "LeaseSettings",
    "LeaseStore",
    "RedisLeaseStore",
    "StoreUnavailable",
    "TenantLeases",
    "lease_key",
]

log = logging.getLogger(__name__)

TENANT_LIMIT = "tenant_limit"
LIMITS_UNAVAILABLE = "limits_unavailable"
LEASE_LOST = "lease_lost"  # the error code the gateway sends when on_lost fires

Policy = Literal["fail-open", "fail-closed"]
StoreOp = Literal["acquire", "renew", "release"]
Batches = Sequence[tuple[str, Sequence[str]]]  # (tenant key, members) pairs
_Call = tuple["AsyncScript", str, Sequence[str | int]]  # (script, key, arguments)

# Most members passed to one EXTEND/RELEASE call (Lua's unpack and argument limits).
_CHUNK = 500

# Deadlines are milliseconds of Redis's clock.  Lua numbers are doubles: exact for
# millisecond timestamps for the next few hundred thousand years.
_NOW_MS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# The key's TTL (2 lease periods, never shortened) only collects the garbage of a tenant
# nobody renews any more; the deadlines in the scores are what count.
_KEEP_KEY = """
local ttl_ms = 2 * lease_ms
if redis.call('PTTL', key) < ttl_ms then
  redis.call('PEXPIRE', key, ttl_ms)
end
"""

ACQUIRE_LUA = (
    """
-- KEYS[1]: the tenant's lease set.  ARGV: member, limit, lease_ms.
-- Returns 1 (leased, or the member's lease extended) or 0 (the tenant is at its limit).
local key = KEYS[1]
local member = ARGV[1]
local limit = tonumber(ARGV[2])
local lease_ms = tonumber(ARGV[3])
"""
    + _NOW_MS
    + """
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
if not redis.call('ZSCORE', key, member) then
  if redis.call('ZCARD', key) >= limit then
    return 0
  end
end
redis.call('ZADD', key, now + lease_ms, member)
"""
    + _KEEP_KEY
    + """
return 1
"""
)

EXTEND_LUA = (
    """
-- KEYS[1]: the tenant's lease set.  ARGV: lease_ms, member...
-- Returns one 1/0 per member: 1 = deadline moved to now + lease_ms; 0 = the lease had
-- expired (it is removed) or was not there at all.
local key = KEYS[1]
local lease_ms = tonumber(ARGV[1])
"""
    + _NOW_MS
    + """
local deadline = now + lease_ms
local out = {}
local extended = false
for i = 2, #ARGV do
  local member = ARGV[i]
  local score = redis.call('ZSCORE', key, member)
  if score and tonumber(score) > now then
    redis.call('ZADD', key, 'XX', deadline, member)
    out[#out + 1] = 1
    extended = true
  else
    if score then
      redis.call('ZREM', key, member)
    end
    out[#out + 1] = 0
  end
end
if extended then
"""
    + _KEEP_KEY
    + """
end
return out
"""
)

RELEASE_LUA = """
-- KEYS[1]: the tenant's lease set.  ARGV: member...  Returns how many were removed.
return redis.call('ZREM', KEYS[1], unpack(ARGV))
"""


def lease_key(prefix: str, tenant: str) -> str:
    """The tenant's sorted set of leases: ``{<prefix>:tenant:<tenant>}:leases``."""
    return f"{{{prefix}:tenant:{tenant}}}:leases"


class LeaseError(Exception):
    """A lease was refused; ``code`` is the error code for the peer.

    ``tenant_limit``: the tenant already holds ``limit`` sessions (cluster-wide, or in this
    process when Redis is unreachable and the policy is fail-open).
    ``limits_unavailable``: Redis is unreachable and the policy is fail-closed.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class StoreUnavailable(Exception):
    """The lease store did not answer (connection error, error reply or timeout)."""


@dataclass(frozen=True)
class LeaseSettings:
    """``lease_s``: a lease's lifetime without renewal; slots of a dead gateway come back
    within it.  ``renew_every_s``: renewal period; ``renew_every_s + timeout_s`` must be
    shorter than ``lease_s``.  ``timeout_s``: the limit on each Redis round trip."""

    lease_s: float = 10.0
    renew_every_s: float = 3.0
    policy: Policy = "fail-open"
    key_prefix: str = "ivr"
    timeout_s: float = 0.5

    def __post_init__(self) -> None:
        if not self.lease_s > 0:
            raise ValueError(f"lease_s must be positive, got {self.lease_s}")
        if not self.renew_every_s > 0:
            raise ValueError(f"renew_every_s must be positive, got {self.renew_every_s}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")
        if not self.renew_every_s + self.timeout_s < self.lease_s:
            raise ValueError(
                "renew_every_s + timeout_s must be shorter than lease_s "
                f"({self.renew_every_s} + {self.timeout_s} >= {self.lease_s})"
            )
        if self.policy not in ("fail-open", "fail-closed"):
            raise ValueError(f"policy must be 'fail-open' or 'fail-closed', got {self.policy!r}")
        if not self.key_prefix:
            raise ValueError("key_prefix must not be empty")

    @property
    def lease_ms(self) -> int:
        return max(1, round(self.lease_s * 1000))


@dataclass(eq=False)
class Lease:
    """One session's lease.

    ``member`` (``f"{instance_id}:{session_id}"``) is its member in the tenant's lease set;
    ``limit`` is the limit it was granted under (used to register it again after a Redis
    outage); ``local_only`` means it was granted by fail-open while Redis was unreachable
    and lives in this process only; ``lost`` is set before ``on_lost`` is called.
    """

    tenant: str
    session_id: str
    member: str
    limit: int
    local_only: bool
    lost: bool = False
    # Loop time at which the request that last confirmed the lease in Redis was sent.
    _confirmed_at: float = field(default=0.0, init=False, repr=False)
    # A renewal failed because Redis was unreachable since the last confirmation.
    _renew_failed: bool = field(default=False, init=False, repr=False)


class LeaseStore(Protocol):
    """Where leases live.  Every method raises :class:`StoreUnavailable` when the store
    does not answer in time; per-item results that are exceptions are per-key failures."""

    async def acquire(self, items: Sequence[tuple[str, str, int]], lease_ms: int) -> list[Any]:
        """ACQUIRE each (key, member, limit): ``True``/``False`` or an exception, in order."""
        ...

    async def extend(self, batches: Batches, lease_ms: int) -> list[Any]:
        """EXTEND each (key, members): a ``list[bool]`` per batch or an exception, in order."""
        ...

    async def release(self, batches: Batches) -> None:
        """RELEASE each (key, members)."""
        ...


def _chunks(members: Sequence[str]) -> list[Sequence[str]]:
    return [members[i : i + _CHUNK] for i in range(0, len(members), _CHUNK)]


class RedisLeaseStore:
    """:class:`LeaseStore` on ``redis.asyncio``: each method is one pipelined round trip
    of ``EVALSHA`` (no MULTI: every script touches one key), bounded by ``timeout_s``.
    Scripts missing on the server (a restarted Redis) are loaded and the round retried
    once, within the same time limit."""

    def __init__(self, redis: Redis, timeout_s: float) -> None:
        self._redis = redis
        self._timeout_s = timeout_s
        self._acquire = redis.register_script(ACQUIRE_LUA)
        self._extend = redis.register_script(EXTEND_LUA)
        self._release = redis.register_script(RELEASE_LUA)

    async def acquire(self, items: Sequence[tuple[str, str, int]], lease_ms: int) -> list[Any]:
        results = await self._run(
            [(self._acquire, key, [member, limit, lease_ms]) for key, member, limit in items]
        )
        return [r if isinstance(r, BaseException) else bool(r) for r in results]

    async def extend(self, batches: Batches, lease_ms: int) -> list[Any]:
        calls: list[_Call] = []
        shape: list[int] = []  # chunks per batch
        for key, members in batches:
            chunks = _chunks(members)
            shape.append(len(chunks))
            calls.extend((self._extend, key, [lease_ms, *chunk]) for chunk in chunks)
        results = iter(await self._run(calls))
        out: list[Any] = []
        for n in shape:
            flags: list[bool] = []
            failure: BaseException | None = None
            for _ in range(n):
                r = next(results)
                if isinstance(r, BaseException):
                    failure = r
                else:
                    flags.extend(bool(x) for x in r)
            out.append(failure if failure is not None else flags)
        return out

    async def release(self, batches: Batches) -> None:
        calls: list[_Call] = [
            (self._release, key, list(chunk))
            for key, members in batches
            for chunk in _chunks(members)
        ]
        for r in await self._run(calls):
            if isinstance(r, BaseException):
                raise StoreUnavailable(f"release failed: {r!r}") from r

    async def _run(self, calls: Sequence[_Call]) -> list[Any]:
        if not calls:
            return []
        try:
            async with asyncio.timeout(self._timeout_s):
                results = await self._execute(calls)
                missing = {
                    script
                    for (script, _, _), r in zip(calls, results, strict=True)
                    if isinstance(r, NoScriptError)
                }
                if missing:
                    for script in missing:
                        script.sha = await self._redis.script_load(script.script)
                    results = await self._execute(calls)  # every script is idempotent
                return results
        except (RedisError, OSError, TimeoutError) as exc:
            raise StoreUnavailable(repr(exc)) from exc

    async def _execute(self, calls: Sequence[_Call]) -> list[Any]:
        async with self._redis.pipeline(transaction=False) as pipe:
            for script, key, args in calls:
                pipe.evalsha(script.sha, 1, key, *args)
            results: list[Any] = await pipe.execute(raise_on_error=False)
            return results


class TenantLeases:
    """Per-tenant session limits for one gateway process.

    ``redis`` None means no shared store: every lease is local-only under the local limit
    (one gateway instance), with no store errors.  ``on_store_error(op)`` (op is
    ``"acquire"``, ``"renew"`` or ``"release"``) is called once per failed Redis round
    trip; ``on_lost(lease)`` once per lost lease.  Both must be quick and synchronous;
    exceptions they raise are logged and ignored.
    """

    def __init__(
        self,
        redis: Redis | None,
        settings: LeaseSettings,
        *,
        instance_id: str,
        on_store_error: Callable[[str], None] = lambda op: None,
        on_lost: Callable[[Lease], None] = lambda lease: None,
    ) -> None:
        if not instance_id:
            raise ValueError("instance_id must not be empty")
        self.settings = settings
        self.instance_id = instance_id
        self._store: LeaseStore | None = (
            RedisLeaseStore(redis, settings.timeout_s) if redis is not None else None
        )
        self._on_store_error = on_store_error
        self._on_lost = on_lost
        self._leases: dict[str, Lease] = {}  # member -> lease held (not yet released)
        self._counts: dict[str, int] = {}  # tenant -> leases held, of every kind
        self._pending: set[str] = set()  # members being acquired
        self._task: asyncio.Task[None] | None = None
        self._started = False
        self._stopped = False

    # --- public API ---------------------------------------------------------------------

    def key(self, tenant: str) -> str:
        """The tenant's lease set in Redis."""
        return lease_key(self.settings.key_prefix, tenant)

    def local_count(self, tenant: str) -> int:
        """Leases of ``tenant`` held by this process and not yet released: Redis-backed,
        local-only and lost ones (a lost lease's session is still being stopped)."""
        return self._counts.get(tenant, 0)

    async def acquire(self, tenant: str, limit: int, session_id: str) -> Lease:
        """Lease a slot of ``tenant`` for ``session_id`` under ``limit`` (``max_streams``).

        Raises :class:`LeaseError` ``tenant_limit`` when the tenant holds ``limit`` leases
        (cluster-wide; in this process alone when Redis is down and the policy is
        fail-open), ``limits_unavailable`` when Redis is down and the policy is
        fail-closed.  Takes at most ``timeout_s``.  ``ValueError`` if this process already
        holds a lease for ``session_id``; ``RuntimeError`` after :meth:`stop`.  If the
        caller is cancelled while Redis runs the script, the orphaned entry expires
        within one lease period.
        """
        if self._stopped:
            raise RuntimeError("TenantLeases is stopped")
        member = f"{self.instance_id}:{session_id}"
        if member in self._leases or member in self._pending:
            raise ValueError(f"session {session_id!r} already holds a lease")
        if self.local_count(tenant) >= limit:
            # Includes limit <= 0; this process alone already fills the tenant's limit.
            raise LeaseError(TENANT_LIMIT, f"tenant {tenant!r} is at its limit of {limit}")
        lease = Lease(tenant, session_id, member, limit, local_only=self._store is None)
        if self._store is None:
            self._hold(lease)
            return lease
        loop = asyncio.get_running_loop()
        sent_at = loop.time()
        self._pending.add(member)
        try:
            [granted] = await self._store.acquire(
                [(self.key(tenant), member, limit)], self.settings.lease_ms
            )
            if isinstance(granted, BaseException):
                raise StoreUnavailable(repr(granted)) from granted
        except StoreUnavailable as exc:
            self._store_error("acquire", exc)
            if self.settings.policy == "fail-closed":
                raise LeaseError(LIMITS_UNAVAILABLE, "tenant limits are unavailable") from None
            if self.local_count(tenant) >= limit:
                raise LeaseError(
                    TENANT_LIMIT, f"tenant {tenant!r} is at its local limit of {limit}"
                ) from None
            lease.local_only = True
            self._hold(lease)
            return lease
        finally:
            self._pending.discard(member)
        if not granted:
            raise LeaseError(TENANT_LIMIT, f"tenant {tenant!r} is at its limit of {limit}")
        if self._stopped:  # stop() ran meanwhile: nobody would renew or release it
            with contextlib.suppress(StoreUnavailable):
                await self._store.release([(self.key(tenant), [member])])
            raise RuntimeError("TenantLeases is stopped")
        lease._confirmed_at = sent_at
        self._hold(lease)
        return lease

    async def release(self, lease: Lease) -> None:
        """Give the slot back.  Never raises (Redis errors are reported to
        ``on_store_error``; the entry then expires within one lease period); releasing a
        lease twice, or after :meth:`stop`, does nothing."""
        if self._leases.get(lease.member) is not lease:
            return
        self._drop(lease)
        if lease.local_only or lease.lost or self._store is None:
            return
        try:
            await self._store.release([(self.key(lease.tenant), [lease.member])])
        except StoreUnavailable as exc:
            self._store_error("release", exc)
        except Exception:
            log.exception("releasing lease %s failed", lease.member)

    async def start(self) -> None:
        """Start the renewal task (one per instance; none without Redis)."""
        if self._stopped:
            raise RuntimeError("TenantLeases is stopped")
        if self._started:
            raise RuntimeError("TenantLeases is already started")
        self._started = True
        if self._store is not None:
            self._task = asyncio.create_task(self._renew_loop(), name="tenant-leases-renew")

    async def stop(self) -> None:
        """Cancel and await the renewal task, then release every lease still held with
        one round trip (best effort, at most ``timeout_s``).  Final; idempotent."""
        self._stopped = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
        remaining = [lease for lease in self._leases.values() if self._in_redis(lease)]
        self._leases.clear()
        self._counts.clear()
        if remaining and self._store is not None:
            try:
                await self._store.release(self._batches(remaining))
            except StoreUnavailable as exc:
                self._store_error("release", exc)

    # --- renewal ------------------------------------------------------------------------

    async def _renew_loop(self) -> None:
        loop = asyncio.get_running_loop()
        every = self.settings.renew_every_s
        next_at = loop.time() + every
        # Checks the flag as well as relying on cancel(): on Python 3.11, asyncio.wait_for
        # (which redis-py uses to send when socket_timeout is set) can swallow a
        # cancellation that races with the send's completion, so the round would return
        # normally and the loop go on forever.
        while not self._stopped:
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            next_at = loop.time() + every
            try:
                await self._renew_once()
            except Exception:
                log.exception("lease renewal round failed")

    async def _renew_once(self) -> None:
        store = self._store
        leases = [lease for lease in self._leases.values() if self._in_redis(lease)]
        if store is None or not leases:
            return
        by_tenant = self._group(leases)
        sent_at = asyncio.get_running_loop().time()
        try:
            results = await store.extend(
                [(self.key(t), [x.member for x in group]) for t, group in by_tenant.items()],
                self.settings.lease_ms,
            )
        except StoreUnavailable as exc:
            for lease in leases:
                lease._renew_failed = True
            self._store_error("renew", exc)
            return
        failure: BaseException | None = None
        again: list[Lease] = []
        for group, result in zip(by_tenant.values(), results, strict=True):
            if isinstance(result, BaseException):
                failure = result
                for lease in group:
                    lease._renew_failed = True
                continue
            for lease, extended in zip(group, result, strict=True):
                if self._leases.get(lease.member) is not lease:
                    continue  # released while the round was in flight
                if extended:
                    lease._confirmed_at = sent_at
                    lease._renew_failed = False
                elif lease._renew_failed or sent_at - lease._confirmed_at < self.settings.lease_s:
                    # Gone although this process did not miss a lease period: a Redis
                    # outage or a Redis that lost its data. Register it again.
                    again.append(lease)
                else:
                    self._lose(lease, "not renewed for a whole lease period (stall)")
        if failure is not None:
            self._store_error("renew", StoreUnavailable(repr(failure)))
        if again:
            await self._reacquire(store, again)

    async def _reacquire(self, store: LeaseStore, leases: list[Lease]) -> None:
        sent_at = asyncio.get_running_loop().time()
        try:
            results = await store.acquire(
                [(self.key(x.tenant), x.member, x.limit) for x in leases], self.settings.lease_ms
            )
        except StoreUnavailable as exc:
            for lease in leases:
                lease._renew_failed = True
            self._store_error("renew", exc)
            return
        failure: BaseException | None = None
        orphans: list[Lease] = []
        for lease, granted in zip(leases, results, strict=True):
            if isinstance(granted, BaseException):
                failure = granted
                lease._renew_failed = True
            elif self._leases.get(lease.member) is not lease:
                if granted:
                    orphans.append(lease)  # released meanwhile: take it out again
            elif granted:
                log.info("lease %s registered again after a Redis outage", lease.member)
                lease._confirmed_at = sent_at
                lease._renew_failed = False
            else:
                self._lose(lease, "tenant is full after a Redis outage")
        if failure is not None:
            self._store_error("renew", StoreUnavailable(repr(failure)))
        if orphans:
            try:
                await store.release(self._batches(orphans))
            except StoreUnavailable as exc:
                self._store_error("release", exc)

    # --- bookkeeping --------------------------------------------------------------------

    @staticmethod
    def _in_redis(lease: Lease) -> bool:
        return not lease.local_only and not lease.lost

    @staticmethod
    def _group(leases: list[Lease]) -> dict[str, list[Lease]]:
        by_tenant: dict[str, list[Lease]] = {}
        for lease in leases:
            by_tenant.setdefault(lease.tenant, []).append(lease)
        return by_tenant

    def _batches(self, leases: list[Lease]) -> Batches:
        return [
            (self.key(t), [x.member for x in group]) for t, group in self._group(leases).items()
        ]

    def _hold(self, lease: Lease) -> None:
        self._leases[lease.member] = lease
        self._counts[lease.tenant] = self._counts.get(lease.tenant, 0) + 1

    def _drop(self, lease: Lease) -> None:
        del self._leases[lease.member]
        left = self._counts.get(lease.tenant, 0) - 1
        if left > 0:
            self._counts[lease.tenant] = left
        else:
            self._counts.pop(lease.tenant, None)

    def _lose(self, lease: Lease, why: str) -> None:
        lease.lost = True
        log.warning("lease %s of tenant %r lost: %s", lease.member, lease.tenant, why)
        try:
            self._on_lost(lease)
        except Exception:
            log.exception("on_lost callback failed")

    def _store_error(self, op: StoreOp, exc: BaseException) -> None:
        log.warning("lease store unavailable (%s): %s", op, exc)
        try:
            self._on_store_error(op)
        except Exception:
            log.exception("on_store_error callback failed")
