"""RTP and RTCP sockets of SIP calls, from a port range (``GATEWAY_SIP_RTP_PORTS``).

Each call binds an even port for RTP and the odd port above it for RTCP (RFC 3550
section 11). What arrives is handed to the call's :class:`MediaSink`; the sockets do no
parsing. A port another process holds is skipped for now; a range with no bindable pair
left makes the call fail with 503 (the caller retries elsewhere).

Sending never raises: a destination the sockets cannot reach (another address family, a
host name, port 0) is dropped here, as is whatever the event loop's ``sendto`` raises
(uvloop raises ``ValueError`` for a family mismatch, which inside the pacer would end the
session). Which families the sockets reach (:func:`socket_families`) is known before a
call is taken: the bridge refuses an SDP naming another one with 488 and allocates
nothing. An IPv6 socket bound to ``::`` without ``IPV6_V6ONLY`` reaches IPv4 too, through
the IPv4-mapped form.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import ipaddress
import logging
import socket
from typing import Protocol

log = logging.getLogger(__name__)
Address = tuple[str, int]


def valid_destination(destination: Address) -> bool:
    """A port asyncio can send to: anything else raises inside ``sendto``, which asyncio
    treats as fatal and closes the socket (a remote must never be able to do that)."""
    return 0 < destination[1] < 65_536


def socket_families(sock: socket.socket | None) -> frozenset[int]:
    """The IP versions (4, 6) a UDP socket bound like ``sock`` can send to."""
    if sock is None:
        return frozenset()
    if sock.family == socket.AF_INET:
        return frozenset({4})
    if sock.family != socket.AF_INET6:
        return frozenset()
    try:
        bound = ipaddress.ip_address(str(sock.getsockname()[0]).split("%", 1)[0])
        v6only = bool(sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY))
    except (OSError, ValueError):
        return frozenset({6})
    return frozenset({4, 6}) if bound.is_unspecified and not v6only else frozenset({6})


def reachable(host: str, families: frozenset[int]) -> bool:
    """``host`` is an IP literal of a family in ``families``."""
    return _wire_host(host, families) is not None


def _wire_host(host: str, families: frozenset[int]) -> str | None:
    """How ``host`` is written to a socket of ``families``; None: it cannot be."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None  # a host name: never looked up
    if ip.version not in families or (isinstance(ip, ipaddress.IPv6Address) and ip.scope_id):
        return None  # a zone names one of our interfaces: not the peer's to choose
        return None
    if ip.version == 4 and 6 in families:
        return f"::ffff:{ip}"  # a dual-stack IPv6 socket sends IPv4 as mapped
    return str(ip)


class MediaSink(Protocol):
    def on_rtp(self, data: bytes, source: Address) -> None: ...
    def on_rtcp(self, data: bytes, source: Address) -> None: ...


class PortRangeExhausted(Exception):
    pass


class RtpPortPool:
    """Even ports of ``[low, high]`` whose odd neighbour is also in range, least recently
    used first (a port just released may still receive a late packet of its old call)."""

    def __init__(self, low: int, high: int) -> None:
        first = low + (low % 2)
        self._free: collections.deque[int] = collections.deque(range(first, high, 2))
        self.capacity = len(self._free)
        self._used: set[int] = set()

    def acquire(self) -> int:
        if not self._free:
            raise PortRangeExhausted("no free RTP port")
        port = self._free.popleft()
        self._used.add(port)
        return port

    def release(self, port: int) -> None:
        if port in self._used:
            self._used.remove(port)
            self._free.append(port)

    @property
    def in_use(self) -> int:
        return len(self._used)


class _Socket(asyncio.DatagramProtocol):
    def __init__(self, sink: MediaSink, *, rtcp: bool) -> None:
        self.sink = sink
        self._rtcp = rtcp

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        source = (str(addr[0]), int(addr[1]))
        try:
            if self._rtcp:
                self.sink.on_rtcp(data, source)
            else:
                self.sink.on_rtp(data, source)
        except Exception:  # one bad packet must never stop the socket
            log.exception("rtp: packet handling failed")

    def error_received(self, exc: Exception) -> None:
        log.debug("rtp: socket error %r", exc)  # ICMP port unreachable from a gone peer


class MediaPorts:
    """The RTP and RTCP sockets of one call."""

    def __init__(
        self,
        port: int,
        rtp: tuple[asyncio.DatagramTransport, _Socket],
        rtcp: tuple[asyncio.DatagramTransport, _Socket],
    ) -> None:
        self.port = port
        self._rtp, self._rtp_socket = rtp
        self._rtcp, self._rtcp_socket = rtcp
        self.families = socket_families(self._rtp.get_extra_info("socket"))

    def attach(self, sink: MediaSink) -> None:
        """Deliver what arrives from now on to ``sink``."""
        self._rtp_socket.sink = sink
        self._rtcp_socket.sink = sink

    def send_rtp(self, data: bytes, destination: Address) -> bool:
        """Send one RTP packet; False (nothing sent) when ``destination`` cannot be."""
        return self._send(self._rtp, data, destination)

    def send_rtcp(self, data: bytes, destination: Address) -> bool:
        return self._send(self._rtcp, data, destination)

    def _send(self, transport: asyncio.DatagramTransport, data: bytes, to: Address) -> bool:
        host = _wire_host(to[0], self.families)
        if host is None or not valid_destination(to):
            return False
        try:
            transport.sendto(data, (host, to[1]))
        except (OSError, ValueError) as exc:  # never into the pacer
            log.debug("rtp: cannot send to %s: %r", host, exc)
            return False
        return True

    def close(self) -> None:
        self._rtp.close()
        self._rtcp.close()


def _bind_errno(exc: OSError) -> int | None:
    """The system's error of a failed bind: uvloop (the gateway's loop) raises an OSError
    of its own without an errno, the system's as its cause (a port held elsewhere then
    refused every call given it, with 503: seen in a clean clone's `make test`)."""
    cause = exc.__cause__
    if exc.errno is None and isinstance(cause, OSError):
        return cause.errno
    return exc.errno


async def open_media(pool: RtpPortPool, host: str, sink: MediaSink) -> MediaPorts:
    """Bind an RTP/RTCP pair from ``pool`` for ``sink``; a pair another process holds is
    skipped (it goes to the back of the pool). Raises :class:`PortRangeExhausted` when no
    pair can be bound (every one held, or the process is out of file descriptors)."""
    loop = asyncio.get_running_loop()
    for _ in range(pool.capacity):
        port = pool.acquire()
        rtp: asyncio.DatagramTransport | None = None
        try:
            rtp, rtp_socket = await loop.create_datagram_endpoint(
                lambda: _Socket(sink, rtcp=False), local_addr=(host, port)
            )
            rtcp, rtcp_socket = await loop.create_datagram_endpoint(
                lambda: _Socket(sink, rtcp=True), local_addr=(host, port + 1)
            )
        except OSError as exc:
            if rtp is not None:
                rtp.close()
            pool.release(port)  # to the back of the queue: tried again later
            if _bind_errno(exc) not in (errno.EADDRINUSE, errno.EACCES):  # no descriptors...
                raise PortRangeExhausted(f"cannot bind RTP sockets: {exc}") from None
            log.warning("rtp: port %d or %d held elsewhere; skipped", port, port + 1)
            continue
        except BaseException:
            if rtp is not None:
                rtp.close()
            pool.release(port)
            raise
        return MediaPorts(port, (rtp, rtp_socket), (rtcp, rtcp_socket))
    raise PortRangeExhausted("no bindable RTP port pair in GATEWAY_SIP_RTP_PORTS")
