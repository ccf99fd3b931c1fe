"""Which gateway worker holds a call: the call directory.

A telephony leg lands on whichever worker the kernel (SO_REUSEPORT) or the load balancer
picked, and its IVR application may land on another worker or another instance. Each
worker publishes the calls it holds here, under the tenant and call id, with the address
of its relay listener; a worker that gets an attach for a call it does not hold looks the
call up and relays the application's connection to the owner
(:mod:`gateway.protocols.relay`).

- :class:`RedisCallDirectory` (``GATEWAY_REDIS_URL`` set): one key per call,
  ``<prefix>:call:<digest>``, holding the owner's address, written with a lease
  (``GATEWAY_LEASE_MS``) that the owner renews (every ``GATEWAY_LEASE_RENEW_MS``, one
  pipeline for all its calls). A dead instance's entries expire with their lease.
- :class:`HostCallDirectory` (several workers, no Redis): a file per call under the host
  supervisor's run directory, ``calls/<worker>/<digest>``, holding the owner's address.
  The supervisor removes a dead worker's directory before it starts it again.
- :class:`LocalCallDirectory` (one worker, no Redis): every call is local; nothing to do.

Publishing and withdrawing are called from the call registry's synchronous code; the Redis
form queues them for a writer task of its own (a lookup may miss a call registered less
than a round trip ago: the application gets ``unknown_call`` and may try again).
Tenants are part of the key: one tenant cannot find, or relay to, another's call.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import shutil
from typing import Protocol

from redis.asyncio import Redis
from redis.exceptions import RedisError

log = logging.getLogger(__name__)
DIGEST_CHARS = 32
MAX_PENDING = 100_000  # queued writes, beyond which the oldest go (and are logged)


def call_digest(tenant: str, call_id: str) -> str:
    """A file- and key-safe name for a tenant's call id."""
    named = f"{len(tenant)}:{tenant}:{call_id}"  # the length keeps the two parts apart
    return hashlib.sha256(named.encode()).hexdigest()[:DIGEST_CHARS]


class CallDirectory(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def publish(self, tenant: str, call_id: str) -> None:
        """This worker holds the call from now on."""

    def withdraw(self, tenant: str, call_id: str) -> None:
        """The call is over (or gone from this worker)."""

    async def owner(self, tenant: str, call_id: str) -> str | None:
        """The relay address of the worker holding the call elsewhere; None when no
        other worker or instance does."""


class LocalCallDirectory:
    """One worker and no shared store: a call is here or nowhere."""

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def publish(self, tenant: str, call_id: str) -> None:
        return None

    def withdraw(self, tenant: str, call_id: str) -> None:
        return None

    async def owner(self, tenant: str, call_id: str) -> str | None:
        return None


def worker_calls_dir(run_dir: str, index: int) -> str:
    return os.path.join(run_dir, "calls", str(index))


def remove_worker_calls(run_dir: str, index: int) -> None:
    """The host supervisor's cleanup after worker ``index`` died."""
    shutil.rmtree(worker_calls_dir(run_dir, index), ignore_errors=True)


class HostCallDirectory:
    """The calls of the host's workers, as files in the supervisor's run directory (a
    lookup is a few ``stat`` calls: microseconds)."""

    def __init__(self, run_dir: str, index: int, address: str) -> None:
        self._root = os.path.join(run_dir, "calls")
        self._mine = worker_calls_dir(run_dir, index)
        self._index = str(index)
        self._address = address.encode()

    async def start(self) -> None:
        os.makedirs(self._mine, exist_ok=True)

    async def stop(self) -> None:
        shutil.rmtree(self._mine, ignore_errors=True)

    def publish(self, tenant: str, call_id: str) -> None:
        path = os.path.join(self._mine, call_digest(tenant, call_id))
        try:
            with open(path, "wb") as f:
                f.write(self._address)
        except OSError as exc:
            log.warning("call directory: cannot publish a call: %r", exc)

    def withdraw(self, tenant: str, call_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self._mine, call_digest(tenant, call_id)))

    async def owner(self, tenant: str, call_id: str) -> str | None:
        return self.lookup(tenant, call_id)

    def lookup(self, tenant: str, call_id: str) -> str | None:
        """A few ``stat`` calls and at most one small read on a local file system: too
        short to be worth a thread."""
        digest = call_digest(tenant, call_id)
        try:
            workers = os.listdir(self._root)
        except FileNotFoundError:
            return None
        for worker in workers:
            if worker == self._index:
                continue
            try:
                with open(os.path.join(self._root, worker, digest), "rb") as f:
                    return f.read().decode()
            except (FileNotFoundError, NotADirectoryError):
                continue
        return None


