"""The call directory: files on the host, keys with leases in a real Redis."""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.call_directory import (
    HostCallDirectory,
    LocalCallDirectory,
    RedisCallDirectory,
    call_digest,
    remove_worker_calls,
)
from tests.integration.harness import RedisServer, running_redis


def test_digest_separates_tenants_and_is_safe_as_a_name() -> None:
    assert call_digest("acme", "CA1") != call_digest("rival", "CA1")
    assert call_digest("a", "b\0c") != call_digest("a\0b", "c")
    digest = call_digest("acme", "../../etc/passwd")
    assert len(digest) == 32 and all(c in "0123456789abcdef" for c in digest)


async def test_local_directory_knows_no_other_worker() -> None:
    directory = LocalCallDirectory()
    directory.publish("acme", "CA1")
    assert await directory.owner("acme", "CA1") is None


async def test_host_directory_finds_the_worker_holding_a_call(tmp_path: Path) -> None:
    zero = HostCallDirectory(str(tmp_path), 0, "unix:/run/worker-0.sock")
    one = HostCallDirectory(str(tmp_path), 1, "unix:/run/worker-1.sock")
    await zero.start()
    await one.start()
    zero.publish("acme", "CA1")
    assert await one.owner("acme", "CA1") == "unix:/run/worker-0.sock"
    assert await one.owner("rival", "CA1") is None  # tenants are part of the key
    assert await zero.owner("acme", "CA1") is None  # its own calls are local, not relayed
    zero.withdraw("acme", "CA1")
    assert await one.owner("acme", "CA1") is None
    zero.withdraw("acme", "CA1")  # twice: nothing to do


async def test_a_dead_workers_calls_are_removed_by_the_supervisor(tmp_path: Path) -> None:
    zero = HostCallDirectory(str(tmp_path), 0, "unix:/run/worker-0.sock")
    one = HostCallDirectory(str(tmp_path), 1, "unix:/run/worker-1.sock")
    await zero.start()
    await one.start()
    for n in range(3):
        zero.publish("acme", f"CA{n}")
    remove_worker_calls(str(tmp_path), 0)
    assert [await one.owner("acme", f"CA{n}") for n in range(3)] == [None] * 3
    await zero.start()  # the restarted worker
    zero.publish("acme", "CA9")
    assert await one.owner("acme", "CA9") == "unix:/run/worker-0.sock"


async def test_host_directory_stop_withdraws_everything(tmp_path: Path) -> None:
    zero = HostCallDirectory(str(tmp_path), 0, "unix:/a")
    await zero.start()
    zero.publish("acme", "CA1")
    await zero.stop()
    assert not os.path.exists(tmp_path / "calls" / "0")


# -- Redis -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    redis = aioredis.from_url(redis_server.url, socket_timeout=1.0)
    yield redis
    await redis.aclose()


def directory(redis: aioredis.Redis, prefix: str, address: str, lease_s: float = 0.5
              ) -> RedisCallDirectory:  # fmt: skip
    return RedisCallDirectory(redis, prefix, address, lease_s=lease_s, renew_s=lease_s / 5)


async def wait_for(predicate: Callable[[], Awaitable[bool]], timeout: float = 3.0) -> None:
    async with asyncio.timeout(timeout):
        while not await predicate():  # noqa: ASYNC110 - polls Redis
            await asyncio.sleep(0.01)


@pytest.mark.realtime  # 0.5 s leases renewed in time: runs alone (Makefile)
async def test_redis_directory_across_instances(client: aioredis.Redis) -> None:
    prefix = f"cd-{secrets.token_hex(4)}"
    a = directory(client, prefix, "http://10.0.0.1:9001")
    b = directory(client, prefix, "http://10.0.0.2:9001")
    await a.start()
    await b.start()
    try:
        a.publish("acme", "CA1")

        async def b_sees_a() -> bool:
            return await b.owner("acme", "CA1") == "http://10.0.0.1:9001"

        await wait_for(b_sees_a)
        assert await b.owner("rival", "CA1") is None
        assert await a.owner("acme", "CA1") is None  # our own: local
        ttl = await client.pttl(a.key(call_digest("acme", "CA1")))
        assert 0 < ttl <= 500
        await asyncio.sleep(1.2)  # over two lease periods: renewed
        assert await b.owner("acme", "CA1") == "http://10.0.0.1:9001"
        a.withdraw("acme", "CA1")

        async def gone() -> bool:
            return await b.owner("acme", "CA1") is None

        await wait_for(gone)
    finally:
        await a.stop()
        await b.stop()


@pytest.mark.realtime  # each write lands within 0.1 s: runs alone
async def test_a_late_withdrawal_does_not_remove_the_calls_new_owner(
    client: aioredis.Redis,
) -> None:
    """A leg that reconnected elsewhere owns the call now; the old owner's withdrawal
    must leave the new entry alone."""
    prefix = f"cd-{secrets.token_hex(4)}"
    old = directory(client, prefix, "http://old:1", lease_s=5)
    new = directory(client, prefix, "http://new:1", lease_s=5)
    other = directory(client, prefix, "http://other:1", lease_s=5)
    for d in (old, new, other):
        await d.start()
    try:
        old.publish("acme", "CA1")
        await asyncio.sleep(0.1)
        new.publish("acme", "CA1")
        await asyncio.sleep(0.1)
        old.withdraw("acme", "CA1")
        await asyncio.sleep(0.2)
        assert await other.owner("acme", "CA1") == "http://new:1"
    finally:
        for d in (old, new, other):
            await d.stop()


@pytest.mark.realtime  # published within 0.1 s: runs alone (Makefile)
async def test_an_instance_that_dies_leaves_nothing_after_its_lease(
    client: aioredis.Redis,
) -> None:
    prefix = f"cd-{secrets.token_hex(4)}"
    dying = directory(client, prefix, "http://dying:1", lease_s=0.4)
    await dying.start()
    dying.publish("acme", "CA1")
    await asyncio.sleep(0.1)
    for task in dying._tasks:  # no withdrawal, no renewal: as if killed
        task.cancel()
    await asyncio.gather(*dying._tasks, return_exceptions=True)
    assert await client.exists(dying.key(call_digest("acme", "CA1")))
    await asyncio.sleep(0.6)
    assert not await client.exists(dying.key(call_digest("acme", "CA1")))


@pytest.mark.realtime  # 50 published within 0.2 s: runs alone (Makefile)
async def test_stop_withdraws_every_call(client: aioredis.Redis) -> None:
    prefix = f"cd-{secrets.token_hex(4)}"
    d = directory(client, prefix, "http://a:1", lease_s=30)
    await d.start()
    for n in range(50):
        d.publish("acme", f"CA{n}")
    await asyncio.sleep(0.2)
    assert len(await client.keys(f"{prefix}:call:*")) == 50
    await d.stop()
    assert await client.keys(f"{prefix}:call:*") == []


@pytest.mark.realtime  # an error counted within 0.3 s: runs alone
async def test_unreachable_redis_is_no_owner_not_an_exception() -> None:
    redis = aioredis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2)
    d = RedisCallDirectory(redis, "x", "http://a:1", lease_s=1, renew_s=0.2, timeout_s=0.5)
    await d.start()
    try:
        d.publish("acme", "CA1")
        assert await d.owner("acme", "CA1") is None
        await asyncio.sleep(0.3)
        assert d.errors >= 1
    finally:
        await d.stop()
        await redis.aclose()
