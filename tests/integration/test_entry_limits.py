"""Every entry point holds its tenant to the same limit (issue 29, item 3).

One real gateway with every entry point on: the native WebSocket, the four WebSocket legs
(Twilio, Asterisk chan_websocket, jambonz, FreeSWITCH), ``POST /v1/audio/speech``,
AudioSocket and the SIP bridge. Tokens carry ``max_streams=2`` while
``GATEWAY_TENANT_MAX_STREAMS`` is 3: an entry point with a token admits two sessions of
the tenant at once and refuses the third in its own way; AudioSocket and SIP, which carry
no token, bill the tenant of their trusted network (``audiosocket``, ``sip``) under the
setting's 3, and refuse the fourth. Each test ends its sessions; the tenants are distinct
so that no test counts another's.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack

import aiohttp
import numpy as np
import pytest

from gateway.legs.sip.routes import DEFAULT_ROUTES
from tests.bench.sipua import SipCallFailed, SipUac
from tests.integration.audio_fork_peers import FreeSwitchPeer, JambonzPeer, fork_url
from tests.integration.harness import (
    GatewayProcess,
    NativeClient,
    free_port,
    free_udp_port,
    metric,
)
from tests.integration.telephony_peers import AsteriskPeer, TwilioPeer, attach, leg_url
from tests.integration.test_audiosocket import SimulatedAsterisk

pytestmark = pytest.mark.slow

CLAIM = 2  # the tokens' max_streams
DEFAULT = 3  # GATEWAY_TENANT_MAX_STREAMS: the tokenless entry points' limit
TRY_AGAIN_LATER = 1013


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    tmp = tmp_path_factory.mktemp("entry-limits")
    routes = tmp / "routes.toml"
    routes.write_text(DEFAULT_ROUTES)
    low = 40000 + (free_udp_port() % 200) * 100
    gw = GatewayProcess(
        tmp / "gateway.log",
        ENGINE_VAD="0",
        GATEWAY_TENANT_MAX_STREAMS=str(DEFAULT),
        GATEWAY_AUDIOSOCKET_LISTEN=f"127.0.0.1:{free_port()}",
        GATEWAY_SIP_LISTEN=f"127.0.0.1:{free_udp_port()}",
        GATEWAY_SIP_RTP_PORTS=f"{low}-{low + 99}",
        GATEWAY_SIP_ROUTES=str(routes),
    )
    gw.start()
    yield gw
    gw.stop()


@pytest.fixture
async def stack() -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as opened:
        yield opened


def tenant() -> str:
    return f"t{secrets.token_hex(4)}"


async def refusals(gw: GatewayProcess) -> float:
    return await metric(gw, "gateway_rejections_total", reason="tenant_limit")


async def app_for(gw: GatewayProcess, stack: AsyncExitStack, tenant: str) -> NativeClient:
    client = await NativeClient.connect(gw.ws_url, gw.token(tenant=tenant, max_streams=CLAIM))
    stack.push_async_callback(client.aclose)
    return client


async def attached(gw: GatewayProcess, stack: AsyncExitStack, tenant: str, call_id: str) -> None:
    """The call is up: its session started (holds a lease), the call is registered."""

    async def connect(_token: str | None = "") -> NativeClient:
        return await app_for(gw, stack, tenant)

    await attach(connect, call_id, timeout=10)


# --------------------------------------------------------------------------- with a token


async def test_native_sessions_beyond_the_claim_get_tenant_limit(
    gateway: GatewayProcess, stack: AsyncExitStack
) -> None:
    who = tenant()
    for _ in range(CLAIM):
        client = await app_for(gateway, stack, who)
        await client.start()
    extra = await app_for(gateway, stack, who)
    await extra.send(type="start", voice="en-us", format="mulaw_8000")
    error = await extra.wait_event("error")
    assert error["code"] == "tenant_limit" and error["retry_after_ms"] > 0
    assert await extra.wait_closed() == TRY_AGAIN_LATER


@pytest.mark.realtime  # room again within 0.5 s: runs alone (Makefile)
async def test_speech_requests_beyond_the_claim_get_429(gateway: GatewayProcess) -> None:
    """Two requests stream (their bodies unread: each holds its session); the third is a
    429 in OpenAI's shape. Before the fix all three (and six) got 200."""
    token = gateway.token(tenant=tenant(), max_streams=CLAIM)
    body = {"model": "tts-1", "voice": "alloy", "input": "Please hold. " * 300}
    headers = {"Authorization": f"Bearer {token}"}
    url = gateway.base + "/v1/audio/speech"
    async with aiohttp.ClientSession() as http:
        held = []
        try:
            for _ in range(CLAIM):
                response = await http.post(url, json=body, headers=headers)
                held.append(response)
                assert response.status == 200
            before = await refusals(gateway)
            async with http.post(url, json=body, headers=headers) as refused:
                assert refused.status == 429
                assert int(refused.headers["Retry-After"]) >= 1
                error = (await refused.json())["error"]
            assert error["code"] == "tenant_limit" and error["type"] == "rate_limit_error"
            assert await refusals(gateway) == before + 1
        finally:
            for response in held:
                response.close()
        await asyncio.sleep(0.5)  # the held sessions end: the tenant has room again
        async with http.post(url, json={**body, "input": "Hello."}, headers=headers) as again:
            assert again.status == 200
            await again.read()


