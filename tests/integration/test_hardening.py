"""Hostile and broken clients against a real gateway: nothing leaks, every limit holds.

Each test reproduces one finding of the hardening review (issue 10) with real sockets:
the gateway must answer with the documented code and release everything the connection
held (session, engine slot, tenant lease in Redis, pacer entry), whatever the client did.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import secrets
import signal
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from functools import partial
from pathlib import Path

import aiohttp
import jwt
import pytest

from tests.integration.harness import (
    SECRET,
    GatewayProcess,
    NativeClient,
    RedisServer,
    metric,
)
from tests.integration.telephony_peers import AsteriskPeer, TwilioPeer, attach, leg_url

START_TIMEOUT_S = 2
HANDSHAKE_TIMEOUT_S = 2
SEND_STALL_S = 2
LEEWAY_S = 1
SLOTS = 4
NESTED = '{"type":"speak","text":"hi","x":' + "[" * 1000 + "]" * 1000 + "}"


@pytest.fixture(scope="module")
def gateway(
    redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    gw = GatewayProcess(
        tmp_path_factory.mktemp("hardening") / "gateway.log",
        ENGINE_SLOTS=str(SLOTS),
        ENGINE_VAD="0",
        GATEWAY_START_TIMEOUT_S=str(START_TIMEOUT_S),
        GATEWAY_HANDSHAKE_TIMEOUT_S=str(HANDSHAKE_TIMEOUT_S),
        GATEWAY_SEND_STALL_S=str(SEND_STALL_S),
        GATEWAY_JWT_LEEWAY_S=str(LEEWAY_S),
        GATEWAY_REDIS_URL=redis.url,
        GATEWAY_REDIS_PREFIX=f"hard{secrets.token_hex(4)}",
        GATEWAY_LEASE_MS="60000",  # a leaked lease would outlive every test here
    )
    gw.start()
    yield gw
    gw.stop()


@pytest.fixture
async def clients() -> AsyncIterator[list[NativeClient]]:
    opened: list[NativeClient] = []
    yield opened
    for client in opened:
        await client.aclose()


async def connect(gw: GatewayProcess, clients: list[NativeClient], token: str) -> NativeClient:
    client = await NativeClient.connect(gw.ws_url, token)
    clients.append(client)
    return client


async def eventually(predicate_coro: Callable[[], Awaitable[bool]], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate_coro():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


def lease_members(redis: RedisServer, gw: GatewayProcess, tenant: str) -> int:
    import subprocess

    key = f"{{{gw.env['GATEWAY_REDIS_PREFIX']}:tenant:{tenant}}}:leases"
    out = subprocess.run(
        ["redis-cli", "-p", str(redis.port), "zcard", key], capture_output=True, check=True
    )
    return int(out.stdout.strip() or 0)


def abort(client: NativeClient) -> None:
    """Drop the TCP connection without a close frame (a client that crashed)."""
    conn = client.ws._response.connection  # the test needs the raw socket
    assert conn is not None and conn.transport is not None
    conn.transport.abort()


# --------------------------------------------------------------------------- item 1


async def test_deep_nesting_is_invalid_json_and_a_crashed_client_releases_everything(
    gateway: GatewayProcess, redis: RedisServer, clients: list[NativeClient]
) -> None:
    token = gateway.token(tenant="nest", max_streams=SLOTS)
    # Before start: invalid_json closes with 1008.
    early = await connect(gateway, clients, token)
    await early.ws.send_str(NESTED)
    event = await early.wait_event("error")
    assert event["code"] == "invalid_json"
    assert await early.wait_closed() == 1008
    # After start, on every engine slot: invalid_json, and the session goes on.
    victims = []
    for _ in range(SLOTS):
        client = await connect(gateway, clients, token)
        await client.start()
        await client.ws.send_str(NESTED)
        assert (await client.wait_event("error"))["code"] == "invalid_json"
        await client.send(type="speak", text="Still here.")
        await client.wait_event("utterance_done")
        victims.append(client)
    assert lease_members(redis, gateway, "nest") == SLOTS
    for client in victims:
        abort(client)  # no close frame, as when the decoder crashed the connection before

    async def released() -> bool:
        return (
            await metric(gateway, "gateway_sessions_active") == 0
            and lease_members(redis, gateway, "nest") == 0
        )

    await eventually(released)
    # Every slot and the tenant's whole limit are free again.
    fresh = [await connect(gateway, clients, token) for _ in range(SLOTS)]
    for client in fresh:
        assert (await client.start())["type"] == "ready"
    # Leave them free for the module's next test (a close is released asynchronously:
    # a session started at once could still find every slot taken).
    for client in fresh:
        await client.aclose()
    await eventually(released)


# --------------------------------------------------------------------------- item 2


async def ping_until_closed(ws: aiohttp.ClientWebSocketResponse, limit_s: float) -> float:
    """Send a ping every 0.5 s (and read) until the server closes; seconds it took."""
    started = time.monotonic()

    async def pinger() -> None:
        while True:
            await ws.ping()
            await asyncio.sleep(0.5)

    task = asyncio.create_task(pinger())
    try:
        async with asyncio.timeout(limit_s):
            async for _ in ws:
                pass
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await task
    return time.monotonic() - started


@pytest.mark.parametrize("path", ["/v1/stream", "/v1/twilio", "/v1/asterisk"])
@pytest.mark.realtime  # closed within 1 s of the timeout: runs alone
async def test_pings_do_not_extend_the_start_timeout(gateway: GatewayProcess, path: str) -> None:
    url = gateway.base.replace("http://", "ws://") + path
    # Twilio: no token at all (it would come with start); the others authenticate.
    params = {} if path == "/v1/twilio" else {"access_token": gateway.token()}
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(url, params=params, autoping=True) as ws,
    ):
        took = await ping_until_closed(ws, START_TIMEOUT_S + 5)
        assert ws.close_code == 1008
    assert START_TIMEOUT_S - 0.2 <= took <= START_TIMEOUT_S + 1.0


# --------------------------------------------------------------------------- item 5


@pytest.mark.realtime  # closed within 1.5 s of the timeout: runs alone
async def test_slow_and_silent_http_clients_are_closed(gateway: GatewayProcess) -> None:
    async def slowloris(silent: bool) -> float:
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        started = time.monotonic()
        try:
            if not silent:
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            async with asyncio.timeout(HANDSHAKE_TIMEOUT_S + 10):
                while True:
                    if not silent:
                        writer.write(b"X-Slow: 1\r\n")  # a header line now and then
                        await writer.drain()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(0.5):
                            if await reader.read(1024) == b"":
                                return time.monotonic() - started
        except (ConnectionError, OSError):
            return time.monotonic() - started
        finally:
            writer.close()

    times = await asyncio.gather(*(slowloris(silent=i % 2 == 0) for i in range(40)))
    assert max(times) <= HANDSHAKE_TIMEOUT_S + 1.5, times
    # A WebSocket session is not subject to it: idle well past the handshake timeout.
    client = await NativeClient.connect(gateway.ws_url, gateway.token())
    try:
        await client.start()
        await asyncio.sleep(HANDSHAKE_TIMEOUT_S + 1)
        await client.send(type="speak", text="Still here.")
        await client.wait_event("utterance_done")
    finally:
        await client.aclose()


@pytest.mark.realtime  # answered within 0.3 s: runs alone (Makefile)
async def test_connections_beyond_the_cap_get_503(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path / "gateway.log", ENGINE_VAD="0", GATEWAY_MAX_CONNECTIONS="8")
    gw.start()
    held: list[socket.socket] = []
    try:
        for _ in range(8):
            held.append(socket.create_connection(("127.0.0.1", gw.port)))
        await asyncio.sleep(0.3)
        with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as extra:
            answer = extra.recv(4096)
        assert answer.startswith(b"HTTP/1.1 503 ")
        assert b"Retry-After: 1" in answer and b"too_many_connections" in answer
        for s in held:
            s.close()
        held.clear()
        await asyncio.sleep(0.3)
        assert gw.readyz()[0] == 200  # room again
        assert await metric(gw, "gateway_connections_refused_total", reason="limit") >= 1
        assert await metric(gw, "gateway_connections_open") >= 1
    finally:
        for s in held:
            s.close()
        gw.stop()


# --------------------------------------------------------------------------- item 6


async def test_a_flood_of_malformed_frames_closes_the_connection_quietly(
    gateway: GatewayProcess, clients: list[NativeClient]
) -> None:
    client = await connect(gateway, clients, gateway.token())
    ready = await client.start()
    for _ in range(2000):
        await client.ws.send_str("x")
    assert await client.wait_closed() == 1008
    errors = client.got.of_type("error")
    assert [e["code"] for e in errors[:-1]] == ["invalid_json"] * (len(errors) - 1)
    assert errors[-1]["code"] == "too_many_errors"
    assert len(errors) <= 11  # the budget (10), then the one that closes
    await asyncio.sleep(0.2)
    lines = [line for line in gateway.log_text().splitlines() if ready["session_id"] in line]
    assert len(lines) <= 25, len(lines)


# --------------------------------------------------------------------------- item 7


def has_media(peer: TwilioPeer) -> bool:
    return bool(peer.media)


async def test_call_ids_are_scoped_per_tenant(
    gateway: GatewayProcess, clients: list[NativeClient]
) -> None:
    url = leg_url(gateway, "twilio")
    legs = [await TwilioPeer.connect(url) for _ in range(2)]
    try:
        legs[1].call_sid = legs[0].call_sid  # the same callSid, two tenants
        for leg, tenant in zip(legs, ("acme", "globex"), strict=True):
            await leg.begin({"token": gateway.token(tenant=tenant), "say": "Hello."})
        for leg in legs:
            await leg.wait_until(partial(has_media, leg), timeout=5)
        apps = []
        for tenant in ("acme", "globex"):

            async def connect_app(token: str | None = "", tenant: str = tenant) -> NativeClient:
                return await connect(gateway, clients, gateway.token(tenant=tenant))

            apps.append(await attach(connect_app, legs[0].call_sid))
        # Each tenant's application drives its own tenant's call.
        await apps[1].send(type="mark", name="globex-mark")
        await legs[1].wait_until(lambda: bool(legs[1].events("mark")), timeout=5)
        assert legs[0].events("mark") == []
    finally:
        for leg in legs:
            await leg.aclose()


async def test_over_long_vendor_call_ids_are_refused(gateway: GatewayProcess) -> None:
    peer = await AsteriskPeer.connect(
        leg_url(gateway, "asterisk"), query={"access_token": gateway.token()}
    )
    try:
        peer.channel_id = "c" * 10_000
        await peer.send_media_start()
        assert await peer.wait_closed() == 1008
    finally:
        await peer.aclose()
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(gateway.ws_url, headers=auth(gateway.token()))
        await ws.send_json({"type": "start", "call": "c" * 129, "voice": "en-us"})
        error = json.loads((await ws.receive()).data)
        assert error["code"] == "invalid_message"
        await ws.receive()
        assert ws.close_code == 1008


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# --------------------------------------------------------------------------- item 8


async def test_absurd_expiry_is_token_invalid_not_500(gateway: GatewayProcess) -> None:
    claims = {"sub": "x", "exp": 10**400, "scope": "tts:stream"}
    token = jwt.encode(claims, SECRET, algorithm="HS256")
    async with aiohttp.ClientSession() as http:
        r = await http.get(gateway.base + "/v1/voices", headers=auth(token))
        assert r.status == 401
        assert (await r.json())["error"]["code"] == "token_invalid"
        ws = await http.ws_connect(gateway.ws_url, headers=auth(token))
        error = json.loads((await ws.receive()).data)
        assert error["code"] == "token_invalid"
        await ws.receive()
        assert ws.close_code == 1008


# --------------------------------------------------------------------------- item 10


@pytest.mark.realtime  # ended within 1 s of exp + leeway: runs alone
async def test_a_session_ends_when_its_token_expires(
    gateway: GatewayProcess, clients: list[NativeClient]
) -> None:
    client = await connect(gateway, clients, gateway.token(ttl_s=2))
    started = time.monotonic()
    await client.start()
    await client.send(type="speak", text="Please hold. " * 40)
    await client.wait_event("utterance_started")
    error = await client.wait_event("error", timeout=10)
    assert error["code"] == "token_expired"
    assert await client.wait_closed() == 1008
    # exp was minted at a whole second: the session ends within exp + leeway.
    assert 1.0 + LEEWAY_S - 0.2 <= time.monotonic() - started <= 2 + LEEWAY_S + 1.0


@pytest.mark.realtime  # media within 0.3 s: runs alone (Makefile)
async def test_a_telephony_call_outlives_its_token(gateway: GatewayProcess) -> None:
    peer = await TwilioPeer.connect(leg_url(gateway, "twilio"))
    try:
        await peer.begin({"token": gateway.token(ttl_s=1), "say": "Please hold. " * 12})
        await asyncio.sleep(1 + LEEWAY_S + 1.5)
        assert not peer.closed.done()
        count = len(peer.media)
        await asyncio.sleep(0.3)
        assert len(peer.media) > count  # still speaking
        await peer.send_stop()  # while speaking: nothing may be sent after the stop
        assert await peer.wait_closed() == 1000
        await asyncio.sleep(0.1)
        assert "not_streaming" not in gateway.log_text()
    finally:
        await peer.aclose()


# --------------------------------------------------------------------------- item 11


class DeafTwilio(TwilioPeer):
    """A Twilio peer that plays audio but never echoes a mark."""

    async def _on_mark_played(self, name: str) -> None:
        return None


async def test_unechoed_twilio_marks_are_bounded_and_reported(
    gateway: GatewayProcess, clients: list[NativeClient]
) -> None:
    peer = await DeafTwilio.connect(leg_url(gateway, "twilio"))
    try:
        await peer.begin({"token": gateway.token()})

        async def connect_app(token: str | None = "") -> NativeClient:
            return await connect(gateway, clients, gateway.token())

        app = await attach(connect_app, peer.call_sid)
        for i in range(300):
            await app.send(type="mark", name=f"m{i}")
            if i % 20 == 19:
                await asyncio.sleep(0.05)  # the queue holds 64 items
        full = await app.wait_event("error", code="mark_backlog_full", timeout=10)
        assert "m256" in full["message"]
        await app.wait_event("error", code="mark_backlog_full", count=44, timeout=10)
        assert len(peer.events("mark")) == 256
        # The leg still speaks, and nothing raised in the pacer.
        await app.send(type="speak", text="Still here.")
        await app.wait_event("utterance_done", timeout=10)
        assert "Traceback" not in gateway.log_text()
    finally:
        await peer.aclose()


# --------------------------------------------------------------------------- item 12


async def test_over_long_lines_never_log_a_token_and_probes_say_nothing_internal(
    gateway: GatewayProcess,
) -> None:
    token = gateway.token()
    secret_part = token.split(".")[1][:20]
    pad = "A" * 9000
    requests = [
        f"GET /v1/stream?access_token={token}{pad} HTTP/1.1\r\nHost: x\r\n\r\n",
        f"GET /v1/voices HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}{pad}\r\n\r\n",
        f"GET /v1/voices HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {token}{pad}\r\n\r\n",
    ]
    for raw in requests:
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        writer.write(raw.encode())
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), 5)
        assert status.split()[1] in (b"400", b"414", b"431"), status
        writer.close()
    await asyncio.sleep(0.3)
    log = gateway.log_text()
    assert secret_part not in log
    assert "eyJ" not in log
    code, body = gateway.readyz()
    assert code == 200 and set(body) == {"ready", "draining", "vad_ready"}


# --------------------------------------------------------------------------- review: leaks


def _masked(opcode: int, payload: bytes) -> bytes:
    """One client frame (RFC 6455 section 5.3: masked), payload under 126 bytes."""
    mask = os.urandom(4)
    head = bytes([0x80 | opcode, 0x80 | len(payload)])
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


FLOOD_LIMIT_S = 15.0


def _never_reading_websocket(port: int, path: str, token: str | None, start: bool) -> socket.socket:
    """A raw WebSocket that (after an optional start) floods pings and reads nothing."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"{auth}Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    if start:
        sock.sendall(_masked(1, b'{"type":"start","voice":"en-us","format":"mulaw_8000"}'))
        seen = b""
        while b"ready" not in seen:
            seen += sock.recv(4096)
    # From here on it never reads a byte. Pings go in bursts until the gateway stops
    # taking them: its pongs fill what this socket does not read, then its own buffers,
    # and only then is its unsent output stuck. (A flood cut off by time instead can end,
    # on a loaded machine, before the kernel's buffers are full, and then nothing stalls.)
    sock.settimeout(0.2)
    pings = _masked(0x9, b"p" * 125) * 256
    until = time.monotonic() + FLOOD_LIMIT_S
    while True:
        assert time.monotonic() < until, "the gateway never stopped taking pings"
        try:
            sock.sendall(pings)
        except (TimeoutError, BlockingIOError):
            return sock


