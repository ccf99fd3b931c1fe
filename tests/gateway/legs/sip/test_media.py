"""RTP ports: even/odd pairs from the range, least recently used first, and a port that
another process holds is skipped."""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import Callable

import pytest

from gateway.legs.sip.media import PortRangeExhausted, RtpPortPool, open_media


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
