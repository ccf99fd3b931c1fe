"""The SIP bridge against real SIP peers: sipp (Debian's ``sip-tester``) for the
signalling, our own RTP endpoint for the media (``tests/integration/sip_peers.py``).

Assertions are made where the caller is: the RTP that arrives (decoded length, sequence
numbers, timestamps, marker bits), the SIP that sipp sees (sipp fails a call on any
unexpected message or timeout), and what an attached IVR application is told.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import web

from gateway.legs.sip.routes import DEFAULT_ROUTES
from gateway.legs.sip.webhook import signature
from tests.integration import caller_audio
from tests.integration.conftest import Connect
from tests.integration.harness import (
    GatewayProcess,
    free_port,
    free_udp_port,
    metric,
    metric_reaches,
)
from tests.integration.sip_peers import (
    OK_TO_REQUEST,
    RtpPeer,
    ack,
    baresip_config,
    call_ended_by_gateway,
    decoded_dump,
    have_baresip,
    have_sipp,
    in_dialog,
    invite,
    offer_sdp,
    pause,
    play_pcap,
    recv,
    run_sipp,
    scenario,
)
from tests.integration.telephony_peers import attach, event_time

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not have_sipp(), reason="sipp (sip-tester) is not installed"),
]

GREETING = "Welcome to the voice gateway demo. To continue, please press 1."
EXTRA_ROUTES = """
[routes.ring]
application = true
answer_after_s = 3

[routes.transfer]
flow = "transfer"

[flows.transfer.steps.hand-over]
say = "Transferring you now."
transfer = "sip:agent@127.0.0.1"

[routes.hotline]
webhook = "http://127.0.0.1:{webhook_port}/sip"
webhook_secret_env = "HOTLINE_WEBHOOK_SECRET"
"""
WEBHOOK_SECRET = "hotline-secret"
DTMF_PCAP = "/usr/share/sip-tester/dtmf_2833_1.pcap"


@pytest.fixture(scope="module")
def webhook_port() -> int:
    """Where the ``hotline`` route's webhook listens (the test starts it)."""
    return free_port()


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, webhook_port: int
) -> Iterator[GatewayProcess]:
    tmp = tmp_path_factory.mktemp("sip-gateway")
    routes = tmp / "routes.toml"
    routes.write_text(DEFAULT_ROUTES + EXTRA_ROUTES.format(webhook_port=webhook_port))
    low = 40000 + (free_udp_port() % 200) * 100
    gw = GatewayProcess(
        tmp / "gateway.log",
        GATEWAY_SIP_LISTEN=f"127.0.0.1:{free_udp_port()}",
        GATEWAY_SIP_RTP_PORTS=f"{low}-{low + 99}",
        GATEWAY_SIP_ROUTES=str(routes),
        HOTLINE_WEBHOOK_SECRET=WEBHOOK_SECRET,
    )
    gw.start()
    yield gw
    gw.stop()


def sip_target(gw: GatewayProcess) -> tuple[str, int]:
    host, port = gw.env["GATEWAY_SIP_LISTEN"].rsplit(":", 1)
    return host, int(port)


def call_id() -> str:
    return f"test-{uuid.uuid4().hex[:12]}@127.0.0.1"


async def prompt_ms(connect: Connect, text: str, fmt: str = "mulaw_8000") -> int:
    """How long ``text`` plays in ``fmt`` when a native session speaks it."""
    client = await connect()
    await client.start(fmt=fmt, pacing="burst")
    await client.send(type="speak", text=text, utterance_id="u")
    done = await client.wait_event("utterance_done", utterance_id="u", timeout=20)
    await client.aclose()
    return int(done["audio_ms"])


