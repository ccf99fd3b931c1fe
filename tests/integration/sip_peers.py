"""SIP peers for the bridge's tests: sipp (Debian's ``sip-tester``) for the signalling,
and an RTP endpoint of our own that records what the gateway sends and plays caller
audio and RFC 4733 digits from the same port (so symmetric RTP keeps our stream here).

The RTP endpoint parses and builds headers itself (RFC 3550 section 5.1, RFC 4733
section 2.3) rather than with the gateway's ``telephony/rtp.py``: the tests check the
gateway's packets against an independent reading of the RFCs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import shutil
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import numpy.typing as npt

from telephony.codecs.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode

HEADER = struct.Struct("!BBHII")
DTMF_EVENTS = {d: i for i, d in enumerate("0123456789*#ABCD")}
CODECS = {"PCMU": 0, "PCMA": 8}
DTMF_PT = 101


def have_sipp() -> bool:
    return shutil.which("sipp") is not None


@dataclass(frozen=True)
class Received:
    at: float
    payload_type: int
    marker: bool
    sequence: int
    timestamp: int
    ssrc: int
    payload: bytes


class RtpPeer(asyncio.DatagramProtocol):
    """The caller's media: records RTP and RTCP from the gateway, sends audio and digits."""

    def __init__(self, codec: str = "PCMU") -> None:
        self.codec = codec
        self.payload_type = CODECS[codec]
        self.received: list[Received] = []
        self.rtcp: list[bytes] = []
        self.sources: set[tuple[str, int]] = set()
        self.transport: asyncio.DatagramTransport | None = None
        self._rtcp_transport: asyncio.DatagramTransport | None = None
        self.remote: tuple[str, int] | None = None  # where the gateway sends from
        self._seq = random.getrandbits(16)
        self._ts = random.getrandbits(32)
        self._ssrc = random.getrandbits(32)
        self.port = 0

    @classmethod
    async def open(cls, codec: str = "PCMU") -> RtpPeer:
        loop = asyncio.get_running_loop()
        for _ in range(50):
            peer = cls(codec)
            port = random.randrange(30000, 39998, 2)
            try:
                await loop.create_datagram_endpoint(
                    functools.partial(_same, peer), local_addr=("127.0.0.1", port)
                )
            except OSError:
                continue
            try:
                rtcp, _ = await loop.create_datagram_endpoint(
                    functools.partial(_RtcpSink, peer), local_addr=("127.0.0.1", port + 1)
                )
            except OSError:
                assert peer.transport is not None
                peer.transport.close()
                continue
            peer._rtcp_transport = rtcp
            peer.port = port
            return peer
        raise RuntimeError("no free RTP port pair")

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        source = (str(addr[0]), int(addr[1]))
        self.sources.add(source)
        self.remote = source
        if len(data) < HEADER.size:
            return
        b0, b1, seq, ts, ssrc = HEADER.unpack_from(data)
        assert b0 >> 6 == 2, "RTP version must be 2"
        csrc = b0 & 0x0F
        self.received.append(
            Received(
                time.monotonic(), b1 & 0x7F, bool(b1 & 0x80), seq, ts, ssrc, data[12 + 4 * csrc :]
            )
        )

    def close(self) -> None:
        for transport in (self.transport, self._rtcp_transport):
            if transport is not None:
                transport.close()

    # --- what the gateway sent ----------------------------------------------------------

    def audio(self, since: int = 0) -> npt.NDArray[np.int16]:
        """Decoded audio of the packets in the call's codec, from packet ``since``."""
        payload = b"".join(
            p.payload for p in self.received[since:] if p.payload_type == self.payload_type
        )
        return ulaw_decode(payload) if self.codec == "PCMU" else alaw_decode(payload)

    def talkspurts(self) -> list[list[Received]]:
        spurts: list[list[Received]] = []
        for packet in self.received:
            if packet.marker or not spurts:
                spurts.append([])
            spurts[-1].append(packet)
        return spurts

    async def wait_packets(self, count: int, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while len(self.received) < count:  # noqa: ASYNC110 - packets, not an event
                await asyncio.sleep(0.01)

    async def wait_quiet(self, quiet_s: float, timeout: float = 30.0) -> None:
        """Until nothing arrived for ``quiet_s`` (after at least one packet)."""
        async with asyncio.timeout(timeout):
            while not self.received or time.monotonic() - self.received[-1].at < quiet_s:  # noqa: ASYNC110
                await asyncio.sleep(0.02)

    # --- what the caller sends ----------------------------------------------------------

    def _send(
        self, payload_type: int, payload: bytes, *, marker: bool = False, ts: int | None = None
    ) -> None:
        assert self.transport is not None and self.remote is not None
        header = HEADER.pack(
            0x80,
            (0x80 if marker else 0) | payload_type,
            self._seq,
            ts if ts is not None else self._ts,
            self._ssrc,
        )
        self.transport.sendto(header + payload, self.remote)
        self._seq = (self._seq + 1) & 0xFFFF

    async def send_audio(self, pcm: npt.NDArray[np.int16]) -> float:
        """Send ``pcm`` (8 kHz) as 20 ms packets in real time; returns when it started."""
        encode = ulaw_encode if self.codec == "PCMU" else alaw_encode
        start = time.monotonic()
        for i, offset in enumerate(range(0, len(pcm) - 159, 160)):
            self._send(self.payload_type, encode(pcm[offset : offset + 160]), marker=i == 0)
            self._ts = (self._ts + 160) & 0xFFFFFFFF
            await asyncio.sleep(max(0.0, start + (i + 1) * 0.02 - time.monotonic()))
        return start

    async def send_digit(self, digit: str, *, duration_ms: int = 160) -> None:
        """One RFC 4733 event as a phone sends it: updates every 20 ms with the same
        timestamp (the first with the marker bit), then the end packet three times."""
        event = DTMF_EVENTS[digit]
        start_ts = self._ts
        for elapsed in range(20, duration_ms + 1, 20):
            body = struct.pack("!BBH", event, 10, elapsed * 8)
            self._send(DTMF_PT, body, marker=elapsed == 20, ts=start_ts)
            await asyncio.sleep(0.02)
        end = struct.pack("!BBH", event, 0x80 | 10, duration_ms * 8)
        for _ in range(3):
            self._send(DTMF_PT, end, ts=start_ts)
        self._ts = (self._ts + duration_ms * 8) & 0xFFFFFFFF


def _same(peer: RtpPeer) -> RtpPeer:
    return peer


class _RtcpSink(asyncio.DatagramProtocol):
    def __init__(self, peer: RtpPeer) -> None:
        self._peer = peer

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self._peer.rtcp.append(data)


def offer_sdp(
    port: int,
    codecs: tuple[str, ...] = ("PCMU",),
    *,
    direction: str = "sendrecv",
    address: str = "127.0.0.1",
) -> str:
    pts = " ".join(str(CODECS.get(c, 18)) for c in codecs)
    lines = [
        "v=0",
        "o=sipp 1 1 IN IP4 127.0.0.1",
        "s=-",
        f"c=IN IP4 {address}",
        "t=0 0",
        f"m=audio {port} RTP/AVP {pts} {DTMF_PT}",
    ]
    lines += [f"a=rtpmap:{CODECS.get(c, 18)} {c}/8000" for c in codecs]
    lines += [
        f"a=rtpmap:{DTMF_PT} telephone-event/8000",
        f"a=fmtp:{DTMF_PT} 0-15",
        "a=ptime:20",
        f"a={direction}",
    ]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- sipp

_HEADERS = """Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch];rport
      From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: <sip:{user}@[remote_ip]:[remote_port]>[peer_tag_param]
      Call-ID: [call_id]
      Contact: <sip:sipp@[local_ip]:[local_port]>
      Max-Forwards: 70"""


def invite(user: str, sdp: str, *, extra: str = "") -> str:
    body = "\n      ".join(sdp.strip().splitlines())
    return f"""  <send retrans="500">
    <![CDATA[

      INVITE sip:{user}@[remote_ip]:[remote_port] SIP/2.0
      {_HEADERS.format(user=user).replace("[peer_tag_param]", "")}
      CSeq: 1 INVITE
      Content-Type: application/sdp{extra}
      Content-Length: [len]

      {body}

    ]]>
  </send>
"""


def in_dialog(method: str, user: str, cseq: int, sdp: str | None = None) -> str:
    content = ""
    body = ""
    if sdp is not None:
        content = "\n      Content-Type: application/sdp"
        body = "\n      ".join(sdp.strip().splitlines())
    return f"""  <send retrans="500">
    <![CDATA[

      {method} sip:{user}@[remote_ip]:[remote_port] SIP/2.0
      {_HEADERS.format(user=user)}
      CSeq: {cseq} {method}{content}
      Content-Length: [len]

      {body}

    ]]>
  </send>
"""


def ack(user: str, cseq: int = 1) -> str:
    return f"""  <send>
    <![CDATA[

      ACK sip:{user}@[remote_ip]:[remote_port] SIP/2.0
      {_HEADERS.format(user=user)}
      CSeq: {cseq} ACK
      Content-Length: 0

    ]]>
  </send>
"""


OK_TO_REQUEST = """  <send>
    <![CDATA[

      SIP/2.0 200 OK
      [last_Via:]
      [last_From:]
      [last_To:]
      [last_Call-ID:]
      [last_CSeq:]
      Contact: <sip:sipp@[local_ip]:[local_port]>
      Content-Length: 0

    ]]>
  </send>
"""


def recv(
    response: int | None = None,
    *,
    request: str | None = None,
    optional: bool = False,
    timeout_ms: int | None = None,
    rrs: bool = False,
) -> str:
    attrs = f'response="{response}"' if response is not None else f'request="{request}"'
    if optional:
        attrs += ' optional="true"'
    if timeout_ms is not None:
        attrs += f' timeout="{timeout_ms}"'
    if rrs:
        attrs += ' rrs="true"'
    return f"  <recv {attrs}/>\n"


def pause(ms: int) -> str:
    return f'  <pause milliseconds="{ms}"/>\n'


def play_pcap(path: str) -> str:
    return f'  <nop><action><exec play_pcap_audio="{path}"/></action></nop>\n'


def call_ended_by_gateway(name: str, user: str, sdp: str) -> str:
    """A scenario that calls ``user`` with ``sdp``, acknowledges the answer, then waits
    (40 s at most) for the gateway's BYE and answers it: a call its application ends."""
    return scenario(
        name,
        invite(user, sdp),
        recv(100, optional=True),
        recv(200, rrs=True),
        ack(user),
        recv(request="BYE", timeout_ms=40000),
        OK_TO_REQUEST,
    )


def scenario(name: str, *steps: str) -> str:
    head = '<?xml version="1.0" encoding="ISO-8859-1" ?>'
    return f'{head}\n<scenario name="{name}">\n{"".join(steps)}</scenario>\n'


@dataclass
class SippResult:
    returncode: int
    output: str


async def run_sipp(
    xml: str,
    target: tuple[str, int],
    tmp: Path,
    *,
    timeout: float = 60.0,
    calls: int = 1,
    rate: float | None = None,
    media_port: int | None = None,
    call_id: str | None = None,
    extra_args: Sequence[str] = (),
) -> SippResult:
    """Run one sipp UAC scenario against ``target``; sipp exits 0 when every call passed."""
    scenario_path = tmp / f"scenario-{random.getrandbits(32):08x}.xml"
    scenario_path.write_text(xml)
    errors = tmp / f"errors-{scenario_path.stem}.log"
    args = [
        "sipp",
        f"{target[0]}:{target[1]}",
        "-sf",
        str(scenario_path),
        "-m",
        str(calls),
        "-i",
        "127.0.0.1",
        "-p",
        "0",
        "-nostdin",
        "-trace_err",
        "-error_file",
        str(errors),
        "-timeout",
        f"{int(timeout)}s",
        "-timeout_error",
        "-max_recv_loops",
        "1000",
        "-bg" if False else "-nd",
    ]
    if call_id is not None:  # one call: sipp's [call_id] is this (-cid_str, "%" escaped)
        args += ["-cid_str", call_id.replace("%", "%%")]
    if media_port is not None:
        args += ["-mi", "127.0.0.1", "-mp", str(media_port)]
    if rate is not None:
        args += ["-r", str(rate), "-l", str(calls)]
    args += extra_args
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=tmp
    )
    try:
        async with asyncio.timeout(timeout + 10):
            out, _ = await proc.communicate()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        out, _ = await proc.communicate()
    text = out.decode(errors="replace")[-4000:]
    if errors.exists():
        text += "\n--- sipp errors ---\n" + errors.read_text(errors="replace")[-4000:]
    assert proc.returncode is not None
    return SippResult(proc.returncode, text)


