"""The relay listener against a running gateway (issue 29, item 6).

With ``GATEWAY_REDIS_URL`` a worker also listens on ``GATEWAY_RELAY_PORT`` for
applications relayed to the calls it holds. That port serves the relay route and nothing
else, and it is held to the public port's guards: the one ``GATEWAY_MAX_CONNECTIONS``
(both ports together), the handshake timeout and the write-stall limit. Before the fix it
served the whole application (``/metrics``, the speech API) and took any number of
connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
import time
from collections.abc import Iterator

import aiohttp
import pytest

from tests.integration.harness import (
    GatewayProcess,
    NativeClient,
    RedisServer,
    free_port,
    metric,
)
from tests.integration.test_hardening import _never_reading_websocket

pytestmark = pytest.mark.slow

CAP = 50
HANDSHAKE_TIMEOUT_S = 2
SEND_STALL_S = 2


@pytest.fixture(scope="module")
def gateway(
    redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    gw = GatewayProcess(
        tmp_path_factory.mktemp("relay-listener") / "gateway.log",
        ENGINE_VAD="0",
        GATEWAY_REDIS_URL=redis.url,
        GATEWAY_REDIS_PREFIX=f"relay{secrets.token_hex(4)}",
        GATEWAY_RELAY_PORT=str(free_port()),
        GATEWAY_MAX_CONNECTIONS=str(CAP),
        GATEWAY_HANDSHAKE_TIMEOUT_S=str(HANDSHAKE_TIMEOUT_S),
        GATEWAY_SEND_STALL_S=str(SEND_STALL_S),
    )
    gw.start()
    yield gw
    gw.stop()


def relay_port(gw: GatewayProcess) -> int:
    return int(gw.env["GATEWAY_RELAY_PORT"])


def relay_base(gw: GatewayProcess) -> str:
    return f"http://127.0.0.1:{relay_port(gw)}"


async def test_the_relay_port_serves_the_relay_route_and_nothing_else(
    gateway: GatewayProcess,
) -> None:
    token = gateway.token()
    auth = {"Authorization": f"Bearer {token}"}
    speech = {"model": "tts-1", "voice": "alloy", "input": "Hello."}
    async with aiohttp.ClientSession() as http:
        for method, path in [
            ("GET", "/metrics"),
            ("POST", "/v1/audio/speech"),
            ("GET", "/v1/voices"),
            ("GET", "/healthz"),
            ("GET", "/readyz"),
            ("GET", "/v1/twilio"),
            ("GET", "/"),
        ]:
            async with http.request(
                method, relay_base(gateway) + path, headers=auth, json=speech
            ) as resp:
                assert resp.status == 404, (path, resp.status)
                assert b"gateway_" not in await resp.read()
        async with http.get(gateway.base + "/metrics") as resp:  # the public port has them
            assert resp.status == 200
    # The relay route itself: a native session, as a relayed application gets one.
    client = await NativeClient.connect(f"ws://127.0.0.1:{relay_port(gateway)}/v1/stream", token)
    try:
        await client.start()
        await client.send(type="speak", text="Relayed.", utterance_id="u")
        done = await client.wait_event("utterance_done", timeout=15)
        assert done["audio_ms"] > 0
    finally:
        await client.aclose()


def _answer(sock: socket.socket) -> bytes:
    """What the gateway has said on ``sock`` so far (without waiting)."""
    sock.setblocking(False)
    with contextlib.suppress(BlockingIOError, OSError):
        return sock.recv(4096)
    return b""


@pytest.mark.realtime  # answered within 0.5 s: runs alone
async def test_the_relay_port_counts_against_the_one_connection_cap(
    gateway: GatewayProcess,
) -> None:
    """80 raw connections to the relay port with the cap at 50: 30 refused with the
    public port's 503; while the relay port holds the 50, the public port refuses too."""
    deadline = time.monotonic() + 5
    while await metric(gateway, "gateway_connections_open") > 1:  # the scrape itself
        assert time.monotonic() < deadline, "connections of other tests are still open"
        await asyncio.sleep(0.1)
    refused_before = await metric(gateway, "gateway_connections_refused_total", reason="limit")
    await asyncio.sleep(0.3)  # the scrape's connection is gone
    held: list[socket.socket] = []
    refusals: list[bytes] = []
    try:
        for _ in range(80):
            held.append(socket.create_connection(("127.0.0.1", relay_port(gateway))))
        await asyncio.sleep(0.5)  # well within the handshake timeout: the 50 still open
        answers = [_answer(s) for s in held]
        refusals = [a for a in answers if a.startswith(b"HTTP/1.1 503 ")]
        assert len(refusals) == 80 - CAP
        assert all(b"too_many_connections" in a and b"Retry-After: 1" in a for a in refusals)
        public = socket.create_connection(("127.0.0.1", gateway.port))
        held.append(public)
        await asyncio.sleep(0.3)
        assert _answer(public).startswith(b"HTTP/1.1 503 ")  # one cap for both ports
    finally:
        for s in held:
            s.close()
    await asyncio.sleep(0.3)
    assert gateway.readyz()[0] == 200  # room again
    refused = await metric(gateway, "gateway_connections_refused_total", reason="limit")
    assert refused == refused_before + len(refusals) + 1


@pytest.mark.realtime  # closed within 1.5 s of the timeout: runs alone
async def test_silent_and_never_reading_peers_of_the_relay_port_are_cut_off(
    gateway: GatewayProcess,
) -> None:
    """The handshake timeout and the write-stall limit hold on the relay port as well."""
    started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", relay_port(gateway))
    try:
        async with asyncio.timeout(HANDSHAKE_TIMEOUT_S + 5):
            assert await reader.read(1024) == b""  # closed, nothing said
        assert time.monotonic() - started <= HANDSHAKE_TIMEOUT_S + 1.5
    finally:
        writer.close()
    aborted = await metric(gateway, "gateway_connections_aborted_total", reason="write_stall")
    sock = await asyncio.to_thread(
        _never_reading_websocket, relay_port(gateway), "/v1/stream", gateway.token(), True
    )
    try:
        deadline = time.monotonic() + 10 * SEND_STALL_S
        while (
            await metric(gateway, "gateway_connections_aborted_total", reason="write_stall")
            < aborted + 1
        ):
            assert time.monotonic() < deadline, "a peer that never reads was not cut off"
            await asyncio.sleep(0.2)
    finally:
        sock.close()
