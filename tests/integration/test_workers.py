"""Several gateway workers on one host, and several instances sharing a Redis (issue 15).

Real processes throughout: the host supervisor (``GATEWAY_WORKERS=2``) with its engine and
two workers on one port (SO_REUSEPORT), a real nginx in front of it, real Twilio legs and
IVR applications over real WebSockets, a real Redis between two instances. Which worker
answered a connection is read from its ``X-Gateway-Worker`` header.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from gateway.app import WORKER_HEADER
from telephony.codecs import g711
from tests.bench.promscrape import Scrape
from tests.deploy.nginx import NGINX, running_nginx
from tests.integration.harness import (
    HOST_START_S,
    GatewayProcess,
    NativeClient,
    RedisServer,
    free_udp_port,
    wait_workers,
    worker_of,
    worker_pids,
)
from tests.integration.sip_peers import (
    RtpPeer,
    call_ended_by_gateway,
    have_sipp,
    offer_sdp,
    run_sipp,
)
from tests.integration.telephony_peers import (
    ATTEMPTS,
    AsteriskPeer,
    TwilioPeer,
    attached_app,
    client_on,
    leg_on,
    leg_url,
)


def start_host(log: Path, **env: str) -> GatewayProcess:
    gw = GatewayProcess(log, GATEWAY_WORKERS="2", ENGINE_VAD="0", **env)
    gw.start(timeout=HOST_START_S)
    wait_workers(gw, 2)
    return gw


def media_payloads(peer: TwilioPeer) -> list[dict[str, object]]:
    return [m for _, m in peer.received if m.get("event") == "media"]


def level(peer: TwilioPeer) -> float:
    """RMS of the μ-law audio the leg received, as a fraction of full scale."""
    payloads = [m["media"] for m in media_payloads(peer)]
    raw = b"".join(base64.b64decode(str(p["payload"])) for p in payloads if isinstance(p, dict))
    pcm = g711.ulaw_decode(raw).astype(np.float64)
    return float(np.sqrt(np.mean(pcm**2)) / 32768) if pcm.size else 0.0


async def scrape(base: str) -> tuple[str, dict[str, float]]:
    """(worker that answered, {sample name with labels: value}) of one scrape."""
    async with aiohttp.ClientSession() as http, http.get(base + "/metrics") as resp:
        text = await resp.text()
        worker = resp.headers.get(WORKER_HEADER, "")
    return worker, Scrape.parse(text).values


# -- one host, two workers ------------------------------------------------------------


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    gw = start_host(tmp_path_factory.mktemp("host") / "gateway.log")
    yield gw
    gw.stop()


@pytest.fixture
async def closing() -> AsyncIterator[list[NativeClient | TwilioPeer | AsteriskPeer]]:
    opened: list[NativeClient | TwilioPeer | AsteriskPeer] = []
    yield opened
    for thing in opened:
        await thing.aclose()


async def test_leg_on_one_worker_application_on_the_other_behind_nginx(
    host: GatewayProcess,
    tmp_path: Path,
    closing: list[NativeClient | TwilioPeer | AsteriskPeer],
) -> None:
    """nginx routes on nothing but the path: the Twilio leg and its IVR application land on
    different workers, and the application drives the call all the same (speak, mark,
    DTMF, hangup) through the relay between the workers."""
    if not NGINX.exists():
        pytest.skip(f"{NGINX} is not installed")
    token = host.token(tenant="acme")
    with running_nginx(tmp_path, [f"127.0.0.1:{host.port}"]) as proxy:
        ws_base = proxy.ws_url.removesuffix("/v1/stream")
        leg = await leg_on(f"{ws_base}/v1/twilio", token)
        closing.append(leg)
        app = await attached_app(proxy.ws_url, token, leg.call_sid, avoid=worker_of(leg.ws))
        closing.append(app)
        assert {worker_of(leg.ws), worker_of(app.ws)} == {"0", "1"}
        await app.send(type="speak", text="Your balance is twelve dollars.")
        await app.send(type="mark", name="after-balance")
        await app.wait_event("utterance_done", timeout=15)
        await app.wait_event("mark", timeout=15, name="after-balance")
        assert len(media_payloads(leg)) > 50  # over a second of 20 ms frames
        assert level(leg) > 0.02  # speech, not silence
        await leg.send_dtmf("7")
        assert (await app.wait_event("dtmf"))["digit"] == "7"
        # The application is one session, counted where its call is, not on both workers.
        _, values = await scrape(host.base)
        assert values["gateway_sessions_active{protocol=native}"] == 1
        assert values["gateway_sessions_active{protocol=twilio}"] == 1
        await app.send(type="hangup")
        assert await leg.wait_closed(10) is not None
        ended = await app.wait_event("call_ended")
        assert ended["call_id"] == leg.call_sid
    _, values = await scrape(host.base)
    assert values["gateway_call_relays_total{result=relayed}"] >= 1


async def test_an_asterisk_leg_is_driven_from_the_other_worker_the_same_way(
    host: GatewayProcess, closing: list[NativeClient | TwilioPeer | AsteriskPeer]
) -> None:
    """The relay is the same for every leg protocol: an Asterisk chan_websocket leg on one
    worker, its application on the other (speak, DTMF, hangup)."""
    token = host.token(tenant="acme")
    leg = await AsteriskPeer.connect(leg_url(host, "asterisk"), query={"access_token": token})
    closing.append(leg)
    await leg.send_media_start()
    await leg.wait_until(lambda: leg.first("ANSWER") is not None, timeout=5)
    app = await attached_app(host.ws_url, token, leg.channel_id, avoid=worker_of(leg.ws))
    closing.append(app)
    assert {worker_of(leg.ws), worker_of(app.ws)} == {"0", "1"}
    await app.send(type="speak", text="Your balance is twelve dollars.")
    await app.wait_event("utterance_done", timeout=15)
    await leg.wait_until(lambda: sum(len(m) for _, m in leg.media) > 50 * 160, timeout=10)
    pcm = g711.ulaw_decode(b"".join(m for _, m in leg.media)).astype(np.float64)
    assert np.sqrt(np.mean(pcm**2)) / 32768 > 0.02  # speech, not silence
    await leg.send_dtmf_end("7")
    assert (await app.wait_event("dtmf"))["digit"] == "7"
    await app.send(type="hangup")
    await leg.wait_until(lambda: leg.first("HANGUP") is not None, timeout=10)
    ended = await app.wait_event("call_ended")
    assert ended["call_id"] == leg.channel_id


@pytest.mark.skipif(not have_sipp(), reason="sipp is not installed")
async def test_a_sip_call_on_worker_0_is_driven_from_worker_1(
    tmp_path: Path, closing: list[NativeClient | TwilioPeer | AsteriskPeer]
) -> None:
    """The SIP bridge runs on worker 0 only; an application that lands on worker 1 drives
    the call through the relay as any other (speak reaches the caller's RTP, DTMF, hangup
    sends BYE)."""
    sip_port = free_udp_port()
    low = 40000 + (free_udp_port() % 200) * 100
    gw = start_host(
        tmp_path / "gateway.log",
        GATEWAY_SIP_LISTEN=f"127.0.0.1:{sip_port}",
        GATEWAY_SIP_RTP_PORTS=f"{low}-{low + 99}",
    )
    peer = await RtpPeer.open("PCMU")
    cid = f"workers-{uuid.uuid4().hex[:12]}@127.0.0.1"
    xml = call_ended_by_gateway("app", "app", offer_sdp(peer.port, ("PCMU",)))
    try:
        sipp = asyncio.ensure_future(run_sipp(xml, ("127.0.0.1", sip_port), tmp_path, call_id=cid))
        app = await attached_app(gw.ws_url, gw.token(tenant="sip"), cid, worker="1")
        closing.append(app)
        await app.send(type="speak", text="Your balance is twelve dollars.", utterance_id="b")
        await app.wait_event("utterance_done", utterance_id="b", timeout=15)
        await peer.wait_packets(50)
        pcm = peer.audio().astype(np.float64)
        assert np.sqrt(np.mean(pcm**2)) / 32768 > 0.02  # speech reached the caller
        await peer.send_digit("7")
        assert (await app.wait_event("dtmf", timeout=5))["digit"] == "7"
        await app.send(type="hangup")
        assert (await app.wait_event("call_ended", timeout=10))["call_id"] == cid
        result = await sipp
        assert result.returncode == 0, result.output
        _, values = await scrape(gw.base)
        assert values["gateway_call_relays_total{result=relayed}"] >= 1
    finally:
        peer.close()
        gw.stop()


async def test_another_tenant_cannot_reach_the_call_through_the_relay(
    host: GatewayProcess, closing: list[NativeClient | TwilioPeer | AsteriskPeer]
) -> None:
    leg = await leg_on(f"ws://127.0.0.1:{host.port}/v1/twilio", host.token(tenant="acme"))
    closing.append(leg)
    other = await client_on(host.ws_url, host.token(tenant="rival"), avoid=worker_of(leg.ws))
    closing.append(other)
    await other.send(type="start", call=leg.call_sid)
    error = await other.wait_event("error")
    assert error["code"] == "unknown_call"
    assert await other.wait_closed() == 1008


async def test_one_metrics_endpoint_for_the_host(
    host: GatewayProcess, closing: list[NativeClient | TwilioPeer | AsteriskPeer]
) -> None:
    """Whichever worker answers the scrape, the figures are the host's: sessions opened
    on both workers are counted once each, and open ones are summed."""
    token = host.token()
    before: dict[str, float] = {}
    for _ in range(ATTEMPTS):
        _, before = await scrape(host.base)
        if before:
            break
    key_total = "gateway_sessions_total{protocol=native}"
    key_active = "gateway_sessions_active{protocol=native}"
    kept: dict[str, NativeClient] = {}
    opened = 0
    while len(kept) < 2:
        assert opened < ATTEMPTS, f"connections landed on {set(kept)} only"
        client = await NativeClient.connect(host.ws_url, token)
        closing.append(client)
        opened += 1
        kept.setdefault(worker_of(client.ws), client)
    for client in kept.values():
        await client.start()
    answered: set[str] = set()
    for _ in range(ATTEMPTS):
        worker, values = await scrape(host.base)
        answered.add(worker)
        assert values[key_total] == before.get(key_total, 0) + opened
        assert values[key_active] >= 2
        assert not any(k.startswith("process_") for k in values)  # one worker's: misleading
        if answered == {"0", "1"}:
            break
    assert answered == {"0", "1"}


async def test_kill_9_of_a_worker(
    host: GatewayProcess, closing: list[NativeClient | TwilioPeer | AsteriskPeer]
) -> None:
    """The killed worker's call ends with ``call_lost`` for its application on the other
    worker; the other worker's call goes on untouched; the supervisor starts the worker
    again and it takes connections."""
    assert host.proc is not None
    token = host.token()
    twilio = f"ws://127.0.0.1:{host.port}/v1/twilio"
    doomed_leg = await leg_on(twilio, token, worker="0")
    safe_leg = await leg_on(twilio, token, worker="1")
    closing.extend([doomed_leg, safe_leg])
    doomed_app = await attached_app(host.ws_url, token, doomed_leg.call_sid, worker="1")
    safe_app = await attached_app(host.ws_url, token, safe_leg.call_sid, worker="1")
    closing.extend([doomed_app, safe_app])
    pids = worker_pids(host.proc.pid)
    os.kill(pids["0"], signal.SIGKILL)

    error = await doomed_app.wait_event("error", timeout=10)
    assert error["code"] == "call_lost"
    assert await doomed_app.wait_closed() == 1011

    await safe_app.send(type="speak", text="Still here.")
    await safe_app.wait_event("utterance_done", timeout=15)
    assert len(media_payloads(safe_leg)) > 20
    assert not safe_leg.ws.closed

    deadline = time.monotonic() + HOST_START_S
    while worker_pids(host.proc.pid).get("0") in (None, pids["0"]):
        assert time.monotonic() < deadline, "worker 0 was not started again"
        await asyncio.sleep(0.1)
    assert worker_pids(host.proc.pid)["1"] == pids["1"]  # the other was left alone
    await asyncio.to_thread(wait_workers, host, 2)
    again = await client_on(host.ws_url, token, worker="0")
    closing.append(again)
    await again.start()
    assert "worker 0 running -> backoff" in host.log_text()


async def test_sigterm_drains_every_worker(tmp_path: Path) -> None:
    """SIGTERM to the supervisor: each worker stops taking connections, lets its calls
    finish what they are saying, and exits; then the supervisor exits 0."""
    gw = start_host(tmp_path / "gateway.log", GATEWAY_DRAIN_TIMEOUT_S="20")
    assert gw.proc is not None
    clients: list[NativeClient] = []
    try:
        token = gw.token()
        for worker in ("0", "1"):
            client = await client_on(gw.ws_url, token, worker=worker)
            clients.append(client)
            await client.start()
            await client.send(
                type="speak",
                text="Please hold while we transfer your call to the next available agent.",
            )
            await client.wait_event("utterance_started", timeout=15)
        workers = worker_pids(gw.proc.pid)
        gw.proc.send_signal(signal.SIGTERM)
        for client in clients:
            await client.wait_event("utterance_done", timeout=20)  # finished, not cut
            await client.send(type="close")
            assert await client.wait_closed(20) == 1000
        assert await asyncio.to_thread(gw.proc.wait, 30) == 0
        for pid in workers.values():
            assert not Path(f"/proc/{pid}").exists() or _zombie(pid)
        log = gw.log_text()
        assert "worker 0 stopping -> stopped (exited with 0)" in log
        assert "worker 1 stopping -> stopped (exited with 0)" in log
    finally:
        for client in clients:
            await client.aclose()
        gw.stop()


def _zombie(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    return True


# -- two instances sharing a Redis ----------------------------------------------------


@pytest.fixture
def instances(
    redis: RedisServer, tmp_path: Path
) -> Iterator[tuple[GatewayProcess, GatewayProcess, str]]:
    prefix = f"inst-{uuid.uuid4().hex[:8]}"
    common = {
        "GATEWAY_REDIS_URL": redis.url,
        "GATEWAY_REDIS_PREFIX": prefix,
        "ENGINE_VAD": "0",
        "GATEWAY_LEASE_MS": "1500",
        "GATEWAY_LEASE_RENEW_MS": "300",
    }
    a = GatewayProcess(tmp_path / "a.log", **common)
    b = GatewayProcess(tmp_path / "b.log", **common)
    try:
        a.start(timeout=HOST_START_S)
        b.start(timeout=HOST_START_S)
        yield a, b, prefix
    finally:
        a.stop()
        b.stop()


async def test_application_reaches_a_call_on_another_instance(
    instances: tuple[GatewayProcess, GatewayProcess, str],
    redis: RedisServer,
    closing: list[NativeClient | TwilioPeer | AsteriskPeer],
) -> None:
    """The leg on instance A, the application on instance B: relayed over TCP; the
    directory entry lives as long as the call, and an instance that dies leaves none."""
    a, b, prefix = instances
    assert a.proc is not None
    token = a.token(tenant="acme")
    leg = await TwilioPeer.connect(f"ws://127.0.0.1:{a.port}/v1/twilio", access_token=token)
    closing.append(leg)
    await leg.begin()
    deadline = time.monotonic() + 5
    while not redis.keys(f"{prefix}:call:*"):
        assert time.monotonic() < deadline, "the call was not published"
        await asyncio.sleep(0.02)
    app = await attached_app(b.ws_url, token, leg.call_sid)
    closing.append(app)
    await app.send(type="speak", text="Hello from the other instance.")
    await app.wait_event("utterance_done", timeout=15)
    assert len(media_payloads(leg)) > 20
    assert level(leg) > 0.02

    a.proc.kill()  # the instance dies: no withdrawal, no close frames
    a.proc.wait()
    error = await app.wait_event("error", timeout=10)
    assert error["code"] == "call_lost"
    deadline = time.monotonic() + 5
    while redis.keys(f"{prefix}:call:*"):  # the lease (1.5 s here) runs out
        assert time.monotonic() < deadline, "the dead instance's call stayed in Redis"
        await asyncio.sleep(0.1)


async def test_call_entry_goes_with_the_call(
    instances: tuple[GatewayProcess, GatewayProcess, str],
    redis: RedisServer,
    closing: list[NativeClient | TwilioPeer | AsteriskPeer],
) -> None:
    a, _, prefix = instances
    leg = await TwilioPeer.connect(
        f"ws://127.0.0.1:{a.port}/v1/twilio", access_token=a.token(tenant="acme")
    )
    closing.append(leg)
    await leg.begin()
    deadline = time.monotonic() + 5
    while not redis.keys(f"{prefix}:call:*"):
        assert time.monotonic() < deadline, "the call was not published"
        await asyncio.sleep(0.02)
    await asyncio.sleep(1.0)  # renewed past its first lease period
    assert redis.keys(f"{prefix}:call:*")
    await leg.send_stop()
    deadline = time.monotonic() + 5
    while redis.keys(f"{prefix}:call:*"):
        assert time.monotonic() < deadline, "the ended call stayed in Redis"
        await asyncio.sleep(0.02)


def test_worker_processes_refuse_a_bad_worker_count(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path / "gateway.log", GATEWAY_WORKERS="0")
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "serve"],
        env=gw.env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert b"GATEWAY_WORKERS must be at least 1" in result.stderr
