"""Issue 29 against a running gateway's SIP bridge, over real UDP sockets on loopback:
responses go only where the request really came from, and packets forged in a trunk's
name cannot lock the trunk out.

The gateway trusts ``127.0.0.1`` only (``GATEWAY_SIP_ALLOW``); ``127.0.0.5`` is outside,
where the ``acme`` trunk calls from with digest credentials. The "victim" is a socket on
``127.0.0.9``, an address the requests name but never send from: it must receive nothing.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Iterator
from typing import cast

import pytest

from gateway.legs.sip.routes import DEFAULT_ROUTES
from telephony.sip.digest import DigestAlgorithm, digest_response
from tests.integration.harness import GatewayProcess, free_udp_port, metric

pytestmark = pytest.mark.slow

CALLER = "127.0.0.1"  # trusted
TRUNK_HOST = "127.0.0.5"  # outside the trusted networks: a trunk, or anyone
VICTIM = "127.0.0.9"  # named in requests, never their source
PASSWORD = "correct horse"
TRUNK_ROUTES = """
[trunks.carrier]
username = "acme"
password_env = "ACME_TRUNK_PASSWORD"
tenant = "acme"
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    tmp = tmp_path_factory.mktemp("sip-trust")
    routes = tmp / "routes.toml"
    routes.write_text(DEFAULT_ROUTES + TRUNK_ROUTES)
    gw = GatewayProcess(
        tmp / "gateway.log",
        GATEWAY_SIP_LISTEN=f"127.0.0.1:{free_udp_port()}",
        GATEWAY_SIP_ALLOW="127.0.0.1/32=local",
        GATEWAY_SIP_ROUTES=str(routes),
        ACME_TRUNK_PASSWORD=PASSWORD,
        ENGINE_VAD="0",
    )
    gw.start()
    yield gw
    gw.stop()


def sip_target(gw: GatewayProcess) -> tuple[str, int]:
    host, port = gw.env["GATEWAY_SIP_LISTEN"].rsplit(":", 1)
    return host, int(port)


class Socket(asyncio.DatagramProtocol):
    """A UDP socket on loopback that keeps what it receives."""

    def __init__(self) -> None:
        self.received: list[tuple[bytes, tuple[str, int]]] = []
        self.transport: asyncio.DatagramTransport | None = None
        self.arrived = asyncio.Event()

    @classmethod
    async def bind(cls, host: str, port: int = 0) -> Socket:
        loop = asyncio.get_running_loop()
        _, protocol = await loop.create_datagram_endpoint(cls, local_addr=(host, port))
        return protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self.received.append((data, (str(addr[0]), int(addr[1]))))
        self.arrived.set()

    @property
    def port(self) -> int:
        assert self.transport is not None
        return int(self.transport.get_extra_info("sockname")[1])

    def send(self, data: bytes, target: tuple[str, int]) -> None:
        assert self.transport is not None
        self.transport.sendto(data, target)

    def statuses(self) -> list[int]:
        return [int(data[8:11]) for data, _ in self.received if data.startswith(b"SIP/2.0 ")]

    async def wait_for(self, status: int, timeout: float = 5.0) -> bytes:
        async with asyncio.timeout(timeout):
            while True:
                for data, _ in self.received:
                    if data.startswith(f"SIP/2.0 {status} ".encode()):
                        return data
                self.arrived.clear()
                await self.arrived.wait()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def sip_request(
    method: str,
    *,
    via: str,
    user: str = "nobody",
    call_id: str | None = None,
    cseq: int = 1,
    authorization: str | None = None,
    to_tag: str | None = None,
) -> bytes:
    lines = [
        f"{method} sip:{user}@127.0.0.1 SIP/2.0",
        f"Via: {via};branch=z9hG4bK{uuid.uuid4().hex[:12]}",
        "Max-Forwards: 70",
        f"To: <sip:{user}@127.0.0.1>" + (f";tag={to_tag}" if to_tag else ""),
        "From: <sip:probe@example.net>;tag=f1",
        f"Call-ID: {call_id or uuid.uuid4().hex}",
        f"CSeq: {cseq} {method}",
        "Contact: <sip:probe@127.0.0.1>",
    ]
    if authorization is not None:
        lines.append(f"Authorization: {authorization}")
    return ("\r\n".join([*lines, "Content-Length: 0", "", ""])).encode()


async def test_responses_and_retransmissions_never_reach_a_named_address(
    gateway: GatewayProcess,
) -> None:
    """The found amplification: from a trusted source, a Via whose sent-by is the source
    and whose own ``received`` names a victim had every response (a 404 is resent until
    its ACK, which never comes) sent to the victim. Now they all go to the source."""
    target = sip_target(gateway)
    caller = await Socket.bind(CALLER)
    port = caller.port  # the victim listens on the same port number: the sent-by port
    victim = await Socket.bind(VICTIM, port)
    vias = [
        f"SIP/2.0/UDP {CALLER}:{port};received={VICTIM}",  # the found case
        f"SIP/2.0/UDP {CALLER}:{port};rport={port};received={VICTIM}",
        f"SIP/2.0/UDP {CALLER}:{port};maddr={VICTIM};ttl=1",
        f"SIP/2.0/UDP {VICTIM}:{port}",
    ]
    try:
        for n in range(20):
            via = vias[n % len(vias)]
            caller.send(sip_request("INVITE", via=via), target)  # no such user: 404
            caller.send(sip_request("OPTIONS", via=via), target)
        await asyncio.sleep(4.0)  # timer G: the 404s are resent at 0.5, 1.5 and 3.5 s
        to_victim = sum(len(data) for data, _ in victim.received)
        assert victim.received == [], f"{len(victim.received)} datagrams, {to_victim} bytes"
        statuses = caller.statuses()
        assert statuses.count(404) >= 20 * 3, statuses  # with their retransmissions
        assert statuses.count(200) == 20
        assert all(source == target for _, source in caller.received)
    finally:
        caller.close()
        victim.close()


