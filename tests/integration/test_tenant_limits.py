"""Per-tenant session limits across gateway instances sharing a real Redis."""

from __future__ import annotations

import asyncio
import secrets
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.harness import GatewayProcess, NativeClient, RedisServer, running_redis

LEASE_MS = 1500


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    with running_redis(tmp_path) as server:
        yield server


def gateway(redis: RedisServer, log: Path, prefix: str, **env: str) -> GatewayProcess:
    return GatewayProcess(
        log,
        GATEWAY_REDIS_URL=redis.url,
        GATEWAY_REDIS_PREFIX=prefix,
        GATEWAY_LEASE_MS=str(LEASE_MS),
        GATEWAY_LEASE_RENEW_MS="300",
        ENGINE_VAD="0",
        **env,
    )


@pytest.fixture
def cluster(redis: RedisServer, tmp_path: Path) -> Iterator[list[GatewayProcess]]:
    prefix = f"lim{secrets.token_hex(4)}"
    gateways = [gateway(redis, tmp_path / f"gateway{i}.log", prefix) for i in range(2)]
    for gw in gateways:
        gw.start()
    yield gateways
    for gw in gateways:
        gw.stop()


async def open_session(
    gw: GatewayProcess, tenant: str = "acme", max_streams: int = 2
) -> tuple[NativeClient, dict[str, Any] | None]:
    token = gw.token(tenant=tenant, max_streams=max_streams)
    client = await NativeClient.connect(gw.ws_url, token)
    await client.send(type="start", voice="en-us", format="mulaw_8000")
    try:
        await client.wait_event("ready", timeout=5)
        return client, None
    except AssertionError:
        return client, client.got.of_type("error")[0]


@pytest.mark.realtime  # a slot free within 0.2 s: runs alone (Makefile)
async def test_limit_holds_across_two_instances(cluster: list[GatewayProcess]) -> None:
    a, b = cluster
    clients = []
    try:
        first, err1 = await open_session(a)
        second, err2 = await open_session(b)
        clients += [first, second]
        assert err1 is None and err2 is None
        for gw in (a, b):
            extra, error = await open_session(gw)
            clients.append(extra)
            assert error is not None and error["code"] == "tenant_limit"
            assert error["retry_after_ms"] > 0
            assert await extra.wait_closed() == 1013
        other, error = await open_session(b, tenant="globex")  # tenants are independent
        clients.append(other)
        assert error is None
        await first.send(type="close")
        await first.wait_closed()
        await asyncio.sleep(0.2)
        again, error = await open_session(b)
        clients.append(again)
        assert error is None  # the released slot is free again
    finally:
        for c in clients:
            await c.aclose()


@pytest.mark.realtime  # free within a lease + 0.5 s: runs alone
async def test_sigkilled_gateway_frees_its_slots_within_a_lease(
    cluster: list[GatewayProcess],
) -> None:
    a, b = cluster
    clients = []
    try:
        for _ in range(2):
            client, error = await open_session(a)
            clients.append(client)
            assert error is None
        blocked, error = await open_session(b)
        clients.append(blocked)
        assert error is not None and error["code"] == "tenant_limit"
        assert a.proc is not None
        a.proc.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        while True:
            client, error = await open_session(b)
            clients.append(client)
            if error is None:
                break
            assert time.monotonic() - killed_at < LEASE_MS / 1000 + 1.0
            await asyncio.sleep(0.1)
        assert time.monotonic() - killed_at <= LEASE_MS / 1000 + 0.5
    finally:
        for c in clients:
            await c.aclose()


async def test_a_stalled_gateway_loses_its_lease(cluster: list[GatewayProcess]) -> None:
    a, b = cluster
    client, error = await open_session(a, max_streams=1)
    taker: NativeClient | None = None
    try:
        assert error is None
        assert a.proc is not None
        a.proc.send_signal(signal.SIGSTOP)  # a long stall: no renewal for two leases
        await asyncio.sleep(2 * LEASE_MS / 1000)
        taker, error = await open_session(b, max_streams=1)
        assert error is None  # the stalled lease expired; the slot went to B
        a.proc.send_signal(signal.SIGCONT)
        lost = await client.wait_event("error", timeout=5)
        assert lost["code"] == "lease_lost"
        assert await client.wait_closed() == 1013
    finally:
        if a.proc is not None:
            a.proc.send_signal(signal.SIGCONT)
        await client.aclose()
        if taker is not None:
            await taker.aclose()


@pytest.mark.parametrize("policy", ["fail-open", "fail-closed"])
async def test_redis_outage_policy(redis: RedisServer, tmp_path: Path, policy: str) -> None:
    gw = gateway(
        redis, tmp_path / "gateway.log", f"pol{secrets.token_hex(4)}", GATEWAY_LEASE_POLICY=policy
    )
    gw.start()
    clients = []
    try:
        redis.stop()
        first, error = await open_session(gw, max_streams=1)
        clients.append(first)
        if policy == "fail-closed":
            assert error is not None and error["code"] == "limits_unavailable"
            assert await first.wait_closed() == 1013
        else:
            assert error is None  # the local limit still applies ...
            second, error = await open_session(gw, max_streams=1)
            clients.append(second)
            assert error is not None and error["code"] == "tenant_limit"
        async with aiohttp.ClientSession() as http:
            text = await (await http.get(gw.base + "/metrics")).text()
        errors = [
            s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == "gateway_lease_store_errors_total" and s.labels.get("policy") == policy
        ]
        assert sum(errors) >= 1
    finally:
        for c in clients:
            await c.aclose()
        gw.stop()
        redis.start()