def assert_one_clean_stream(peer: RtpPeer) -> None:
    """One SSRC, every sequence number once and in order, +160 per packet within a
    talkspurt, the marker bit exactly at talkspurt starts."""
    packets = peer.received
    assert packets
    assert len({p.ssrc for p in packets}) == 1
    for previous, packet in itertools.pairwise(packets):
        assert packet.sequence == (previous.sequence + 1) & 0xFFFF, "a sequence gap"
        step = (packet.timestamp - previous.timestamp) & 0xFFFFFFFF
        if packet.marker:
            assert step >= 160
        else:
            assert step == 160, f"timestamp step {step} inside a talkspurt"
    assert packets[0].marker


# --------------------------------------------------------------------------- the demo


@pytest.mark.parametrize("codec", ["PCMU", "PCMA"])
async def test_the_demo_ivr_greets_takes_a_digit_confirms_and_hangs_up(
    gateway: GatewayProcess, connect: Connect, tmp_path: Path, codec: str
) -> None:
    peer = await RtpPeer.open(codec)
    cid = call_id()
    xml = scenario(
        "demo",
        invite("ivr", offer_sdp(peer.port, (codec,))),
        recv(100, optional=True),
        recv(180, optional=True),
        recv(200, rrs=True),
        ack("ivr"),
        recv(request="BYE", timeout_ms=40000),
        OK_TO_REQUEST,
    )
    try:
        sipp = asyncio.ensure_future(run_sipp(xml, sip_target(gateway), tmp_path, call_id=cid))
        await peer.wait_packets(10)
        await peer.wait_quiet(0.5)
        greeting_packets = len(peer.received)
        await peer.send_digit("1")
        result = await sipp
        assert result.returncode == 0, result.output
    finally:
        peer.close()
    fmt = "mulaw_8000" if codec == "PCMU" else "alaw_8000"
    expected = await prompt_ms(connect, GREETING, fmt)
    assert abs(greeting_packets * 20 - expected) <= 20
    greeting = peer.audio()[: greeting_packets * 160]
    assert caller_audio.level_dbfs(greeting) > -35  # speech, not silence
    assert_one_clean_stream(peer)
    spurts = peer.talkspurts()
    assert len(spurts) >= 2  # the greeting, then the confirmation and goodbye
    log = gateway.log_text()
    assert f"call {cid}: flow demo step confirm" in log
    assert f"call {cid}: flow demo step goodbye" in log
    assert peer.rtcp and peer.rtcp[0][1] == 200  # an RTCP sender report (RFC 3550 6.4.1)


async def test_sipp_rfc4733_digits_reach_the_flow(gateway: GatewayProcess, tmp_path: Path) -> None:
    media = free_udp_port() & ~1
    cid = call_id()
    xml = scenario(
        "dtmf",
        invite("ivr", offer_sdp(media, ("PCMU",))),
        recv(100, optional=True),
        recv(200, rrs=True),
        ack("ivr"),
        pause(1500),
        play_pcap(DTMF_PCAP),
        recv(request="BYE", timeout_ms=30000),
        OK_TO_REQUEST,
    )
    result = await run_sipp(xml, sip_target(gateway), tmp_path, media_port=media, call_id=cid)
    assert result.returncode == 0, result.output
    assert f"call {cid}: flow demo step confirm" in gateway.log_text()
    assert await metric(gateway, "gateway_sip_dtmf_total") >= 1


# --------------------------------------------------------------------------- a webhook