# --------------------------------------------------------------------------- baresip

BARESIP_CONFIG = """sip_listen\t127.0.0.1:0
audio_player\taubridge,nil
audio_source\taufile,{source}
audio_alert\taubridge,nil
audio_srate\t8000
audio_channels\t1
jitter_buffer_delay\t0-0
module_path\t/usr/lib/baresip/modules
module\tg711.so
module\taufile.so
module\taubridge.so
module\tsndfile.so
module_app\taccount.so
module_app\tmenu.so
snd_path\t{dumps}
"""


def have_baresip() -> bool:
    return shutil.which("baresip") is not None and Path("/usr/lib/baresip/modules").is_dir()


def baresip_config(directory: Path, seconds: float = 30.0) -> Path:
    """A baresip configuration with no sound card: it sends ``seconds`` of silence from a
    WAV file (aufile) and writes what it decodes to ``directory/dumps`` (sndfile). Its
    jitter buffer is off: with one, the packets still buffered when the call ends (about
    100 ms) are never decoded, and the dump could not be held to the prompt's length."""
    import wave

    directory.mkdir(parents=True, exist_ok=True)
    dumps = directory / "dumps"
    dumps.mkdir(exist_ok=True)
    source = directory / "silence.wav"
    with wave.open(str(source), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(b"\0\0" * int(8000 * seconds))
    (directory / "config").write_text(BARESIP_CONFIG.format(source=source, dumps=dumps))
    (directory / "accounts").write_text("<sip:baresip@127.0.0.1>;regint=0\n")
    return dumps


def decoded_dump(dumps: Path) -> npt.NDArray[np.int16]:
    """What baresip decoded from the call (its sndfile ``-dec.wav``)."""
    import wave

    files = sorted(dumps.glob("*-dec.wav"))
    assert files, f"no decoded dump in {dumps}"
    with wave.open(str(files[-1])) as w:
        assert w.getframerate() == 8000
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").copy()