Leg = TwilioPeer | AsteriskPeer | JambonzPeer | FreeSwitchPeer
LegOpener = Callable[[GatewayProcess, AsyncExitStack, str], Awaitable[tuple[str, Leg]]]


async def twilio_leg(gw: GatewayProcess, stack: AsyncExitStack, who: str) -> tuple[str, Leg]:
    peer = await TwilioPeer.connect(leg_url(gw, "twilio"))
    stack.push_async_callback(peer.aclose)
    await peer.begin({"token": gw.token(tenant=who, max_streams=CLAIM)})
    return peer.call_sid, peer


async def asterisk_leg(gw: GatewayProcess, stack: AsyncExitStack, who: str) -> tuple[str, Leg]:
    token = gw.token(tenant=who, max_streams=CLAIM)
    peer = await AsteriskPeer.connect(leg_url(gw, "asterisk"), query={"access_token": token})
    stack.push_async_callback(peer.aclose)
    await peer.send_media_start()
    return peer.channel_id, peer


async def jambonz_leg(gw: GatewayProcess, stack: AsyncExitStack, who: str) -> tuple[str, Leg]:
    token = gw.token(tenant=who, max_streams=CLAIM)
    peer = await JambonzPeer.connect(fork_url(gw, "jambonz"), query={"access_token": token})
    stack.push_async_callback(peer.aclose)
    await peer.send_metadata()
    return peer.call_sid, peer


async def freeswitch_leg(gw: GatewayProcess, stack: AsyncExitStack, who: str) -> tuple[str, Leg]:
    call = FreeSwitchPeer.new_uuid()
    query = {
        "access_token": gw.token(tenant=who, max_streams=CLAIM),
        "sample_rate": "8000",
        "call_id": call,
    }
    peer = await FreeSwitchPeer.connect(fork_url(gw, "freeswitch"), call, query=query)
    stack.push_async_callback(peer.aclose)
    await peer.stream_l16(np.zeros(800, dtype=np.int16))  # starts with audio
    return call, peer


@pytest.mark.parametrize(
    "open_leg",
    [twilio_leg, asterisk_leg, jambonz_leg, freeswitch_leg],
    ids=["twilio", "asterisk", "jambonz", "freeswitch"],
)
async def test_legs_beyond_the_claim_are_closed_1013(
    gateway: GatewayProcess, stack: AsyncExitStack, open_leg: LegOpener
) -> None:
    """A leg's session starts when the vendor starts the call: the third call of the
    tenant is refused (``tenant_limit``, the WebSocket closed with 1013) and never
    registered; the first two are up."""
    who = tenant()
    for _ in range(CLAIM):
        call_id, _peer = await open_leg(gateway, stack, who)
        await attached(gateway, stack, who, call_id)
    before = await refusals(gateway)
    call_id, peer = await open_leg(gateway, stack, who)
    assert await peer.wait_closed() == TRY_AGAIN_LATER
    assert await refusals(gateway) == before + 1
    app = await app_for(gateway, stack, who)
    await app.send(type="start", call=call_id, voice="en-us")
    assert (await app.wait_event("error"))["code"] == "unknown_call"


# --------------------------------------------------------------------------- no token


async def test_audiosocket_calls_of_a_trusted_network_share_its_tenant_limit(
    gateway: GatewayProcess, stack: AsyncExitStack
) -> None:
    """No token: a call from 127.0.0.0/8 is the ``audiosocket`` tenant's (the default of
    ``GATEWAY_AUDIOSOCKET_ALLOW``), under ``GATEWAY_TENANT_MAX_STREAMS``: the fourth is
    hung up (the connection closed, nothing played)."""
    port = int(gateway.env["GATEWAY_AUDIOSOCKET_LISTEN"].rsplit(":", 1)[1])
    for _ in range(DEFAULT):
        peer = await SimulatedAsterisk.connect(port)
        stack.push_async_callback(peer.aclose)
        await attached(gateway, stack, "audiosocket", peer.call_id)
    before = await refusals(gateway)
    extra = await SimulatedAsterisk.connect(port)
    stack.push_async_callback(extra.aclose)
    await extra.wait_closed(timeout=10)
    assert extra.audio() == [] and extra.violations == []
    assert await refusals(gateway) == before + 1


async def test_sip_calls_of_a_trusted_network_share_its_tenant_limit(
    gateway: GatewayProcess,
) -> None:
    """No token: an INVITE from 127.0.0.0/8 is the ``sip`` tenant's (the default of
    ``GATEWAY_SIP_ALLOW``), under ``GATEWAY_TENANT_MAX_STREAMS``: the fourth gets 503."""
    host, port = gateway.env["GATEWAY_SIP_LISTEN"].rsplit(":", 1)
    target = (host, int(port))
    calls: list[SipUac] = []
    try:
        for _ in range(DEFAULT):
            call = SipUac(target, "ivr", lambda _t, _a: None, lambda _r: None)
            calls.append(call)
            await call.invite(timeout=10)
        before = await refusals(gateway)
        extra = SipUac(target, "ivr", lambda _t, _a: None, lambda _r: None)
        calls.append(extra)
        with pytest.raises(SipCallFailed, match="sip_503"):
            await extra.invite(timeout=10)
        assert await refusals(gateway) == before + 1
    finally:
        for call in calls:
            await call.bye()
    await asyncio.sleep(0.5)
    again = SipUac(target, "ivr", lambda _t, _a: None, lambda _r: None)
    try:
        await again.invite(timeout=10)  # the ended calls freed their slots
    finally:
        await again.bye()
