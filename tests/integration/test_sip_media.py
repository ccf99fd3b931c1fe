"""Where the SIP bridge sends media (issue 29 items 4 and 5), against a running gateway
with real UDP sockets on loopback.

The caller is written by hand (:class:`Caller`: every byte and every moment of its SIP is
the test's), its media and the third parties are plain UDP sockets that count what
arrives (:class:`Counter`). The "victim" is a pair of sockets on 127.0.0.9, an address
the calls' signalling never comes from and ``GATEWAY_SIP_MEDIA_NETWORKS`` does not name:
nothing may ever arrive there. 127.0.0.10 is a network the setting names for calls from
127.0.0.1 (a media server beside the signalling one).
"""

from __future__ import annotations

import asyncio
import functools
import random
import re
import socket
import struct
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from gateway.legs.sip.routes import DEFAULT_ROUTES
from tests.integration.harness import GatewayProcess, free_udp_port, metric

pytestmark = [pytest.mark.slow]

VICTIM = "127.0.0.9"
MEDIA_SERVER = "127.0.0.10"
RTP_TIMEOUT_S = 5  # the least GATEWAY_SIP_RTP_TIMEOUT_S: the unanswered cap is 250 packets
PTIME_S = 0.02
PORTS = 40  # the gateway's RTP range: 20 calls


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    tmp = tmp_path_factory.mktemp("sip-media")
    routes = tmp / "routes.toml"
    routes.write_text(DEFAULT_ROUTES)
    low = 42000 + (free_udp_port() % 100) * PORTS
    gw = GatewayProcess(
        tmp / "gateway.log",
        GATEWAY_SIP_LISTEN=f"127.0.0.1:{free_udp_port()}",
        GATEWAY_SIP_RTP_PORTS=f"{low}-{low + PORTS - 1}",
        GATEWAY_SIP_ROUTES=str(routes),
        GATEWAY_SIP_MEDIA_NETWORKS=f"127.0.0.1/32={MEDIA_SERVER}/32",
        GATEWAY_SIP_RTP_TIMEOUT_S=str(RTP_TIMEOUT_S),
        ENGINE_VAD="0",
    )
    gw.start()
    yield gw
    gw.stop()


def rtp_range(gw: GatewayProcess) -> range:
    low, high = (int(p) for p in gw.env["GATEWAY_SIP_RTP_PORTS"].split("-"))
    return range(low, high + 1)


# --------------------------------------------------------------------------- peers


