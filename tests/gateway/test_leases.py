"""Tests for gateway.leases against a real Redis.

The module starts its own ``redis-server`` on a free port (no persistence) so that the
outage tests can stop and restart it; every test uses its own key prefix.  Leases last
1 s and are renewed every 0.2 s, so "one lease period" is short enough to wait for.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from redis.crc import key_slot

from gateway.leases import (
    ACQUIRE_LUA,
    EXTEND_LUA,
    LEASE_LOST,
    LIMITS_UNAVAILABLE,
    RELEASE_LUA,
    TENANT_LIMIT,
    Lease,
    LeaseError,
    LeaseSettings,
    Policy,
    TenantLeases,
    lease_key,
)

REPO = Path(__file__).resolve().parents[2]
LEASE_S = 1.0
RENEW_S = 0.2
TIMEOUT_S = 0.3
LEASE_MS = round(LEASE_S * 1000)

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server")


# --------------------------------------------------------------------------- Redis server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RedisServer:
    """A throwaway ``redis-server`` that can be stopped and restarted on the same port."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        if self.running:
            return
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        probe = redis.Redis(port=self.port, socket_connect_timeout=0.2, socket_timeout=0.2)
        deadline = time.monotonic() + 10
        try:
            while True:
                try:
                    if probe.ping():
                        return
                except redis.RedisError:
                    if time.monotonic() > deadline or self.proc.poll() is not None:
                        raise
                    time.sleep(0.02)
        finally:
            probe.close()

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def server(redis_server: RedisServer) -> RedisServer:
    redis_server.start()  # an outage test may have left it stopped
    return redis_server


