"""A surge of new sessions on a real gateway: they wait at the accept gate, and all of
them are served (the timing under a surge is measured by tests.bench.storm)."""

from __future__ import annotations

import asyncio

import aiohttp

from tests.integration.harness import GatewayProcess, metric

SURGE = 300
START = '{"type": "start", "voice": "en-us", "format": "mulaw_8000"}'


async def test_a_surge_waits_at_the_gate_and_every_session_starts(
    gateway: GatewayProcess,
) -> None:
    token = gateway.token(max_streams=SURGE + 10)
    deferred_before = await metric(gateway, "gateway_connections_deferred_total")
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def session() -> str:
            async with http.ws_connect(
                gateway.ws_url, headers={"Authorization": f"Bearer {token}"}
            ) as ws:
                await ws.send_str(START)
                msg = await ws.receive(timeout=60)
                return str(msg.json().get("type")) if msg.type is aiohttp.WSMsgType.TEXT else "?"

        results = await asyncio.gather(*(session() for _ in range(SURGE)))
    assert results == ["ready"] * SURGE
    assert await metric(gateway, "gateway_connections_deferred_total") > deferred_before
    assert await metric(gateway, "gateway_connections_waiting") == 0
    assert gateway.readyz()[0] == 200