async def test_a_webhook_route_is_told_the_call_and_its_digits_and_hangs_up(
    gateway: GatewayProcess, webhook_port: int, tmp_path: Path
) -> None:
    posted: list[tuple[dict[str, Any], str]] = []

    async def hotline(request: web.Request) -> web.Response:
        body = await request.read()
        stamp = request.headers["X-Gateway-Timestamp"]
        valid = request.headers["X-Gateway-Signature"] == signature(
            WEBHOOK_SECRET.encode(), stamp, body
        )
        doc = json.loads(body)
        posted.append((doc, "signed" if valid else "forged"))
        if doc["event"] == "call_started":
            return web.json_response(
                {"actions": [{"say": "Press a key.", "gather": {"digits": 1, "timeout_s": 20}}]}
            )
        return web.json_response({"actions": [{"say": "You pressed {digits}."}, {"hangup": True}]})

    app = web.Application()
    app.router.add_post("/sip", hotline)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", webhook_port).start()
    media = free_udp_port() & ~1
    cid = call_id()
    xml = scenario(
        "webhook",
        invite("hotline", offer_sdp(media, ("PCMU",))),
        recv(100, optional=True),
        recv(200, rrs=True),
        ack("hotline"),
        pause(1500),
        play_pcap(DTMF_PCAP),
        recv(request="BYE", timeout_ms=30000),
        OK_TO_REQUEST,
    )
    try:
        result = await run_sipp(xml, sip_target(gateway), tmp_path, media_port=media, call_id=cid)
    finally:
        await runner.cleanup()
    assert result.returncode == 0, result.output
    (started, how), (gathered, how_2) = posted
    assert how == how_2 == "signed"
    assert started["event"] == "call_started" and started["call_id"] == cid
    assert started["to"] == "hotline" and started["from"].startswith("sip:sipp@")
    assert started["tenant"] == "sip"
    assert gathered["event"] == "gathered" and gathered["digits"] == "1"
    assert await metric(gateway, "gateway_sip_webhook_requests_total", outcome="ok") >= 2


# --------------------------------------------------------------------------- the application


@pytest.mark.realtime  # barge-in timing: runs alone (Makefile)
async def test_an_application_gets_digits_barge_in_and_hangs_up(
    gateway: GatewayProcess,
    connect: Connect,
    tmp_path: Path,
) -> None:
    peer = await RtpPeer.open("PCMU")
    cid = call_id()
    xml = call_ended_by_gateway("app", "app", offer_sdp(peer.port, ("PCMU",)))
    speech = caller_audio.espeak_speech()
    try:
        sipp = asyncio.ensure_future(run_sipp(xml, sip_target(gateway), tmp_path, call_id=cid))

        async def app_connect(token: str | None = "") -> object:
            return await connect(gateway.token(tenant="sip"))

        app = await attach(app_connect, cid)  # type: ignore[arg-type]
        await app.send(type="speak", text="Hello.", utterance_id="hello")
        await app.wait_event("utterance_done", utterance_id="hello", timeout=10)
        assert peer.remote is not None
        await peer.send_digit("5")
        assert (await app.wait_event("dtmf", timeout=5))["digit"] == "5"
        await peer.send_digit("#")
        assert (await app.wait_event("dtmf", count=2, timeout=5))["digit"] == "#"

        menu = "For billing, press 1. For technical support, press 2. " * 3
        await app.send(type="speak", text=menu, utterance_id="menu")
        await app.wait_event("utterance_started", utterance_id="menu")
        lead_in = 1.0
        start = await peer.send_audio(np.concatenate([caller_audio.silence(lead_in), speech]))
        barge = await app.wait_event("barge_in", timeout=5)
        assert event_time(app, barge) - (start + lead_in) <= 0.300
        assert not app.got.of_type("utterance_done")[1:]  # the menu did not finish
        # The prompt stopped at the caller's ear: nothing after the barge-in but the lead.
        after = [p for p in peer.received if p.at > event_time(app, barge) + 0.1]
        assert len(after) <= 5

        await app.send(type="hangup")
        ended = await app.wait_event("call_ended", timeout=10)
        assert ended["call_id"] == cid
        result = await sipp
        assert result.returncode == 0, result.output
    finally:
        peer.close()
    assert_one_clean_stream(peer)