async def test_peers_that_never_read_are_cut_off_and_release_everything(
    gateway: GatewayProcess,
) -> None:
    aborted = await metric(gateway, "gateway_connections_aborted_total", reason="write_stall")
    native = await metric(gateway, "gateway_sessions_active", protocol="native")
    socks = [
        await asyncio.to_thread(_never_reading_websocket, gateway.port, "/v1/twilio", None, False),
        await asyncio.to_thread(
            _never_reading_websocket, gateway.port, "/v1/stream", gateway.token(), True
        ),
    ]
    try:

        async def cut_off() -> bool:
            return (
                await metric(gateway, "gateway_connections_aborted_total", reason="write_stall")
                >= aborted + 2
                and await metric(gateway, "gateway_sessions_active", protocol="native") == native
            )

        await eventually(cut_off, timeout=START_TIMEOUT_S + 10 * SEND_STALL_S)
    finally:
        for sock in socks:
            sock.close()


@pytest.mark.realtime  # slots free within 0.5 s: runs alone
async def test_a_session_that_ends_while_the_engine_opens_its_stream_leaks_no_slot(
    gateway: GatewayProcess, clients: list[NativeClient]
) -> None:
    engine = gateway.engine_pid()
    client = await connect(gateway, clients, gateway.token(ttl_s=1, tenant="race"))
    os.kill(engine, signal.SIGSTOP)  # slow to answer OpenStream (under the heartbeat timeout)
    try:
        await client.send(type="start", voice="en-us", format="mulaw_8000")
        assert (await client.wait_event("error", timeout=5))["code"] == "token_expired"
    finally:
        os.kill(engine, signal.SIGCONT)
    await asyncio.sleep(0.5)  # the engine answers the abandoned OpenStream; we close it
    fresh = [await connect(gateway, clients, gateway.token(tenant="race2")) for _ in range(SLOTS)]
    for c in fresh:
        assert (await c.start())["type"] == "ready"  # every slot is free
