"""RTP ports: even/odd pairs from the range, least recently used first, and a port that
another process holds is skipped."""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import random
import socket
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.legs.sip.config import media_allowed, parse_media_networks
from gateway.legs.sip.media import (
    PortRangeExhausted,
    RtpPortPool,
    _wire_host,
    open_media,
    reachable,
    socket_families,
)
from telephony.sdp import SdpError, negotiate, parse_sdp
from tests.telephony.fuzzing import FUZZ, sdp_addresses


class Sink:
    def __init__(self) -> None:
        self.rtp: list[bytes] = []
        self.rtcp: list[bytes] = []

    def on_rtp(self, data: bytes, source: tuple[str, int]) -> None:
        self.rtp.append(data)

    def on_rtcp(self, data: bytes, source: tuple[str, int]) -> None:
        self.rtcp.append(data)


def test_even_ports_whose_odd_neighbour_is_in_range() -> None:
    pool = RtpPortPool(20001, 20008)
    assert pool.capacity == 3  # 20002, 20004, 20006 (20008 has no 20009)
    ports = [pool.acquire() for _ in range(3)]
    assert ports == [20002, 20004, 20006]
    with pytest.raises(PortRangeExhausted):
        pool.acquire()
    pool.release(20004)
    pool.release(20004)  # twice: once counts
    assert pool.in_use == 2
    assert pool.acquire() == 20004


def test_released_ports_go_to_the_back() -> None:
    pool = RtpPortPool(30000, 30007)
    first = pool.acquire()
    pool.release(first)
    assert pool.acquire() != first


def hold_a_port() -> tuple[socket.socket, int]:
    """A UDP socket on an even port (the one a pool starting there would hand out)."""
    for _ in range(100):
        held = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        port = random.randrange(41000, 49000, 2)
        try:
            held.bind(("127.0.0.1", port))
        except OSError:
            held.close()
            continue
        return held, port
    raise RuntimeError("no free port")


async def eventually(condition: Callable[[], bool]) -> None:
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not in time")


async def test_open_media_skips_a_port_held_elsewhere_and_delivers_to_the_sink() -> None:
    held, base = hold_a_port()
    try:
        pool = RtpPortPool(base, base + 9)
        sink = Sink()
        media = await open_media(pool, "127.0.0.1", sink)
        assert media.port == base + 2
        client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        client.sendto(b"rtp", ("127.0.0.1", media.port))
        client.sendto(b"rtcp", ("127.0.0.1", media.port + 1))
        await eventually(lambda: bool(sink.rtp and sink.rtcp))
        assert sink.rtp == [b"rtp"] and sink.rtcp == [b"rtcp"]
        other = Sink()
        media.attach(other)
        client.sendto(b"again", ("127.0.0.1", media.port))
        await eventually(lambda: bool(other.rtp))
        assert other.rtp == [b"again"]
        client.close()
        media.close()
    finally:
        held.close()


def test_under_uvloop_too_a_port_held_elsewhere_is_skipped() -> None:
    """uvloop, the gateway's loop, raises a failed bind as an OSError without an errno
    (the system's error is its cause): the port is skipped all the same, not taken for
    a process out of descriptors (every call given that port was refused with 503)."""
    uvloop = pytest.importorskip("uvloop")
    held, base = hold_a_port()

    async def bound_port() -> int:
        media = await open_media(RtpPortPool(base, base + 9), "127.0.0.1", Sink())
        media.close()
        return media.port

    try:
        assert uvloop.run(bound_port()) == base + 2
    finally:
        held.close()


# --------------------------------------------------------------------------- address families


@pytest.mark.parametrize(
    ("bound", "families"),
    [("127.0.0.1", {4}), ("0.0.0.0", {4}), ("::1", {6}), ("::", {4, 6})],
)
def test_socket_families(bound: str, families: set[int]) -> None:
    family = socket.AF_INET6 if ":" in bound else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((bound, 0))
        assert socket_families(sock) == families
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as v6only:
        v6only.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        v6only.bind(("::", 0))
        assert socket_families(v6only) == {6}
    assert socket_families(None) == set()