async def test_a_stateless_refusal_goes_to_the_packet_source_only(
    gateway: GatewayProcess,
) -> None:
    """From outside the trusted networks (no credentials): a 401 challenge or a 403,
    stateless, to the packet's source address and port, whatever the Via names."""
    target = sip_target(gateway)
    outsider = await Socket.bind(TRUNK_HOST)
    named_port = free_udp_port()
    victim = await Socket.bind(VICTIM, named_port)
    sent_by = await Socket.bind(TRUNK_HOST, named_port)  # the source's IP, another port
    vias = [
        f"SIP/2.0/UDP {TRUNK_HOST}:{named_port};received={VICTIM}",
        f"SIP/2.0/UDP {TRUNK_HOST}:{named_port};rport={named_port};received={VICTIM}",
        f"SIP/2.0/UDP {VICTIM}:{named_port};maddr={VICTIM}",
    ]
    try:
        for via in vias:
            outsider.send(sip_request("INVITE", via=via), target)  # challenged: 401
            outsider.send(sip_request("BYE", via=via, to_tag="x"), target)  # 403
        await asyncio.sleep(1.5)
        assert sorted(outsider.statuses()) == [401] * 3 + [403] * 3
        assert victim.received == [] and sent_by.received == []
    finally:
        for sock in (outsider, victim, sent_by):
            sock.close()


def forged_authorizations() -> list[str]:
    """What someone who does not receive the trunk's 401s can send in its name."""
    zeros = "0" * 32
    return [
        # the found cases: a wrong realm, a malformed Authorization
        f'Digest username="acme", realm="evil", nonce="x", uri="sip:nobody@127.0.0.1", '
        f'response="{zeros}", algorithm=MD5',
        "Digest nonsense",
        # a nonce made up in the gateway's format
        f'Digest username="acme", realm="voice-gateway", nonce="{"A" * 54}", '
        f'uri="sip:nobody@127.0.0.1", response="{zeros}", algorithm=MD5',
    ]


def answer_challenge(challenge: bytes, *, uri: str) -> str:
    """A UAC's Authorization for the MD5 challenge of a 401."""
    text = challenge.decode()
    match = re.search(r'WWW-Authenticate: Digest realm="([^"]+)", nonce="([^"]+)", '
                      r"algorithm=MD5", text)  # fmt: skip
    assert match is not None, text
    realm, nonce = match.groups()
    response = digest_response(
        algorithm=DigestAlgorithm.MD5,
        username="acme",
        realm=realm,
        password=PASSWORD,
        method="INVITE",
        uri=uri,
        nonce=nonce,
        qop="auth",
        cnonce="c0ffee",
        nc="00000001",
    )
    return (
        f'Digest username="acme", realm="{realm}", nonce="{nonce}", uri="{uri}", '
        f'response="{response}", algorithm=MD5, qop=auth, cnonce="c0ffee", nc=00000001'
    )


async def test_five_forged_invites_do_not_lock_the_trunk_out(gateway: GatewayProcess) -> None:
    """The found lockout: five INVITEs from the trunk's address with a wrong realm or a
    malformed Authorization kept the real trunk out (403) for a minute. Now the real
    trunk's digest still gets its call through (here to a user with no route: 404)."""
    target = sip_target(gateway)
    forger = await Socket.bind(TRUNK_HOST)
    refused_before = await metric(gateway, "gateway_sip_refused_total", reason="bad_credentials")
    try:
        forged = forged_authorizations()
        for n in range(3 * len(forged)):  # 9 > MAX_FAILURES
            via = f"SIP/2.0/UDP {TRUNK_HOST}:{forger.port};rport"
            data = sip_request("INVITE", via=via, authorization=forged[n % len(forged)])
            forger.send(data, target)
        await asyncio.sleep(1.0)

        trunk = await Socket.bind(TRUNK_HOST)
        try:
            via = f"SIP/2.0/UDP {TRUNK_HOST}:{trunk.port};rport"
            call_id = uuid.uuid4().hex
            trunk.send(sip_request("INVITE", via=via, call_id=call_id), target)
            challenge = await trunk.wait_for(401)
            authorization = answer_challenge(challenge, uri="sip:nobody@127.0.0.1")
            again = sip_request(
                "INVITE", via=via, call_id=call_id, cseq=2, authorization=authorization
            )
            trunk.send(again, target)
            await trunk.wait_for(404)  # in: refused by the routes, not by the trunk gate
            assert 403 not in trunk.statuses()
        finally:
            trunk.close()
        # the forgeries: a 400 for the malformed ones, asked again (401) for the rest
        assert sorted(forger.statuses()) == [400] * 3 + [401] * 6, forger.statuses()
        refused = await metric(gateway, "gateway_sip_refused_total", reason="bad_credentials")
        assert refused - refused_before == 3  # the three 400s
    finally:
        forger.close()