@pytest.fixture
async def client(server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    r = aioredis.Redis(port=server.port, socket_connect_timeout=0.5, socket_timeout=0.5)
    yield r
    await r.aclose()


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


# --------------------------------------------------------------------------- gateways


@dataclass
class Gateway:
    """One "gateway instance": a TenantLeases with recorded callbacks."""

    leases: TenantLeases
    store_errors: list[str] = field(default_factory=list)
    lost: list[Lease] = field(default_factory=list)


class Gateways:
    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self.made: list[TenantLeases] = []

    def __call__(
        self,
        instance_id: str,
        *,
        policy: Policy = "fail-open",
        redis_client: aioredis.Redis | bool | None = True,
        timeout_s: float = TIMEOUT_S,
    ) -> Gateway:
        settings = LeaseSettings(
            lease_s=LEASE_S,
            renew_every_s=RENEW_S,
            policy=policy,
            key_prefix=self.prefix,
            timeout_s=timeout_s,
        )
        r: aioredis.Redis | None
        if redis_client is True:
            r = self.client
        elif redis_client is False:
            r = None
        else:
            r = redis_client
        store_errors: list[str] = []
        lost: list[Lease] = []
        leases = TenantLeases(
            r,
            settings,
            instance_id=instance_id,
            on_store_error=store_errors.append,
            on_lost=lost.append,
        )
        self.made.append(leases)
        return Gateway(leases, store_errors, lost)


@pytest.fixture
async def gateways(client: aioredis.Redis, prefix: str) -> AsyncIterator[Gateways]:
    made = Gateways(client, prefix)
    yield made
    for leases in made.made:
        await leases.stop()


async def refused(gw: Gateway, tenant: str, limit: int, session_id: str) -> str:
    with pytest.raises(LeaseError) as info:
        await gw.leases.acquire(tenant, limit, session_id)
    return info.value.code


async def redis_now_ms(client: aioredis.Redis) -> int:
    sec, usec = await client.time()
    return int(sec) * 1000 + int(usec) // 1000


async def eventually(check: Any, timeout: float, step: float = 0.02) -> float:
    """Poll the async ``check`` until true; return the seconds it took."""
    start = time.monotonic()
    while True:
        if await check():
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            pytest.fail(f"condition not met within {timeout} s")
        await asyncio.sleep(step)


# --------------------------------------------------------------------------- limits


async def test_acquire_up_to_the_limit_then_tenant_limit(
    gateways: Gateways, client: aioredis.Redis
) -> None:
    gw = gateways("gw-a")
    leases = [await gw.leases.acquire("acme", 3, f"s{i}") for i in range(3)]
    assert [x.local_only for x in leases] == [False] * 3
    assert [x.member for x in leases] == ["gw-a:s0", "gw-a:s1", "gw-a:s2"]
    assert await refused(gw, "acme", 3, "s3") == TENANT_LIMIT
    assert gw.leases.local_count("acme") == 3
    assert await client.zcard(gw.leases.key("acme")) == 3
    assert gw.store_errors == []
    # A token with a lower limit is refused at once; limit 0 allows nothing.
    assert await refused(gw, "acme", 2, "s4") == TENANT_LIMIT
    assert await refused(gw, "other", 0, "s5") == TENANT_LIMIT


async def test_release_frees_a_slot_and_is_idempotent(
    gateways: Gateways, client: aioredis.Redis
) -> None:
    gw = gateways("gw-a")
    first = await gw.leases.acquire("acme", 2, "s1")
    await gw.leases.acquire("acme", 2, "s2")
    assert await refused(gw, "acme", 2, "s3") == TENANT_LIMIT
    await gw.leases.release(first)
    assert gw.leases.local_count("acme") == 1
    assert await client.zscore(gw.leases.key("acme"), first.member) is None
    again = await gw.leases.acquire("acme", 2, "s3")
    await gw.leases.release(first)  # twice: nothing happens, s3 keeps its slot
    assert await client.zscore(gw.leases.key("acme"), again.member) is not None
    assert gw.leases.local_count("acme") == 2
    with pytest.raises(ValueError):
        await gw.leases.acquire("acme", 5, "s3")  # this session already holds a lease


async def test_two_gateways_enforce_one_tenant_limit(gateways: Gateways) -> None:
    a, b = gateways("gw-a"), gateways("gw-b")
    held = [await a.leases.acquire("acme", 3, "a1"), await a.leases.acquire("acme", 3, "a2")]
    held.append(await b.leases.acquire("acme", 3, "b1"))
    assert await refused(a, "acme", 3, "a3") == TENANT_LIMIT
    assert await refused(b, "acme", 3, "b2") == TENANT_LIMIT
    await b.leases.release(held[2])
    await a.leases.acquire("acme", 3, "a3")
    assert (a.leases.local_count("acme"), b.leases.local_count("acme")) == (3, 0)

    # Concurrent acquires from both gateways: exactly `limit` win.
    results = await asyncio.gather(
        *(gw.leases.acquire("race", 4, f"r{i}") for i in range(10) for gw in (a, b)),
        return_exceptions=True,
    )
    granted = [r for r in results if isinstance(r, Lease)]
    errors = [r for r in results if isinstance(r, LeaseError)]
    assert len(granted) == 4
    assert len(errors) == 16 and {e.code for e in errors} == {TENANT_LIMIT}
    assert a.leases.local_count("race") + b.leases.local_count("race") == 4


async def test_tenants_are_independent(gateways: Gateways) -> None:
    a, b = gateways("gw-a"), gateways("gw-b")
    await a.leases.acquire("acme", 1, "s1")
    assert await refused(b, "acme", 1, "s2") == TENANT_LIMIT
    await b.leases.acquire("globex", 1, "s2")
    await a.leases.acquire("initech", 1, "s3")
    assert a.leases.local_count("acme") == 1 and a.leases.local_count("globex") == 0


async def test_same_member_extends_instead_of_taking_a_second_slot(
    gateways: Gateways, client: aioredis.Redis
) -> None:
    # Two TenantLeases with one instance id stand for the same gateway registering the
    # same session twice (ACQUIRE's "member exists: just extend" branch).
    a, twin = gateways("gw"), gateways("gw")
    await a.leases.acquire("acme", 1, "s1")
    lease = await twin.leases.acquire("acme", 1, "s1")
    assert not lease.local_only
    assert await client.zrange(a.leases.key("acme"), 0, -1) == [b"gw:s1"]


# --------------------------------------------------------------------------- keys and clock


async def test_keys_carry_the_tenant_hash_tag(
    gateways: Gateways, client: aioredis.Redis, prefix: str
) -> None:
    gw = gateways("gw-a")
    await gw.leases.acquire("acme", 2, "s1")
    await gw.leases.acquire("globex", 2, "s2")
    keys = sorted(
        k.decode() if isinstance(k, bytes) else k for k in await client.keys(f"*{prefix}*")
    )
    assert keys == [f"{{{prefix}:tenant:acme}}:leases", f"{{{prefix}:tenant:globex}}:leases"]
    assert keys[0] == lease_key(prefix, "acme") == gw.leases.key("acme")
    # Redis Cluster hashes only the tag: the key lives in the tenant's slot.
    assert key_slot(keys[0].encode()) == key_slot(f"{prefix}:tenant:acme".encode())
    ttl = await client.pttl(keys[0])
    assert 0 < ttl <= 2 * LEASE_MS


async def test_deadlines_come_from_redis_time(
    gateways: Gateways, client: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    gw = gateways("gw-a")
    real_time = time.time
    before = await redis_now_ms(client)
    with monkeypatch.context() as m:
        m.setattr(time, "time", lambda: real_time() + 3600.0)  # this gateway's clock is off
        lease = await gw.leases.acquire("acme", 1, "s1")
    score = await client.zscore(gw.leases.key("acme"), lease.member)
    assert score is not None
    after = await redis_now_ms(client)
    # Redis's TIME while the acquire ran, plus the lease: bracketed on Redis's own clock
    # (not within some ms of the test's "now", which a loaded machine can stretch).
    assert before + LEASE_MS <= score <= after + LEASE_MS


# --------------------------------------------------------------------------- Lua scripts


async def test_scripts_drop_and_report_expired_members(client: aioredis.Redis, prefix: str) -> None:
    key = lease_key(prefix, "acme")
    now = await redis_now_ms(client)
    await client.zadd(key, {"dead": now - 5, "dead2": now - 1, "live": now + 10_000})
    # ACQUIRE drops expired leases before counting: 1 live + the new one fit in 2.
    assert await client.eval(ACQUIRE_LUA, 1, key, "new", 2, LEASE_MS) == 1
    assert await client.zscore(key, "dead") is None and await client.zscore(key, "dead2") is None
    assert await client.eval(ACQUIRE_LUA, 1, key, "third", 2, LEASE_MS) == 0
    # EXTEND: 1 for a live member; 0 (and removed) for an expired one; 0 for a missing one.
    await client.zadd(key, {"stale": now - 1})
    assert await client.eval(EXTEND_LUA, 1, key, LEASE_MS, "live", "stale", "missing") == [1, 0, 0]
    assert await client.zscore(key, "stale") is None
    live = await client.zscore(key, "live")
    assert live is not None and live <= await redis_now_ms(client) + LEASE_MS
    assert await client.eval(RELEASE_LUA, 1, key, "live", "new") == 2
    assert await client.exists(key) == 0


async def test_acquire_is_one_evalsha_and_flushed_scripts_are_loaded_again(
    gateways: Gateways, client: aioredis.Redis
) -> None:
    gw = gateways("gw-a")
    await gw.leases.acquire("acme", 5, "s0")
    await client.config_resetstat()
    await gw.leases.acquire("acme", 5, "s1")
    stats = await client.info("commandstats")
    assert stats["cmdstat_evalsha"]["calls"] == 1
    assert not [name for name in stats if "script" in name or name == "cmdstat_eval"]
    await client.script_flush()  # as after a Redis restart: NOSCRIPT, load, run again
    await gw.leases.acquire("acme", 5, "s2")
    assert gw.store_errors == []
    assert await client.zcard(gw.leases.key("acme")) == 3


# --------------------------------------------------------------------------- renewal


@pytest.mark.realtime  # renewed every 0.2 s, never 0.4 s late: runs alone
async def test_renewal_keeps_leases_alive_past_lease_s(
    gateways: Gateways, client: aioredis.Redis
) -> None:
    a, b = gateways("gw-a"), gateways("gw-b")
    await a.leases.start()
    lease = await a.leases.acquire("acme", 1, "s1")
    await asyncio.sleep(LEASE_S * 1.6)
    assert await refused(b, "acme", 1, "s2") == TENANT_LIMIT
    score = await client.zscore(a.leases.key("acme"), lease.member)
    assert score is not None and score > await redis_now_ms(client) + LEASE_MS - 2 * RENEW_S * 1000
    assert not lease.lost and a.lost == [] and a.store_errors == []


CHILD = """
import asyncio, sys
import redis.asyncio as aioredis
from gateway.leases import LeaseSettings, TenantLeases

async def main():
    port, prefix, limit = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    r = aioredis.Redis(port=port)
    settings = LeaseSettings(lease_s=float(sys.argv[4]), renew_every_s=float(sys.argv[5]),
                             key_prefix=prefix, timeout_s=float(sys.argv[6]))
    leases = TenantLeases(r, settings, instance_id="victim")
    for i in range(limit):
        await leases.acquire("acme", limit, f"s{i}")
    await leases.start()
    print("ready", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


@pytest.mark.realtime  # free within a lease + 0.25 s: runs alone
async def test_sigkilled_gateway_frees_its_slots_within_one_lease_period(
    gateways: Gateways, server: RedisServer, prefix: str
) -> None:
    survivor = gateways("gw-b")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD,
        str(server.port),
        prefix,
        "2",
        str(LEASE_S),
        str(RENEW_S),
        str(TIMEOUT_S),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        assert await asyncio.wait_for(proc.stdout.readline(), 15) == b"ready\n"
        await asyncio.sleep(LEASE_S * 1.3)  # the victim renews: still full after a lease
        assert await refused(survivor, "acme", 2, "s1") == TENANT_LIMIT
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        killed_at = time.monotonic()
        assert await refused(survivor, "acme", 2, "s1") == TENANT_LIMIT

        async def slot_free() -> bool:
            try:
                await survivor.leases.acquire("acme", 2, "s1")
            except LeaseError:
                return False
            return True

        await eventually(slot_free, timeout=LEASE_S * 2)
        assert time.monotonic() - killed_at <= LEASE_S + 0.25
        await survivor.leases.acquire("acme", 2, "s2")  # both of the victim's slots
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.realtime  # reported within 1 s: runs alone (Makefile)
async def test_stall_longer_than_a_lease_reports_the_lease_lost(
    gateways: Gateways, client: aioredis.Redis
) -> None:
    a, b = gateways("gw-a"), gateways("gw-b")
    await a.leases.start()
    lease = await a.leases.acquire("acme", 1, "s1")
    key = a.leases.key("acme")
    first = await client.zscore(key, lease.member)

    async def renewed() -> bool:
        return await client.zscore(key, lease.member) != first

    await eventually(renewed, timeout=2.0, step=0.005)
    await asyncio.sleep(0.05)  # between two renewal rounds
    time.sleep(LEASE_S * 1.3)  # noqa: ASYNC251 -- the stall: the event loop is blocked

    async def lost() -> bool:
        return bool(a.lost)

    await eventually(lost, timeout=1.0)
    assert a.lost == [lease] and lease.lost
    assert a.store_errors == []
    assert a.leases.local_count("acme") == 1  # until the gateway has stopped the session
    await b.leases.acquire("acme", 1, "s2")  # the expired lease's slot is free
    await asyncio.sleep(RENEW_S * 2)
    assert a.lost == [lease]  # reported once, no longer renewed
    await a.leases.release(lease)
    assert a.leases.local_count("acme") == 0
    assert await client.zscore(key, "gw-b:s2") is not None  # release did not touch it
    assert LEASE_LOST == "lease_lost"


@pytest.mark.realtime  # within 1 s: runs alone (Makefile)
async def test_lease_gone_without_a_stall_is_registered_again_or_lost_when_full(
    gateways: Gateways, client: aioredis.Redis
) -> None:
    a, b = gateways("gw-a"), gateways("gw-b")
    await a.leases.start()
    kept = await a.leases.acquire("acme", 1, "s1")
    key = a.leases.key("acme")
    # Redis lost the entry (failover, restart without data): nobody else took the slot.
    await client.zrem(key, kept.member)

    async def back() -> bool:
        return await client.zscore(key, kept.member) is not None

    await eventually(back, timeout=1.0)
    assert not kept.lost and a.lost == []

    # The entry vanishes and another gateway takes the slot before the next renewal.
    taken = await a.leases.acquire("globex", 1, "s2")
    await client.zrem(a.leases.key("globex"), taken.member)
    await b.leases.acquire("globex", 1, "s3")

    async def lost() -> bool:
        return bool(a.lost)

    await eventually(lost, timeout=1.0)
    assert a.lost == [taken] and taken.lost and not kept.lost


# --------------------------------------------------------------------------- Redis down


async def test_fail_open_grants_local_leases_up_to_the_limit(
    gateways: Gateways, client: aioredis.Redis, server: RedisServer
) -> None:
    gw = gateways("gw-a", policy="fail-open")
    await asyncio.to_thread(server.stop)
    one = await gw.leases.acquire("acme", 2, "s1")
    two = await gw.leases.acquire("acme", 2, "s2")
    assert one.local_only and two.local_only
    assert gw.store_errors == ["acquire", "acquire"]
    assert await refused(gw, "acme", 2, "s3") == TENANT_LIMIT
    await gw.leases.release(one)  # never raises; local-only: no Redis call
    assert gw.leases.local_count("acme") == 1
    await asyncio.to_thread(server.start)
    # Redis is back: new leases are registered in Redis again, local ones stay local.
    three = await gw.leases.acquire("acme", 2, "s3")
    assert not three.local_only
    assert await client.zrange(gw.leases.key("acme"), 0, -1) == [b"gw-a:s3"]
    assert await refused(gw, "acme", 2, "s4") == TENANT_LIMIT  # local count: s2 + s3


async def test_fail_closed_refuses_with_limits_unavailable(
    gateways: Gateways, client: aioredis.Redis, server: RedisServer
) -> None:
    gw = gateways("gw-a", policy="fail-closed")
    await asyncio.to_thread(server.stop)
    assert await refused(gw, "acme", 2, "s1") == LIMITS_UNAVAILABLE
    assert gw.store_errors == ["acquire"]
    assert gw.leases.local_count("acme") == 0
    await asyncio.to_thread(server.start)
    lease = await gw.leases.acquire("acme", 2, "s1")
    assert not lease.local_only
    assert await client.zscore(gw.leases.key("acme"), lease.member) is not None


@pytest.mark.realtime  # stop within 0.8 s: runs alone (Makefile)
async def test_release_and_stop_never_raise_when_redis_is_down(
    gateways: Gateways, server: RedisServer
) -> None:
    gw = gateways("gw-a")
    await gw.leases.start()
    one = await gw.leases.acquire("acme", 3, "s1")
    await gw.leases.acquire("acme", 3, "s2")
    await asyncio.to_thread(server.stop)
    await gw.leases.release(one)
    assert gw.store_errors == ["release"]
    assert gw.leases.local_count("acme") == 1
    started = time.monotonic()
    await gw.leases.stop()
    assert time.monotonic() - started < TIMEOUT_S + 0.5
    assert gw.store_errors[-1] == "release"
    assert gw.leases.local_count("acme") == 0


@pytest.mark.realtime  # back within 1.5 s: runs alone (Makefile)
async def test_outage_does_not_lose_leases_and_they_are_registered_again(
    gateways: Gateways, client: aioredis.Redis, server: RedisServer
) -> None:
    gw = gateways("gw-a")
    await gw.leases.start()
    lease = await gw.leases.acquire("acme", 3, "s1")
    await asyncio.to_thread(server.stop)
    local = await gw.leases.acquire("acme", 3, "s2")  # fail-open during the outage
    assert local.local_only
    await asyncio.sleep(LEASE_S * 1.3)  # longer than a lease: renewals keep failing
    assert "renew" in gw.store_errors
    assert gw.lost == [] and not lease.lost
    await asyncio.to_thread(server.start)  # an empty Redis: the entry is gone

    async def back() -> bool:
        return await client.zscore(gw.leases.key("acme"), lease.member) is not None

    await eventually(back, timeout=1.5)
    await asyncio.sleep(RENEW_S * 2)
    assert gw.lost == [] and not lease.lost
    assert await client.zrange(gw.leases.key("acme"), 0, -1) == [b"gw-a:s1"]  # s2 stays local
    assert gw.leases.local_count("acme") == 2


@pytest.mark.realtime  # answered within 0.6 s: runs alone (Makefile)
async def test_unresponsive_redis_times_out(gateways: Gateways) -> None:
    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while await reader.read(4096):
                pass  # never answers
        writer.close()

    mute = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = mute.sockets[0].getsockname()[1]
    r = aioredis.Redis(port=port)
    try:
        gw = gateways("gw-a", redis_client=r, timeout_s=0.2)
        closed = gateways("gw-b", redis_client=r, timeout_s=0.2, policy="fail-closed")
        started = time.monotonic()
        lease = await gw.leases.acquire("acme", 1, "s1")
        assert time.monotonic() - started < 0.6
        assert lease.local_only and gw.store_errors == ["acquire"]
        started = time.monotonic()
        assert await refused(closed, "acme", 1, "s1") == LIMITS_UNAVAILABLE
        assert time.monotonic() - started < 0.6
        await gw.leases.release(lease)
        assert gw.store_errors == ["acquire"]  # a local-only lease needs no Redis call
    finally:
        await r.aclose()
        mute.close()
        await mute.wait_closed()


# --------------------------------------------------------------------------- life cycle


async def test_stop_releases_leases_and_is_final(
    gateways: Gateways, client: aioredis.Redis
) -> None:
    gw = gateways("gw-a")
    await gw.leases.start()
    with pytest.raises(RuntimeError):
        await gw.leases.start()
    lease = await gw.leases.acquire("acme", 3, "s1")
    await gw.leases.acquire("acme", 3, "s2")
    await gw.leases.acquire("globex", 3, "s3")
    await gw.leases.stop()
    assert await client.exists(gw.leases.key("acme"), gw.leases.key("globex")) == 0
    assert gw.leases.local_count("acme") == 0
    await gw.leases.release(lease)  # after stop: nothing to do
    await gw.leases.stop()  # idempotent
    with pytest.raises(RuntimeError):
        await gw.leases.acquire("acme", 3, "s4")
    assert gw.store_errors == [] and gw.lost == []


async def test_without_redis_only_the_local_limit_applies(gateways: Gateways) -> None:
    gw = gateways("solo", redis_client=False, policy="fail-closed")
    await gw.leases.start()
    leases = [await gw.leases.acquire("acme", 2, f"s{i}") for i in range(2)]
    assert all(x.local_only for x in leases)
    assert await refused(gw, "acme", 2, "s2") == TENANT_LIMIT
    await gw.leases.release(leases[0])
    await gw.leases.acquire("acme", 2, "s2")
    assert gw.store_errors == []


@pytest.mark.parametrize(
    "kwargs",
    [
        {"lease_s": 0.0},
        {"renew_every_s": 0.0},
        {"timeout_s": 0.0},
        {"lease_s": 1.0, "renew_every_s": 0.8, "timeout_s": 0.2},
        {"policy": "fail-sometimes"},
        {"key_prefix": ""},
    ],
)
def test_settings_are_validated(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        LeaseSettings(**kwargs)


def test_default_settings() -> None:
    s = LeaseSettings()
    assert (s.lease_s, s.renew_every_s, s.policy, s.key_prefix, s.timeout_s) == (
        10.0,
        3.0,
        "fail-open",
        "ivr",
        0.5,
    )
    assert s.lease_ms == 10_000