@pytest.mark.parametrize(
    ("host", "families", "ok"),
    [
        ("127.0.0.1", {4}, True),
        ("::1", {4}, False),
        ("127.0.0.1", {6}, False),
        ("127.0.0.1", {4, 6}, True),
        ("::1", {4, 6}, True),
        ("localhost", {4, 6}, False),
        ("fe80::1%eth0", {6}, False),
        ("", {4}, False),
    ],
)
def test_reachable(host: str, families: set[int], ok: bool) -> None:
    assert reachable(host, frozenset(families)) is ok


@pytest.mark.parametrize("loop_name", ["asyncio", "uvloop"])
def test_sending_never_raises_whatever_the_destination(loop_name: str) -> None:
    """uvloop raises ValueError for a family mismatch or a name; a port out of range
    raises too: the pacer must never see it. What can be sent arrives, an IPv4 peer of a
    dual-stack socket included."""

    async def main() -> None:
        for host, unreachable in (("127.0.0.1", ["::1"]), ("::", [])):
            media = await open_media(RtpPortPool(*free_pair_range()), host, Sink())
            received = Sink()
            peer = await open_media(RtpPortPool(*free_pair_range()), "127.0.0.1", received)
            bad = ["localhost", "host.invalid", "", "fe80::1%lo", *unreachable]
            try:
                for destination in [*((h, 9) for h in bad), ("127.0.0.1", 0), ("::1", 70000)]:
                    assert media.send_rtp(b"x", destination) is False, (host, destination)
                    assert media.send_rtcp(b"x", destination) is False, (host, destination)
                assert media.send_rtp(b"to-v4", ("127.0.0.1", peer.port))
                await eventually(functools.partial(got_only, received, b"to-v4"))
            finally:
                media.close()
                peer.close()

    if loop_name == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        uvloop.run(main())
    else:
        asyncio.run(main())


def got_only(sink: Sink, data: bytes) -> bool:
    return sink.rtp == [data]


def free_pair_range() -> tuple[int, int]:
    held, port = hold_a_port()
    held.close()
    return port, port + 1


RULES = parse_media_networks("127.0.0.1/32=127.0.0.10/32,2001:db8::/32")


@FUZZ
@given(
    c=sdp_addresses(),
    rtcp=st.none() | sdp_addresses(),
    families=st.sampled_from([frozenset({4}), frozenset({6}), frozenset({4, 6})]),
    source=st.sampled_from(["127.0.0.1", "::ffff:127.0.0.1", "::1", "2001:db8::5"]),
)
def test_fuzz_what_an_offer_can_make_the_media_sockets_do(
    c: tuple[str, str],
    rtcp: tuple[str, str] | None,
    families: frozenset[int],
    source: str,
) -> None:
    """For an offer of any address family: the bridge's offer-time check (``reachable``)
    holds exactly when the sockets can be given the address (a literal of their family,
    mapped for a dual-stack socket, as ``inet_pton`` takes it), and the media rule never
    raises and never allows a host name or another address than the source's unless a
    rule names it."""
    lines = ["v=0", "o=- 1 1 IN IP4 192.0.2.1", "s=-", f"c=IN {c[0]} {c[1]}", "t=0 0"]
    lines += ["m=audio 4000 RTP/AVP 0"]
    if rtcp is not None:
        lines.append(f"a=rtcp:4001 IN {rtcp[0]} {rtcp[1]}")
    try:
        got = negotiate(parse_sdp("\r\n".join(lines) + "\r\n"))
    except SdpError:
        return
    for destination in (got.remote_rtp, got.remote_rtcp):
        if destination is None:
            continue
        host = destination[0]
        wire = _wire_host(host, families)
        assert reachable(host, families) is (wire is not None)
        if wire is not None:
            socket.inet_pton(socket.AF_INET6 if 6 in families else socket.AF_INET, wire)
        assert media_allowed(RULES, source, host) is expected_allowed(source, host)


def expected_allowed(source: str, host: str) -> bool:
    """The rule, written out for RULES: the same address (mapped or not), 127.0.0.10 for
    127.0.0.1, anything in 2001:db8::/32 for a source there."""

    def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
        try:
            address = ipaddress.ip_address(text.split("%")[0])
        except ValueError:
            return None
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
            return address.ipv4_mapped
        return address

    s, h = ip(source), ip(host)
    if s is None or h is None:
        return False
    doc = ipaddress.ip_network("2001:db8::/32")
    return (
        h == s
        or (s == ipaddress.ip_address("127.0.0.1") and h == ipaddress.ip_address("127.0.0.10"))
        or (s in doc and h in doc)
    )
