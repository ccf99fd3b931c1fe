"""A minimal SIP user agent client for the load generator: one call per instance.

It does what a PBX or a trunk does on the simplest IVR call and no more: INVITE with an
SDP offer (PCMU, telephone-event), retransmitted on RFC 3261's timer A until a response;
ACK for the final response; a 200 to the gateway's BYE; BYE to end the call. RTP arrives
on its own socket and is handed to the caller with the arrival time; RFC 3550 A.8
interarrival jitter and sequence-number loss are computed here, per call.

It is deliberately independent of the gateway's ``telephony/sip`` (plain strings and a
few regular expressions): the load generator must not share a bug with what it measures.
"""

from __future__ import annotations

import asyncio
import random
import re
import struct
import time
import uuid
from collections.abc import Callable
from typing import cast

T1 = 0.5
_STATUS = re.compile(rb"^SIP/2\.0 (\d{3})")
_HEADER = re.compile(rb"^([A-Za-z-]+)\s*:\s*(.*)$", re.MULTILINE)
_RTP = struct.Struct("!BBHII")


class SipCallFailed(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


def _headers(data: bytes) -> dict[str, bytes]:
    head = data.split(b"\r\n\r\n", 1)[0]
    found: dict[str, bytes] = {}
    for name, value in _HEADER.findall(head):
        key = name.decode().lower()
        key = {"i": "call-id", "f": "from", "t": "to", "v": "via"}.get(key, key)
        found.setdefault(key, value.strip())
    return found


class RtpStats:
    """RFC 3550 A.8 interarrival jitter and A.3-style loss of one inbound stream."""

    def __init__(self, clock_rate: int = 8000) -> None:
        self.rate = clock_rate
        self.packets = 0
        self.jitter = 0.0  # in timestamp units
        self._transit: float | None = None
        self._first_seq: int | None = None
        self._max_seq = 0
        self._cycles = 0

    def packet(self, arrival: float, sequence: int, timestamp: int) -> None:
        self.packets += 1
        transit = arrival * self.rate - timestamp
        if self._transit is not None:
            d = abs(transit - self._transit)
            if d < self.rate:  # a talkspurt's timestamp jump is not jitter
                self.jitter += (d - self.jitter) / 16
        self._transit = transit
        if self._first_seq is None:
            self._first_seq = self._max_seq = sequence
            return
        delta = (sequence - self._max_seq) & 0xFFFF
        if 0 < delta < 0x8000:
            if sequence < self._max_seq:
                self._cycles += 1
            self._max_seq = sequence

    @property
    def lost(self) -> int:
        if self._first_seq is None:
            return 0
        expected = self._cycles * 0x10000 + self._max_seq - self._first_seq + 1
        return max(0, expected - self.packets)

    @property
    def jitter_ms(self) -> float:
        return self.jitter / self.rate * 1000


class _Endpoint(asyncio.DatagramProtocol):
    def __init__(self, handler: Callable[[bytes, tuple[str, int]], None]) -> None:
        self._handler = handler
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self._handler(data, (str(addr[0]), int(addr[1])))


class SipUac:
    """One outbound call to ``sip:{user}@{target}``."""

    def __init__(
        self,
        target: tuple[str, int],
        user: str,
        on_audio: Callable[[float, bytes], None],
        on_ended: Callable[[str], None],
    ) -> None:
        self.target = target
        self.user = user
        self.call_id = f"{uuid.uuid4().hex}@127.0.0.1"
        self.stats = RtpStats()
        self.setup_s: float | None = None
        self._on_audio = on_audio
        self._on_ended = on_ended
        self._tag = uuid.uuid4().hex[:10]
        self._to_tag = b""
        self._cseq = 1
        self._sip: _Endpoint | None = None
        self._rtp: _Endpoint | None = None
        self._final: asyncio.Future[int] | None = None
        self._bye_done: asyncio.Future[int] | None = None
        self._remote_rtp: tuple[str, int] | None = None
        self._seq = random.getrandbits(16)
        self._ts = random.getrandbits(32)
        self._ssrc = random.getrandbits(32)
        self._ended = False
        self._branch = ""

    # --- set-up and tear-down -------------------------------------------------------------

    async def invite(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        sip_transport, self._sip = await loop.create_datagram_endpoint(
            lambda: _Endpoint(self._on_sip), local_addr=("127.0.0.1", 0)
        )
        _rtp_transport, self._rtp = await loop.create_datagram_endpoint(
            lambda: _Endpoint(self._on_rtp), local_addr=("127.0.0.1", 0)
        )
        self._final = loop.create_future()
        started = time.monotonic()
        self._branch = f"z9hG4bK{uuid.uuid4().hex[:12]}"
        request = self._request("INVITE", self._offer())
        deadline = started + timeout
        interval = T1
        while not self._final.done():
            sip_transport.sendto(request, self.target)
            wait = min(interval, deadline - time.monotonic())
            if wait <= 0:
                raise SipCallFailed("client:invite_timeout")
            await asyncio.wait([self._final], timeout=wait)
            interval = min(interval * 2, 4.0)
        status = self._final.result()
        if status != 200:
            raise SipCallFailed(f"sip_{status}")
        self.setup_s = time.monotonic() - started

    async def bye(self) -> None:
        if self._ended or self._sip is None or self._sip.transport is None:
            self.close()
            return
        self._ended = True
        loop = asyncio.get_running_loop()
        self._bye_done = loop.create_future()
        self._cseq += 1
        self._branch = f"z9hG4bK{uuid.uuid4().hex[:12]}"
        request = self._request("BYE")
        for _ in range(4):
            self._sip.transport.sendto(request, self.target)
            await asyncio.wait([self._bye_done], timeout=T1)
            if self._bye_done.done():
                break
        self.close()

    def close(self) -> None:
        for endpoint in (self._sip, self._rtp):
            if endpoint is not None and endpoint.transport is not None:
                endpoint.transport.close()

    # --- media ----------------------------------------------------------------------------

    def send_audio(self, payload: bytes) -> None:
        rtp = self._rtp
        if rtp is None or rtp.transport is None or self._remote_rtp is None or self._ended:
            return
        header = _RTP.pack(0x80, 0, self._seq, self._ts, self._ssrc)
        rtp.transport.sendto(header + payload, self._remote_rtp)
        self._seq = (self._seq + 1) & 0xFFFF
        self._ts = (self._ts + 160) & 0xFFFFFFFF

    def _on_rtp(self, data: bytes, source: tuple[str, int]) -> None:
        now = time.monotonic()
        if len(data) < 12:
            return
        _b0, b1, seq, ts, _ssrc = _RTP.unpack_from(data)
        if b1 & 0x7F != 0:
            return
        self.stats.packet(now, seq, ts)
        self._on_audio(now, data[12:])

    # --- signalling -----------------------------------------------------------------------

    def _offer(self) -> bytes:
        assert self._rtp is not None and self._rtp.transport is not None
        port = self._rtp.transport.get_extra_info("sockname")[1]
        return (
            "v=0\r\no=loadgen 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
            f"m=audio {port} RTP/AVP 0 101\r\na=rtpmap:0 PCMU/8000\r\n"
            "a=rtpmap:101 telephone-event/8000\r\na=fmtp:101 0-15\r\na=ptime:20\r\n"
            "a=sendrecv\r\n"
        ).encode()

    def _request(self, method: str, body: bytes = b"") -> bytes:
        assert self._sip is not None and self._sip.transport is not None
        local_port = self._sip.transport.get_extra_info("sockname")[1]
        host, port = self.target
        to_tag = b";tag=" + self._to_tag if self._to_tag else b""
        lines = [
            f"{method} sip:{self.user}@{host}:{port} SIP/2.0",
            f"Via: SIP/2.0/UDP 127.0.0.1:{local_port};branch={self._branch};rport",
            f"From: <sip:loadgen@127.0.0.1>;tag={self._tag}",
            f"To: <sip:{self.user}@{host}:{port}>{to_tag.decode()}",
            f"Call-ID: {self.call_id}",
            f"CSeq: {self._cseq if method != 'ACK' else 1} {method}",
            f"Contact: <sip:loadgen@127.0.0.1:{local_port}>",
            "Max-Forwards: 70",
        ]
        if body:
            lines.append("Content-Type: application/sdp")
        lines.append(f"Content-Length: {len(body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + body

    def _on_sip(self, data: bytes, source: tuple[str, int]) -> None:
        status = _STATUS.match(data)
        headers = _headers(data)
        if status is not None:
            code = int(status.group(1))
            method = headers.get("cseq", b"").split(b" ")[-1]
            if method == b"INVITE" and code >= 200:
                to = headers.get("to", b"")
                if b";tag=" in to:
                    self._to_tag = to.split(b";tag=", 1)[1].split(b";")[0]
                if code == 200:
                    self._remote_rtp = self._answer_address(data, source)
                if code == 200:  # a 2xx's ACK is a new transaction; a non-2xx's is not
                    self._branch = f"z9hG4bK{uuid.uuid4().hex[:12]}"
                assert self._sip is not None and self._sip.transport is not None
                self._sip.transport.sendto(self._request("ACK"), self.target)
                if self._final is not None and not self._final.done():
                    self._final.set_result(code)
            elif method == b"BYE" and self._bye_done is not None and not self._bye_done.done():
                self._bye_done.set_result(code)
            return
        if data.startswith(b"BYE "):
            self._reply_ok(data, headers, source)
            if not self._ended:
                self._ended = True
                self._on_ended("client:remote_bye")
        elif data.startswith((b"OPTIONS ", b"NOTIFY ")):
            self._reply_ok(data, headers, source)

    def _reply_ok(self, data: bytes, headers: dict[str, bytes], source: tuple[str, int]) -> None:
        head = data.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]
        keep = [
            line
            for line in head
            if line.split(b":", 1)[0].strip().lower()
            in (b"via", b"v", b"from", b"f", b"to", b"t", b"call-id", b"i", b"cseq")
        ]
        response = b"\r\n".join([b"SIP/2.0 200 OK", *keep, b"Content-Length: 0", b"", b""])
        assert self._sip is not None and self._sip.transport is not None
        self._sip.transport.sendto(response, source)

    def _answer_address(self, data: bytes, source: tuple[str, int]) -> tuple[str, int] | None:
        body = data.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in data else b""
        address = re.search(rb"^c=IN IP[46] (\S+)", body, re.MULTILINE)
        port = re.search(rb"^m=audio (\d+)", body, re.MULTILINE)
        if address is None or port is None:
            return None
        return address.group(1).decode(), int(port.group(1))