# Removes the key only while it still names us: a call that moved (a reconnecting leg
# that landed elsewhere) must not lose its new entry to our late withdrawal.
_WITHDRAW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisCallDirectory:
    """Calls of every instance sharing a Redis, each entry under a lease."""

    def __init__(
        self,
        redis: Redis,
        prefix: str,
        address: str,
        *,
        lease_s: float,
        renew_s: float,
        timeout_s: float = 1.0,
    ) -> None:
        self._redis = redis
        self._prefix = prefix
        self._address = address
        self._lease_ms = max(1, int(lease_s * 1000))
        self._renew_s = renew_s
        self._timeout_s = timeout_s
        self._held: set[str] = set()
        self._pending: asyncio.Queue[tuple[str, str]] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.errors = 0

    def key(self, digest: str) -> str:
        return f"{self._prefix}:call:{digest}"

    async def start(self) -> None:
        self._pending = asyncio.Queue(MAX_PENDING)
        self._tasks = [
            asyncio.create_task(self._write_loop(), name="call-directory-writes"),
            asyncio.create_task(self._renew_loop(), name="call-directory-renewal"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        held, self._held = list(self._held), set()
        if held:
            with contextlib.suppress(RedisError, OSError, TimeoutError):
                await self._write([("withdraw", digest) for digest in held])

    def publish(self, tenant: str, call_id: str) -> None:
        digest = call_digest(tenant, call_id)
        self._held.add(digest)
        self._enqueue("publish", digest)

    def withdraw(self, tenant: str, call_id: str) -> None:
        digest = call_digest(tenant, call_id)
        self._held.discard(digest)
        self._enqueue("withdraw", digest)

    def _enqueue(self, op: str, digest: str) -> None:
        pending = self._pending
        if pending is None:
            return
        if pending.full():
            dropped = pending.get_nowait()
            log.warning("call directory: write queue full; dropped a %s", dropped[0])
        pending.put_nowait((op, digest))

    async def owner(self, tenant: str, call_id: str) -> str | None:
        try:
            async with asyncio.timeout(self._timeout_s):
                value = await self._redis.get(self.key(call_digest(tenant, call_id)))
        except (RedisError, OSError, TimeoutError) as exc:
            self.errors += 1
            log.warning("call directory: lookup failed: %r", exc)
            return None
        if value is None:
            return None
        address = value.decode() if isinstance(value, bytes) else str(value)
        return None if address == self._address else address

    async def _write(self, ops: list[tuple[str, str]]) -> None:
        """``publish`` (write the entry with a fresh lease) or ``withdraw`` each digest,
        in one pipeline, within the timeout."""
        async with asyncio.timeout(self._timeout_s):
            pipe = self._redis.pipeline(transaction=False)
            for op, digest in ops:
                if op == "publish":
                    pipe.set(self.key(digest), self._address, px=self._lease_ms)
                else:
                    pipe.eval(_WITHDRAW, 1, self.key(digest), self._address)
            await pipe.execute()

    async def _write_loop(self) -> None:
        pending = self._pending
        assert pending is not None
        while True:
            batch = [await pending.get()]
            while not pending.empty() and len(batch) < 500:
                batch.append(pending.get_nowait())
            try:
                await self._write(batch)
            except (RedisError, OSError, TimeoutError) as exc:
                # Entries still held are written again by the renewal (SET, not EXPIRE).
                self.errors += 1
                log.warning("call directory: %d write(s) failed: %r", len(batch), exc)

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self._renew_s)
            held = list(self._held)
            if not held:
                continue
            try:
                await self._write([("publish", digest) for digest in held])
            except (RedisError, OSError, TimeoutError) as exc:
                self.errors += 1
                log.warning("call directory: renewal of %d call(s) failed: %r", len(held), exc)