@pytest.mark.skipif(not have_baresip(), reason="baresip is not installed")
async def test_baresip_calls_in_and_hears_the_whole_prompt(
    gateway: GatewayProcess, connect: Connect, tmp_path: Path
) -> None:
    dumps = baresip_config(tmp_path / "baresip")
    host, port = sip_target(gateway)
    started_before = set(re.findall(r"sip call (\S+) started", gateway.log_text()))
    proc = await asyncio.create_subprocess_exec(
        "baresip", "-f", str(tmp_path / "baresip"), "-e", f"/dial sip:app@{host}:{port}",
        "-t", "30",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        cid = ""
        async with asyncio.timeout(10):
            while not cid:
                calls = set(re.findall(r"sip call (\S+) started", gateway.log_text()))
                cid = next(iter(calls - started_before), "")
                await asyncio.sleep(0.05)
        app = await attach(lambda token="": connect(gateway.token(tenant="sip")), cid)
        text = "Thank you for calling. Your order has shipped."
        await app.send(type="speak", text=text, utterance_id="p")
        done = await app.wait_event("utterance_done", utterance_id="p", timeout=15)
        await asyncio.sleep(0.6)  # baresip plays out its jitter buffer (5-10 packets)
        await app.send(type="hangup")
        ended = await app.wait_event("call_ended", timeout=10)
        assert ended["call_id"] == cid
        assert proc.stdout is not None
        async with asyncio.timeout(10):  # baresip saw our BYE
            while b"terminated" not in (line := await proc.stdout.readline()):
                assert line, "baresip exited before the call ended"
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()
    heard = decoded_dump(dumps)
    assert abs(len(heard) / 8 - done["audio_ms"]) <= 60  # every frame, nothing more
    assert caller_audio.level_dbfs(heard) > -35


# --------------------------------------------------------------------------- dialogs


@pytest.mark.realtime  # stopped within 0.5 s: runs alone (Makefile)
async def test_a_caller_bye_mid_prompt_ends_the_call_and_its_audio(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    peer = await RtpPeer.open("PCMU")
    xml = scenario(
        "bye",
        invite("ivr", offer_sdp(peer.port, ("PCMU",))),
        recv(100, optional=True),
        recv(200, rrs=True),
        ack("ivr"),
        pause(1500),
        in_dialog("BYE", "ivr", 2),
        recv(200),
    )
    try:
        result = await run_sipp(xml, sip_target(gateway), tmp_path)
        assert result.returncode == 0, result.output
        count = len(peer.received)
        assert count > 20  # it was speaking
        await asyncio.sleep(0.5)
        assert len(peer.received) <= count + 4  # stopped at once (the lead at most)
    finally:
        peer.close()
    await asyncio.sleep(0.3)
    assert await metric(gateway, "gateway_sip_calls_active") == 0
    assert await metric(gateway, "gateway_sessions_active", protocol="sip") == 0


async def test_cancel_before_answer_gets_487_and_nothing_is_kept(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    peer = await RtpPeer.open("PCMU")
    branch = f"z9hG4bK-{uuid.uuid4().hex[:10]}"
    sdp = offer_sdp(peer.port, ("PCMU",))
    xml = scenario(
        "cancel",
        invite("ring", sdp).replace("branch=[branch]", f"branch={branch}"),
        recv(100, optional=True),
        recv(180),
        pause(300),
        in_dialog("CANCEL", "ring", 1)
        .replace("branch=[branch]", f"branch={branch}")
        .replace("[peer_tag_param]", ""),
        recv(200),
        recv(487),
        ack("ring").replace("branch=[branch]", f"branch={branch}"),
    )
    try:
        result = await run_sipp(xml, sip_target(gateway), tmp_path)
        assert result.returncode == 0, result.output
        await asyncio.sleep(3.5)  # past the route's answer_after_s
        assert peer.received == []
    finally:
        peer.close()
    assert await metric(gateway, "gateway_sip_calls_active") == 0


async def test_hold_pauses_the_prompt_and_unhold_resumes_it_without_a_gap(
    gateway: GatewayProcess, connect: Connect, tmp_path: Path
) -> None:
    peer = await RtpPeer.open("PCMU")
    cid = call_id()
    hold = offer_sdp(peer.port, ("PCMU",), direction="sendonly")
    resume = offer_sdp(peer.port, ("PCMU",))
    check = (
        '  <recv response="200"><action><ereg regexp="a={0}" search_in="body" '
        'check_it="true" assign_to="d{1}"/></action></recv>\n'
    )
    xml = scenario(
        "hold",
        invite("app", resume),
        recv(100, optional=True),
        recv(200, rrs=True),
        ack("app"),
        pause(2000),
        in_dialog("INVITE", "app", 2, hold),
        recv(100, optional=True),
        check.format("recvonly", 1),
        ack("app", 2),
        pause(1500),
        in_dialog("INVITE", "app", 3, resume),
        recv(100, optional=True),
        check.format("sendrecv", 2),
        ack("app", 3),
        pause(1500),
        in_dialog("BYE", "app", 4),
        recv(200),
        '  <Reference variables="d1,d2"/>\n',  # sipp refuses variables it never reads
    )
    try:
        sipp = asyncio.ensure_future(run_sipp(xml, sip_target(gateway), tmp_path, call_id=cid))
        app = await attach(lambda token="": connect(gateway.token(tenant="sip")), cid)
        await app.send(type="speak", text="Please hold while we look at your account. " * 6)
        result = await sipp
        assert result.returncode == 0, result.output
    finally:
        peer.close()
    arrivals = [p.at for p in peer.received]
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert max(gaps) >= 1.2  # nothing was sent while on hold
    assert_one_clean_stream(peer)  # and no sequence gap across it; a marker at resume
    assert sum(p.marker for p in peer.received) >= 2


async def test_a_flow_transfers_with_refer_and_hangs_up_once_accepted(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    peer = await RtpPeer.open("PCMU")
    accept_refer = """  <recv request="REFER" timeout="15000">
    <action><ereg regexp="sip:agent@127[.]0[.]0[.]1" search_in="hdr" header="Refer-To:"
      check_it="true" assign_to="r"/></action>
  </recv>
  <send>
    <![CDATA[

      SIP/2.0 202 Accepted
      [last_Via:]
      [last_From:]
      [last_To:]
      [last_Call-ID:]
      [last_CSeq:]
      Content-Length: 0

    ]]>
  </send>
"""
    xml = scenario(
        "refer",
        invite("transfer", offer_sdp(peer.port, ("PCMU",))),
        recv(100, optional=True),
        recv(200, rrs=True),
        ack("transfer"),
        accept_refer,
        recv(request="BYE", timeout_ms=10000),
        OK_TO_REQUEST,
        '  <Reference variables="r"/>\n',
    )
    try:
        result = await run_sipp(xml, sip_target(gateway), tmp_path)
        assert result.returncode == 0, result.output
        assert len(peer.received) > 20  # the announcement played before the REFER
    finally:
        peer.close()


# --------------------------------------------------------------------------- refusals


async def test_no_common_codec_gets_488(gateway: GatewayProcess, tmp_path: Path) -> None:
    xml = scenario(
        "488",
        invite("ivr", offer_sdp(30000, ("G729",))),
        recv(100, optional=True),
        recv(488),
        ack("ivr"),
    )
    result = await run_sipp(xml, sip_target(gateway), tmp_path)
    assert result.returncode == 0, result.output


async def test_an_unknown_user_gets_404(gateway: GatewayProcess, tmp_path: Path) -> None:
    xml = scenario(
        "404",
        invite("nobody", offer_sdp(30000, ("PCMU",))),
        recv(100, optional=True),
        recv(404),
        ack("nobody"),
    )
    result = await run_sipp(xml, sip_target(gateway), tmp_path)
    assert result.returncode == 0, result.output


async def udp_exchange(target: tuple[str, int], data: bytes, timeout: float = 3.0) -> bytes:
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[bytes] = loop.create_future()

    class Client(asyncio.DatagramProtocol):
        def datagram_received(self, data: bytes, addr: object) -> None:
            if not answer.done() and not data.startswith(b"SIP/2.0 100"):
                answer.set_result(data)

    transport, _ = await loop.create_datagram_endpoint(Client, local_addr=("127.0.0.1", 0))
    try:
        port = transport.get_extra_info("sockname")[1]
        transport.sendto(data.replace(b"PORT", str(port).encode()), target)
        async with asyncio.timeout(timeout):
            return await answer
    finally:
        transport.close()


def request(method: str, *, cseq: str | None = None) -> bytes:
    lines = [
        f"{method} sip:ivr@127.0.0.1 SIP/2.0",
        f"Via: SIP/2.0/UDP 127.0.0.1:PORT;branch=z9hG4bK{uuid.uuid4().hex[:8]};rport",
        "From: <sip:probe@127.0.0.1>;tag=1",
        "To: <sip:ivr@127.0.0.1>",
        f"Call-ID: {uuid.uuid4().hex}",
        f"CSeq: {cseq or '1 ' + method}",
        "Max-Forwards: 70",
        "Content-Length: 0",
        "",
        "",
    ]
    return "\r\n".join(lines).encode()


async def test_options_malformed_and_unsupported_requests(gateway: GatewayProcess) -> None:
    target = sip_target(gateway)
    assert (await udp_exchange(target, request("OPTIONS"))).startswith(b"SIP/2.0 200")
    assert (await udp_exchange(target, request("OPTIONS", cseq="x OPTIONS"))).startswith(
        b"SIP/2.0 400"
    )
    assert re.match(rb"SIP/2.0 (405|501)", await udp_exchange(target, request("SUBSCRIBE")))
    assert (await udp_exchange(target, request("BYE"))).startswith(b"SIP/2.0 481")
    # A Via asking for an impossible port must not take the socket down with it.
    for rport in (b"99999", "²".encode()):
        hostile = request("OPTIONS").replace(b";rport", b";rport=" + rport)
        await udp_exchange(target, hostile)
    assert (await udp_exchange(target, request("OPTIONS"))).startswith(b"SIP/2.0 200")


async def test_an_untrusted_source_gets_403_and_nothing_is_kept(tmp_path: Path) -> None:
    gw = GatewayProcess(
        tmp_path / "gateway.log",
        GATEWAY_SIP_LISTEN=f"127.0.0.1:{free_udp_port()}",
        GATEWAY_SIP_ALLOW="10.0.0.0/8=carrier",
        ENGINE_VAD="0",
    )
    gw.start()
    try:
        body = offer_sdp(30000, ("PCMU",)).replace("\n", "\r\n").encode()
        invite_bytes = (
            request("INVITE").replace(
                b"Content-Length: 0",
                b"Content-Type: application/sdp\r\nContent-Length: %d" % len(body),
            )
            + body
        )
        answer = await udp_exchange(sip_target(gw), invite_bytes)
        assert answer.startswith(b"SIP/2.0 403")
        assert await metric(gw, "gateway_sip_refused_total", reason="untrusted") == 1
        assert await metric(gw, "gateway_sip_calls_active") == 0
    finally:
        gw.stop()


@pytest.mark.realtime  # re-INVITE done within 4 s of launching sipp: runs alone
async def test_a_reinvite_that_moves_the_media_latches_again_on_the_new_source(
    gateway: GatewayProcess, connect: Connect, tmp_path: Path
) -> None:
    """The caller's media moves (a re-INVITE naming a new port, as after a transfer by a
    PBX or a NAT rebinding): the gateway latches again on the first packet from the new
    source, even when it is not the port the SDP named, and the old source is dropped."""
    first, moved = await RtpPeer.open(), await RtpPeer.open()
    announced = free_udp_port() & ~1  # named in the re-INVITE; the media comes from `moved`
    cid = call_id()
    xml = scenario(
        "move",
        invite("app", offer_sdp(first.port, ("PCMU",))),
        recv(100, optional=True),
        recv(200, rrs=True),
        ack("app"),
        pause(3000),
        in_dialog("INVITE", "app", 2, offer_sdp(announced, ("PCMU",))),
        recv(100, optional=True),
        recv(200),
        ack("app", 2),
        recv(request="BYE", timeout_ms=30000),
        OK_TO_REQUEST,
    )
    try:
        started = time.monotonic()
        sipp = asyncio.ensure_future(run_sipp(xml, sip_target(gateway), tmp_path, call_id=cid))
        app = await attach(lambda token="": connect(gateway.token(tenant="sip")), cid)
        await app.send(type="speak", text="Hello.", utterance_id="one")
        await app.wait_event("utterance_done", utterance_id="one", timeout=10)
        await first.send_audio(caller_audio.silence(0.3))  # latched on `first`
        before_move = len(first.received)
        assert before_move > 0 and moved.received == []
        await asyncio.sleep(max(0.0, started + 4.0 - time.monotonic()))  # re-INVITE done
        dropped = await metric(gateway, "gateway_sip_rtp_dropped_total")
        moved.remote = first.remote  # the gateway's RTP port: the call's, unchanged
        await moved.send_audio(caller_audio.silence(0.3))  # latches on `moved`
        await first.send_audio(caller_audio.silence(0.2))  # the old source: dropped
        await app.send(type="speak", text="Hello again.", utterance_id="two")
        await app.wait_event("utterance_done", utterance_id="two", timeout=10)
        await moved.wait_packets(10)
        assert len(first.received) == before_move
        assert await metric(gateway, "gateway_sip_rtp_dropped_total") >= dropped + 10
        await app.send(type="hangup")
        result = await sipp
        assert result.returncode == 0, result.output
    finally:
        first.close()
        moved.close()


# --------------------------------------------------------------------------- watchdogs, drain

WATCHDOG_ROUTES = """
[routes.hold]
flow = "hold"

[flows.hold.steps.music]
say = "Please hold."
next = "music"

[routes.ring]
application = true
answer_after_s = 8
"""


async def test_a_silent_caller_and_an_endless_call_are_hung_up_and_the_drain_refuses_ringing(
    tmp_path: Path,
) -> None:
    routes = tmp_path / "routes.toml"
    routes.write_text(WATCHDOG_ROUTES)
    gw = GatewayProcess(
        tmp_path / "gateway.log",
        GATEWAY_SIP_LISTEN=f"127.0.0.1:{free_udp_port()}",
        GATEWAY_SIP_ROUTES=str(routes),
        GATEWAY_SIP_MAX_CALL_S="10",
        GATEWAY_SIP_RTP_TIMEOUT_S="5",
        ENGINE_VAD="0",
    )
    gw.start()
    talking, silent = await RtpPeer.open(), await RtpPeer.open()
    try:

        def held(peer: RtpPeer, seconds: int) -> str:
            return scenario(
                "held",
                invite("hold", offer_sdp(peer.port, ("PCMU",))),
                recv(100, optional=True),
                recv(200, rrs=True),
                ack("hold"),
                recv(request="BYE", timeout_ms=seconds * 1000),
                OK_TO_REQUEST,
            )

        started = time.monotonic()
        calls = [
            asyncio.ensure_future(run_sipp(held(talking, 20), sip_target(gw), tmp_path)),
            asyncio.ensure_future(run_sipp(held(silent, 20), sip_target(gw), tmp_path)),
        ]
        await talking.wait_packets(1)  # where the gateway sends from: answer from there
        sending = asyncio.ensure_future(talking.send_audio(caller_audio.silence(20)))
        silent_result = await calls[1]
        silent_after = time.monotonic() - started
        talking_result = await calls[0]
        talking_after = time.monotonic() - started
        sending.cancel()
        assert silent_result.returncode == 0, silent_result.output
        assert talking_result.returncode == 0, talking_result.output
        # No RTP for GATEWAY_SIP_RTP_TIMEOUT_S (checked every 5 s): BYE after 5 to 10 s;
        # RTP all along, but longer than GATEWAY_SIP_MAX_CALL_S: BYE after 10 to 15 s.
        assert 5 <= silent_after <= 11.5, silent_after
        assert 10 <= talking_after <= 16.5, talking_after
        assert await metric(gw, "gateway_sip_calls_total", reason="rtp_timeout") == 1
        assert await metric(gw, "gateway_sip_calls_total", reason="max_duration") == 1

        # A call still ringing when the worker drains is refused with 503 and Retry-After:
        # the PBX tries another instance.
        refused = scenario(
            "drained",
            invite("ring", offer_sdp(silent.port, ("PCMU",))),
            recv(100, optional=True),
            recv(180),
            recv(503),
            ack("ring"),
        )
        ringing = asyncio.ensure_future(run_sipp(refused, sip_target(gw), tmp_path))
        await asyncio.sleep(1.5)  # ringing: the 180 went out at once, the answer is 8 s away
        assert gw.proc is not None
        gw.proc.send_signal(signal.SIGTERM)
        result = await ringing
        assert result.returncode == 0, result.output
    finally:
        talking.close()
        silent.close()
        gw.stop()


# --------------------------------------------------------------------------- trunks (digest)

TRUNK_ROUTES = """
[trunks.carrier]
username = "acme"
password_env = "ACME_TRUNK_PASSWORD"
tenant = "acme"
"""


def authenticated_call(user: str, media_port: int, *, accepted: bool) -> str:
    """INVITE, 401, ACK, INVITE with credentials (sipp's [authentication]), then 200 and
    a BYE from the caller, or 403 and its ACK."""
    auth = invite(user, offer_sdp(media_port, ("PCMU",))).replace(
        "CSeq: 1 INVITE", "CSeq: 2 INVITE\\n      [authentication]".replace("\\n", "\n")
    )
    ack_401 = ack(user).replace("[peer_tag_param]", "")
    steps = [
        invite(user, offer_sdp(media_port, ("PCMU",))),
        recv(100, optional=True),
        '  <recv response="401" auth="true"/>\n',
        ack_401,
        auth,
        recv(100, optional=True),
    ]
    if accepted:
        steps += [recv(200, rrs=True), ack(user, 2), pause(1000), in_dialog("BYE", user, 3)]
        steps += [recv(200)]
    else:
        steps += [recv(403), ack(user, 2)]
    return scenario("trunk", *steps)


async def test_a_trunk_outside_the_allowed_networks_gets_in_by_digest_and_only_with_it(
    tmp_path: Path,
) -> None:
    routes = tmp_path / "routes.toml"
    routes.write_text(DEFAULT_ROUTES + TRUNK_ROUTES)
    gw = GatewayProcess(
        tmp_path / "gateway.log",
        GATEWAY_SIP_LISTEN=f"127.0.0.1:{free_udp_port()}",
        GATEWAY_SIP_ALLOW="10.0.0.0/8=carrier",  # the loopback is not trusted here
        GATEWAY_SIP_ROUTES=str(routes),
        ACME_TRUNK_PASSWORD="correct horse",
        ENGINE_VAD="0",
    )
    gw.start()
    try:
        media = free_udp_port() & ~1
        good = await run_sipp(
            authenticated_call("ivr", media, accepted=True),
            sip_target(gw),
            tmp_path,
            extra_args=["-au", "acme", "-ap", "correct horse"],
        )
        assert good.returncode == 0, good.output
        assert await metric_reaches(gw, "gateway_sip_calls_total", 1, reason="remote_bye") == 1
        assert re.search(r"sip call \S+ started", gw.log_text())
        bad = await run_sipp(
            authenticated_call("ivr", media, accepted=False),
            sip_target(gw),
            tmp_path,
            extra_args=["-au", "acme", "-ap", "battery staple"],
        )
        assert bad.returncode == 0, bad.output
        assert await metric(gw, "gateway_sip_refused_total", reason="challenged") == 2
        assert await metric(gw, "gateway_sip_refused_total", reason="bad_credentials") == 1
        assert await metric(gw, "gateway_sip_calls_total", reason="remote_bye") == 1
        assert len(re.findall(r"sip call \S+ started", gw.log_text())) == 1
    finally:
        gw.stop()