class Counter(asyncio.DatagramProtocol):
    """An RTP/RTCP socket pair that counts what arrives and can send RTP itself."""

    def __init__(self) -> None:
        self.rtp: list[bytes] = []
        self.rtcp: list[bytes] = []
        self.rtp_sources: set[tuple[str, int]] = set()
        self.transport: asyncio.DatagramTransport | None = None
        self._rtcp_transport: asyncio.DatagramTransport | None = None
        self.host = ""
        self.port = 0
        self._seq = random.getrandbits(16)

    @classmethod
    async def open(cls, host: str) -> Counter:
        loop = asyncio.get_running_loop()
        for _ in range(50):
            counter = cls()
            port = random.randrange(30000, 39998, 2)
            try:
                rtp, _ = await loop.create_datagram_endpoint(
                    functools.partial(_Rtp, counter), local_addr=(host, port)
                )
            except OSError:
                continue
            try:
                rtcp, _ = await loop.create_datagram_endpoint(
                    functools.partial(_Rtcp, counter), local_addr=(host, port + 1)
                )
            except OSError:
                rtp.close()
                continue
            counter.transport, counter._rtcp_transport = rtp, rtcp
            counter.host, counter.port = host, port
            return counter
        raise RuntimeError("no free port pair")

    def send_rtp(self, destination: tuple[str, int], count: int = 1) -> None:
        """``count`` PCMU packets of silence (payload type 0)."""
        assert self.transport is not None
        for _ in range(count):
            header = struct.pack("!BBHII", 0x80, 0, self._seq, self._seq * 160, 0x1234)
            self.transport.sendto(header + b"\xff" * 160, destination)
            self._seq = (self._seq + 1) & 0xFFFF

    async def wait_rtp(self, count: int, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while len(self.rtp) < count:  # noqa: ASYNC110 - packets, not an event
                await asyncio.sleep(0.01)

    def close(self) -> None:
        for transport in (self.transport, self._rtcp_transport):
            if transport is not None:
                transport.close()


class _Rtp(asyncio.DatagramProtocol):
    def __init__(self, counter: Counter) -> None:
        self._counter = counter

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self._counter.rtp.append(data)
        self._counter.rtp_sources.add((str(addr[0]), int(addr[1])))


class _Rtcp(asyncio.DatagramProtocol):
    def __init__(self, counter: Counter) -> None:
        self._counter = counter

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self._counter.rtcp.append(data)


def offer(address: str, port: int, *, addrtype: str = "IP4", extra: str = "") -> str:
    """An audio offer (PCMU, RFC 4733 digits) with its media at ``address``."""
    return (
        "v=0\r\n"
        f"o=caller 1 1 IN {addrtype} {address}\r\n"
        "s=-\r\n"
        f"c=IN {addrtype} {address}\r\n"
        "t=0 0\r\n"
        f"m=audio {port} RTP/AVP 0 101\r\n"
        "a=rtpmap:0 PCMU/8000\r\n"
        "a=rtpmap:101 telephone-event/8000\r\n"
        "a=ptime:20\r\n"
        f"{extra}"
    )


class Caller(asyncio.DatagramProtocol):
    """One SIP dialog from 127.0.0.1, written by hand: INVITE, ACK, re-INVITE, BYE; the
    gateway's requests (its BYE) are answered 200 and kept."""

    def __init__(self, target: tuple[str, int], local: str = "127.0.0.1") -> None:
        self.target = target
        self.local = local
        self.host = f"[{local}]" if ":" in local else local  # as a SIP URI writes it
        self.responses: asyncio.Queue[bytes] = asyncio.Queue()
        self.requests: list[bytes] = []
        self.transport: asyncio.DatagramTransport | None = None
        self.port = 0
        self.call_id = f"media-{uuid.uuid4().hex[:12]}@127.0.0.1"
        self.tag = uuid.uuid4().hex[:8]
        self.to_tag = ""
        self.branch = ""
        self.answer = b""  # the gateway's SDP
        self.byed = False

    @classmethod
    async def open(cls, target: tuple[str, int], local: str = "127.0.0.1") -> Caller:
        loop = asyncio.get_running_loop()
        caller = cls(target, local)
        await loop.create_datagram_endpoint(lambda: caller, local_addr=(local, 0))
        assert caller.transport is not None
        caller.port = int(caller.transport.get_extra_info("sockname")[1])
        return caller

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        if data.startswith(b"SIP/2.0 "):
            self.responses.put_nowait(data)
            return
        self.requests.append(data)
        head = data.split(b"\r\n\r\n", 1)[0].split(b"\r\n")
        keep = [
            line
            for line in head[1:]
            if line.split(b":", 1)[0].lower() in (b"via", b"from", b"to", b"call-id", b"cseq")
        ]
        reply = b"\r\n".join([b"SIP/2.0 200 OK", *keep, b"Content-Length: 0", b"", b""])
        assert self.transport is not None
        self.transport.sendto(reply, (str(addr[0]), int(addr[1])))

    @property
    def gateway_bye(self) -> bool:
        return any(r.startswith(b"BYE ") for r in self.requests)

    def _send(self, method: str, cseq: int, body: str = "", *, new_branch: bool = True) -> None:
        if new_branch:
            self.branch = f"z9hG4bK{uuid.uuid4().hex[:12]}"
        to = "<sip:ivr@127.0.0.1>" + (f";tag={self.to_tag}" if self.to_tag else "")
        target = f"[{self.target[0]}]" if ":" in self.target[0] else self.target[0]
        lines = [
            f"{method} sip:ivr@{target}:{self.target[1]} SIP/2.0",
            f"Via: SIP/2.0/UDP {self.host}:{self.port};branch={self.branch};rport",
            f"From: <sip:caller@{self.host}>;tag={self.tag}",
            f"To: {to}",
            f"Call-ID: {self.call_id}",
            f"CSeq: {cseq} {method}",
            f"Contact: <sip:caller@{self.host}:{self.port}>",
            "Max-Forwards: 70",
        ]
        if body:
            lines.append("Content-Type: application/sdp")
        lines += [f"Content-Length: {len(body.encode())}", "", body]
        assert self.transport is not None
        self.transport.sendto("\r\n".join(lines).encode(), self.target)

    async def final(self, timeout: float = 10.0) -> int:
        """The status of the next final response (provisional ones skipped)."""
        async with asyncio.timeout(timeout):
            while True:
                data = await self.responses.get()
                status = int(data[8:11])
                if status >= 200:
                    break
        to = re.search(rb"\r\nTo:[^\r]*;tag=([^;\r]+)", data, re.IGNORECASE)
        if to is not None:
            self.to_tag = to.group(1).decode()
        if status == 200 and b"\r\n\r\n" in data:
            self.answer = data.split(b"\r\n\r\n", 1)[1] or self.answer
        return status

    async def invite(self, sdp: str) -> int:
        self._send("INVITE", 1, sdp)
        return await self.final()

    def ack(self, cseq: int = 1, *, for_error: bool = False) -> None:
        # the ACK of an error response is part of the INVITE transaction (same branch)
        self._send("ACK", cseq, new_branch=not for_error)

    async def reinvite(self, sdp: str, cseq: int) -> int:
        self._send("INVITE", cseq, sdp)
        return await self.final()

    async def bye(self, cseq: int) -> int:
        self.byed = True
        self._send("BYE", cseq)
        return await self.final()

    @property
    def media(self) -> tuple[str, int]:
        """Where the gateway takes this call's RTP (its answer's c= and m=)."""
        address = re.search(rb"c=IN IP[46] (\S+)", self.answer)
        port = re.search(rb"m=audio (\d+)", self.answer)
        assert address is not None and port is not None, self.answer
        return address.group(1).decode(), int(port.group(1))

    def close(self) -> None:
        """Hang up a call a failed test left (so the next test starts with none)."""
        if self.transport is not None:
            if self.answer and not (self.byed or self.gateway_bye):
                self._send("BYE", 99)
            self.transport.close()


def sip_target(gw: GatewayProcess) -> tuple[str, int]:
    host, port = gw.env["GATEWAY_SIP_LISTEN"].rsplit(":", 1)
    return host, int(port)


async def hang_up(caller: Caller, cseq: int) -> None:
    if not caller.gateway_bye:
        assert await caller.bye(cseq) == 200


async def gone(gw: GatewayProcess) -> None:
    """Every call of the tests before has ended (their BYE's teardown ran). Waits for it
    (``metric_reaches`` waits for a metric to rise, and 0 is reached at once)."""
    deadline = time.monotonic() + 10
    while await metric(gw, "gateway_sip_calls_active") > 0:
        assert time.monotonic() < deadline, "a call of an earlier test is still active"
        await asyncio.sleep(0.05)


# --------------------------------------------------------------------------- item 4


async def test_nothing_is_sent_before_the_ack_and_media_starts_with_it(
    gateway: GatewayProcess,
) -> None:
    """An INVITE answered but not (yet) acknowledged gets no RTP and no RTCP, even at the
    signalling source's own address; the greeting starts with the ACK, from its start."""
    caller = await Caller.open(sip_target(gateway))
    media = await Counter.open("127.0.0.1")
    try:
        assert await caller.invite(offer("127.0.0.1", media.port)) == 200
        await asyncio.sleep(2.0)  # the demo greets at once on answer
        assert (len(media.rtp), len(media.rtcp)) == (0, 0)
        caller.ack()
        await media.wait_rtp(25, timeout=5)
        first = media.rtp[0]
        assert first[1] & 0x80, "the first packet starts a talkspurt (marker bit)"
        await hang_up(caller, 2)
    finally:
        caller.close()
        media.close()


async def test_an_sdp_naming_a_third_party_sends_it_nothing(gateway: GatewayProcess) -> None:
    """A trusted caller names the victim in ``c=``; a packet that claims to come from the
    victim (sent from a socket on its address, as a spoofer would) does not latch either.
    The caller still hears the call once its own RTP arrives (symmetric RTP)."""
    caller = await Caller.open(sip_target(gateway))
    victim = await Counter.open(VICTIM)
    own = await Counter.open("127.0.0.1")  # where the caller really is
    try:
        assert await caller.invite(offer(VICTIM, victim.port)) == 200
        caller.ack()
        victim.send_rtp(caller.media, count=3)  # "from the victim": must not latch
        await asyncio.sleep(2.0)
        assert (len(victim.rtp), len(victim.rtcp)) == (0, 0)
        own.send_rtp(caller.media, count=5)
        await own.wait_rtp(25, timeout=5)
        assert own.rtp_sources == {caller.media}
        assert (len(victim.rtp), len(victim.rtcp)) == (0, 0)
        await hang_up(caller, 2)
    finally:
        caller.close()
        victim.close()
        own.close()


async def test_a_reinvite_cannot_move_the_media_to_a_third_party(gateway: GatewayProcess) -> None:
    """The call is up at the caller's address; a re-INVITE naming the victim is answered
    (the media waits for the caller's RTP from an allowed address) and the victim gets
    nothing; the caller's RTP latches the call back to it."""
    caller = await Caller.open(sip_target(gateway))
    victim = await Counter.open(VICTIM)
    own = await Counter.open("127.0.0.1")
    try:
        assert await caller.invite(offer("127.0.0.1", own.port)) == 200
        caller.ack()
        await own.wait_rtp(5, timeout=5)
        assert await caller.reinvite(offer(VICTIM, victim.port), 2) == 200
        caller.ack(2)
        before = len(own.rtp)
        await asyncio.sleep(2.0)
        assert (len(victim.rtp), len(victim.rtcp)) == (0, 0)
        own.send_rtp(caller.media, count=5)
        await own.wait_rtp(before + 10, timeout=5)
        assert (len(victim.rtp), len(victim.rtcp)) == (0, 0)
        await hang_up(caller, 3)
    finally:
        caller.close()
        victim.close()
        own.close()


async def test_a_network_named_in_the_setting_carries_the_media(gateway: GatewayProcess) -> None:
    """``GATEWAY_SIP_MEDIA_NETWORKS`` names 127.0.0.10 for calls from 127.0.0.1: media goes
    there after the ACK, as the SDP says."""
    caller = await Caller.open(sip_target(gateway))
    server = await Counter.open(MEDIA_SERVER)
    try:
        assert await caller.invite(offer(MEDIA_SERVER, server.port)) == 200
        caller.ack()
        await server.wait_rtp(25, timeout=5)
        await hang_up(caller, 2)
    finally:
        caller.close()
        server.close()


async def test_an_address_that_never_answers_gets_a_bounded_amount(gateway: GatewayProcess) -> None:
    """Media at an allowed address from which nothing ever comes back: the call is put on
    hold at once (the RTP watchdog sleeps while on hold), so only the cap stops the RTCP
    reports. RTP_TIMEOUT_S of audio at most (250 packets) and one RTCP report in all."""
    caller = await Caller.open(sip_target(gateway))
    silent = await Counter.open(MEDIA_SERVER)
    try:
        assert await caller.invite(offer(MEDIA_SERVER, silent.port)) == 200
        caller.ack()
        await silent.wait_rtp(10, timeout=5)
        held = offer(MEDIA_SERVER, silent.port, extra="a=sendonly\r\n")
        assert await caller.reinvite(held, 2) == 200
        caller.ack(2)
        await asyncio.sleep(3 * 5 + 1)  # three RTCP intervals
        assert len(silent.rtp) <= RTP_TIMEOUT_S / PTIME_S
        assert len(silent.rtcp) <= 1, len(silent.rtcp)
        await hang_up(caller, 3)
    finally:
        caller.close()
        silent.close()


async def test_an_unanswered_address_is_hung_up_on_and_capped_whatever_reinvites_do(
    gateway: GatewayProcess,
) -> None:
    """Re-INVITEs that move the media between two allowed, silent ports do not renew what
    may go to them: at most RTP_TIMEOUT_S of RTP in all, then the RTP watchdog's BYE."""
    caller = await Caller.open(sip_target(gateway))
    sinks = [await Counter.open(MEDIA_SERVER), await Counter.open(MEDIA_SERVER)]
    try:
        assert await caller.invite(offer(MEDIA_SERVER, sinks[0].port)) == 200
        caller.ack()
        started = time.monotonic()
        cseq = 2
        while not caller.gateway_bye and time.monotonic() - started < 4 * RTP_TIMEOUT_S:
            await asyncio.sleep(1.0)
            if caller.gateway_bye:
                break
            status = await caller.reinvite(offer(MEDIA_SERVER, sinks[cseq % 2].port), cseq)
            if status == 200:
                caller.ack(cseq)
            cseq += 1
        assert caller.gateway_bye, "the RTP watchdog hangs up a call nobody answers"
        sent = sum(len(s.rtp) for s in sinks)
        assert 0 < sent <= RTP_TIMEOUT_S / PTIME_S, sent
    finally:
        caller.close()
        for sink in sinks:
            sink.close()


# --------------------------------------------------------------------------- item 5


def bindable(ports: range) -> bool:
    """Every port of ``ports`` is free on the gateway's RTP host."""
    held: list[socket.socket] = []
    try:
        for port in ports:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            held.append(sock)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                return False
        return True
    finally:
        for sock in held:
            sock.close()


@pytest.mark.parametrize(
    "sdp",
    [
        pytest.param(offer("::1", 30000, addrtype="IP6"), id="c=IP6"),
        pytest.param(offer("127.0.0.1", 30000, extra="a=rtcp:30001 IN IP6 ::1\r\n"), id="rtcp-IP6"),
    ],
)
async def test_an_address_family_the_rtp_sockets_cannot_reach_is_488_with_nothing_allocated(
    gateway: GatewayProcess, sdp: str
) -> None:
    await gone(gateway)
    refused = await metric(gateway, "gateway_sip_refused_total", reason="address_family")
    caller = await Caller.open(sip_target(gateway))
    try:
        assert await caller.invite(sdp) == 488
        caller.ack(for_error=True)
        assert (
            await metric(gateway, "gateway_sip_refused_total", reason="address_family")
            == refused + 1
        )
        assert await metric(gateway, "gateway_sip_calls_active") == 0
        await asyncio.sleep(0.5)  # a port the call took would be bound by now
        assert bindable(rtp_range(gateway)), "an RTP port was taken for a refused offer"
    finally:
        caller.close()


async def test_an_ipv6_reinvite_is_488_and_the_call_goes_on(gateway: GatewayProcess) -> None:
    caller = await Caller.open(sip_target(gateway))
    media = await Counter.open("127.0.0.1")
    try:
        assert await caller.invite(offer("127.0.0.1", media.port)) == 200
        caller.ack()
        media.send_rtp(caller.media, count=3)
        await media.wait_rtp(5, timeout=5)
        assert await caller.reinvite(offer("::1", media.port, addrtype="IP6"), 2) == 488
        caller.ack(2, for_error=True)
        before = len(media.rtp)
        media.send_rtp(caller.media, count=3)
        await media.wait_rtp(before + 10, timeout=5)  # the greeting goes on, to the caller
        await hang_up(caller, 3)
    finally:
        caller.close()
        media.close()
    log = gateway.log_text()
    assert "Traceback" not in log and "ValueError" not in log, gateway.log_tail()


async def test_a_dual_stack_bridge_takes_both_families(tmp_path: Path) -> None:
    """Listening on ``[::]``, the RTP sockets are IPv6 and reach IPv4 as mapped addresses:
    an IPv4 caller and an IPv6 caller both hear the greeting (under uvloop an IPv4
    address on an IPv6 socket raised ValueError in the pacer)."""
    port = free_udp_port()
    gw = GatewayProcess(
        tmp_path / "gateway.log",
        GATEWAY_SIP_LISTEN=f"[::]:{port}",
        GATEWAY_SIP_PUBLIC_ADDR="127.0.0.1",
        ENGINE_VAD="0",
    )
    gw.start()
    try:
        for local, target in (("127.0.0.1", "127.0.0.1"), ("::1", "::1")):
            caller = await Caller.open((target, port), local)
            media = await Counter.open(local)
            try:
                addrtype = "IP6" if ":" in local else "IP4"
                assert await caller.invite(offer(local, media.port, addrtype=addrtype)) == 200
                caller.ack()
                await media.wait_rtp(25, timeout=5)
                await hang_up(caller, 2)
            finally:
                caller.close()
                media.close()
        assert "Traceback" not in gw.log_text(), gw.log_tail()
    finally:
        gw.stop()
