"""The AudioSocket listener against a simulated Asterisk: a real gateway process, a TCP
client that speaks AudioSocket as Asterisk does, and an IVR application attached to the
call over the native WebSocket.

The simulated Asterisk is written from the protocol's documentation (docs.asterisk.org,
"AudioSocket" channel driver, "Protocol definition"; CyCoreSystems/audiosocket README),
not from the gateway's code: a message is a 1-byte kind, a 2-byte big-endian payload
length and the payload. Asterisk sends the call's UUID (16 bytes) first, then one audio
message per 20 ms of the channel (kind 0x10, signed linear 16-bit at 8 kHz; 0x12 for
16 kHz with ``c(slin16)``), a DTMF message (0x03, one ASCII digit) per key press, and
closes the socket when the channel hangs up; it accepts audio and terminate (0x00) from
the server and plays audio as it arrives, with no buffer. Everything it receives is
recorded with its arrival time (``time.monotonic``); anything Asterisk would refuse is
recorded in ``violations`` (tests assert that list is empty).

Assertions are made at the receiving end: the audio the simulated Asterisk got (its
length, pacing and level), the events the application got and when.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from tests.integration import caller_audio
from tests.integration.conftest import Connect
from tests.integration.harness import GatewayProcess, NativeClient, free_port, metric
from tests.integration.telephony_peers import attach, event_time, max_run_ahead_ms

pytestmark = pytest.mark.slow

HANGUP, UUID, DTMF, ERROR = 0x00, 0x01, 0x03, 0xFF
AUDIO_KINDS = {8000: 0x10, 16000: 0x12}
FRAME_S = 0.020
TENANT = "audiosocket"  # the default tenant of the trusted networks
PROMPT = "Thank you for calling. Please hold while we find your account."
MENU = "For billing, press 1. For technical support, press 2. " * 3


def message(kind: int, payload: bytes = b"") -> bytes:
    return bytes((kind,)) + len(payload).to_bytes(2, "big") + payload


class SimulatedAsterisk:
    """Asterisk's side of one AudioSocket connection (the dialplan application, or the
    channel driver with ``c(slin16)`` for 16 kHz)."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, rate: int
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.rate = rate
        self.kind = AUDIO_KINDS[rate]
        self.frame_bytes = int(rate * FRAME_S) * 2
        self.call_id = str(uuid.uuid4())
        #: Every message received: (arrival time, kind, payload).
        self.received: list[tuple[float, int, bytes]] = []
        self.violations: list[str] = []
        self.closed: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._to_play: deque[tuple[bytes, asyncio.Future[float]]] = deque()
        self._tasks: list[asyncio.Task[None]] = [asyncio.create_task(self._read())]

    @classmethod
    async def connect(
        cls,
        port: int,
        *,
        rate: int = 8000,
        send_uuid: bool = True,
        audio: bool = True,
        source: str = "127.0.0.1",
    ) -> SimulatedAsterisk:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
        peer = cls(reader, writer, rate)
        if send_uuid:
            await peer.send(message(UUID, uuid.UUID(peer.call_id).bytes))
        if audio:
            peer.start_audio()
        return peer

    # -- what Asterisk sends

    async def send(self, data: bytes) -> float:
        self.writer.write(data)
        await self.writer.drain()
        return time.monotonic()

    def start_audio(self) -> None:
        """The channel's audio: a 20 ms message every 20 ms (silence unless something is
        being played), on absolute deadlines, as long as the socket is open."""
        self._tasks.append(asyncio.create_task(self._send_audio()))

    def play(self, pcm: npt.NDArray[np.int16]) -> asyncio.Future[float]:
        """Queue ``pcm`` (at this leg's rate) as the caller's audio; resolves with the time
        its first message was sent."""
        started: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._to_play.append((pcm.astype("<i2").tobytes(), started))
        return started

    async def _send_audio(self) -> None:
        silence = bytes(self.frame_bytes)
        buffered = b""
        start = time.monotonic()
        n = 0
        while not self.closed.done() and not self.writer.is_closing():
            if not buffered and self._to_play:
                buffered, started = self._to_play.popleft()
                started.set_result(time.monotonic())
            frame, buffered = buffered[: self.frame_bytes], buffered[self.frame_bytes :]
            frame = frame.ljust(self.frame_bytes, b"\0") if frame else silence
            try:
                await self.send(message(self.kind, frame))
            except ConnectionError:
                return
            n += 1
            await asyncio.sleep(max(0.0, start + n * FRAME_S - time.monotonic()))

    async def send_dtmf(self, digit: str) -> float:
        return await self.send(message(DTMF, digit.encode("ascii")))

    async def hang_up(self) -> None:
        """The channel hung up: Asterisk closes the socket."""
        await self.aclose()

    # -- what Asterisk receives

    async def _read(self) -> None:
        try:
            while True:
                header = await self.reader.readexactly(3)
                length = int.from_bytes(header[1:], "big")
                payload = await self.reader.readexactly(length)
                now = time.monotonic()
                kind = header[0]
                self.received.append((now, kind, payload))
                if kind == self.kind:
                    if not payload or len(payload) % 2:
                        self.violations.append(f"audio of {len(payload)} bytes")
                elif kind == HANGUP:
                    if payload:
                        self.violations.append("a terminate with a payload")
                else:  # Asterisk hangs up on any other kind from the server
                    self.violations.append(f"kind 0x{kind:02x} ({length} bytes)")
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                self.violations.append(f"the stream ended {len(exc.partial)} bytes into a message")
        except ConnectionError:
            pass
        finally:
            if not self.closed.done():
                self.closed.set_result(time.monotonic())

    def audio(self) -> list[tuple[float, bytes]]:
        return [(t, p) for t, kind, p in self.received if kind == self.kind]

    def pcm(self) -> npt.NDArray[np.int16]:
        return np.frombuffer(b"".join(p for _, p in self.audio()), dtype="<i2")

    async def wait_closed(self, timeout: float = 5.0) -> float:
        async with asyncio.timeout(timeout):
            return await asyncio.shield(self.closed)

    async def aclose(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2):
                await self.writer.wait_closed()
        for task in self._tasks:
            task.cancel()
        await asyncio.wait(self._tasks)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    gw = GatewayProcess(
        tmp_path_factory.mktemp("audiosocket-gateway") / "gateway.log",
        GATEWAY_AUDIOSOCKET_LISTEN=f"127.0.0.1:{free_port()}",
    )
    gw.start()
    yield gw
    gw.stop()


def port_of(gw: GatewayProcess) -> int:
    return int(gw.env["GATEWAY_AUDIOSOCKET_LISTEN"].rsplit(":", 1)[1])


@pytest.fixture
async def peers() -> AsyncIterator[list[SimulatedAsterisk]]:
    """Simulated Asterisk connections the test opens; closed at its end."""
    opened: list[SimulatedAsterisk] = []
    yield opened
    for peer in opened:
        await peer.aclose()


async def call(
    gateway: GatewayProcess,
    connect: Connect,
    peers: list[SimulatedAsterisk],
    *,
    rate: int = 8000,
) -> tuple[SimulatedAsterisk, NativeClient]:
    """A call from the simulated Asterisk with an application attached to it."""
    peer = await SimulatedAsterisk.connect(port_of(gateway), rate=rate)
    peers.append(peer)

    async def app_connect(token: str | None = "") -> NativeClient:
        return await connect(gateway.token(tenant=TENANT))

    app = await attach(app_connect, peer.call_id)
    started = await app.wait_event("call_started")
    assert started["call_id"] == peer.call_id
    assert started["protocol"] == "audiosocket"
    return peer, app


async def sessions_active_reaches_zero(gw: GatewayProcess, timeout: float = 5.0) -> float:
    deadline = time.monotonic() + timeout
    while True:
        value = await metric(gw, "gateway_sessions_active", protocol="audiosocket")
        if value == 0 or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.05)


# --------------------------------------------------------------------------- the prompt


@pytest.mark.realtime  # frame timing: runs alone (Makefile)
@pytest.mark.parametrize("rate", [8000, 16000])
async def test_a_prompt_arrives_whole_paced_and_at_speech_level(
    gateway: GatewayProcess, connect: Connect, peers: list[SimulatedAsterisk], rate: int
) -> None:
    peer, app = await call(gateway, connect, peers, rate=rate)
    await app.send(type="speak", text=PROMPT, utterance_id="p")
    done = await app.wait_event("utterance_done", utterance_id="p", timeout=20)
    await asyncio.sleep(0.1)  # the last frames' way through the socket
    audio = peer.audio()
    assert audio, "no audio reached Asterisk"
    assert not peer.violations
    # One message per 20 ms frame, in the call's own rate (the kind Asterisk sent).
    assert {len(payload) for _, payload in audio} == {peer.frame_bytes}
    pcm = peer.pcm()
    heard_ms = len(pcm) / rate * 1000
    assert abs(heard_ms - done["audio_ms"]) <= 40, (heard_ms, done["audio_ms"])
    # Paced, no burst: the arrivals span the audio's duration (less the pacing lead and
    # one frame), and never run more than the lead ahead of real-time playout.
    arrivals = [t for t, _ in audio]
    span = arrivals[-1] - arrivals[0]
    duration = heard_ms / 1000
    assert duration - 0.20 <= span <= duration + 0.25, (span, duration)
    chunks = [(t, len(payload)) for t, payload in audio]
    assert max_run_ahead_ms(chunks, bytes_per_second=rate * 2) <= 120
    gaps = np.diff(arrivals[3:])  # after the lead's first frames
    assert 18.5 <= float(np.median(gaps)) * 1000 <= 21.5
    assert caller_audio.level_dbfs(pcm) > -35  # speech, not silence


# --------------------------------------------------------------------------- DTMF


async def test_digits_reach_the_application(
    gateway: GatewayProcess, connect: Connect, peers: list[SimulatedAsterisk]
) -> None:
    peer, app = await call(gateway, connect, peers)
    await peer.send_dtmf("5")
    assert (await app.wait_event("dtmf", timeout=5))["digit"] == "5"
    await peer.send_dtmf("#")
    assert (await app.wait_event("dtmf", count=2, timeout=5))["digit"] == "#"
    await peer.send_dtmf("b")  # SIP INFO's lowercase letters come through as they are
    assert (await app.wait_event("dtmf", count=3, timeout=5))["digit"] == "B"
    assert await metric(gateway, "gateway_audiosocket_dtmf_total") >= 3


# --------------------------------------------------------------------------- barge-in


@pytest.mark.realtime  # barge-in timing: runs alone (Makefile)
async def test_caller_speech_barges_in_and_the_prompt_stops(
    gateway: GatewayProcess, connect: Connect, peers: list[SimulatedAsterisk]
) -> None:
    speech = caller_audio.espeak_speech()
    peer, app = await call(gateway, connect, peers)
    await app.send(type="speak", text=MENU, utterance_id="menu")
    await app.wait_event("utterance_started", utterance_id="menu", timeout=10)
    lead_in = 1.0
    sent = await peer.play(np.concatenate([caller_audio.silence(lead_in), speech]))
    onset = sent + lead_in
    barge = await app.wait_event("barge_in", timeout=5)
    assert event_time(app, barge) - onset <= 0.300
    await asyncio.sleep(0.5)
    assert not app.got.of_type("utterance_done")  # the menu did not finish
    # The prompt stopped at the caller's ear: nothing after the barge-in but the lead.
    after = [t for t, _ in peer.audio() if t > event_time(app, barge) + 0.1]
    assert len(after) <= 5
    assert not peer.violations


# --------------------------------------------------------------------------- hangup


async def test_the_application_hangs_up_with_a_terminate_then_the_close(
    gateway: GatewayProcess, connect: Connect, peers: list[SimulatedAsterisk]
) -> None:
    peer, app = await call(gateway, connect, peers)
    await app.send(type="hangup")
    ended = await app.wait_event("call_ended", timeout=5)
    assert ended["call_id"] == peer.call_id
    await peer.wait_closed(timeout=3)
    assert peer.received and peer.received[-1][1:] == (HANGUP, b"")
    assert not peer.violations
    assert await sessions_active_reaches_zero(gateway) == 0


@pytest.mark.parametrize("how", ["terminate", "close"])
async def test_asterisk_hangs_up_and_the_call_ends(
    gateway: GatewayProcess, connect: Connect, peers: list[SimulatedAsterisk], how: str
) -> None:
    peer, app = await call(gateway, connect, peers)
    assert await metric(gateway, "gateway_sessions_active", protocol="audiosocket") >= 1
    await app.send(type="speak", text=MENU, utterance_id="menu")
    await app.wait_event("utterance_started", utterance_id="menu", timeout=10)
    if how == "terminate":
        await peer.send(message(HANGUP))
    else:
        await peer.hang_up()
    ended = await app.wait_event("call_ended", timeout=5)
    assert ended["reason"] == ("remote_hangup" if how == "terminate" else "remote_closed")
    await peer.wait_closed(timeout=3)  # the gateway closes its end too
    assert await sessions_active_reaches_zero(gateway) == 0
    assert await metric(gateway, "gateway_audiosocket_calls_active") == 0


# --------------------------------------------------------------------------- refusals


@pytest.mark.realtime  # closed within 0.5 s: runs alone
async def test_trust_is_by_network_and_a_shutdown_hangs_up_with_a_terminate(
    tmp_path: Path,
) -> None:
    """A second gateway trusting 10.0.0.0/8 and 127.0.0.2 (tenant ``acme``) only: a
    connection from 127.0.0.1 is closed at once, before any byte, and counted; one from
    127.0.0.2 is a call of tenant ``acme``, which the shutdown's drain ends with a
    terminate message and the close."""
    gw = GatewayProcess(
        tmp_path / "gateway.log",
        GATEWAY_AUDIOSOCKET_LISTEN=f"127.0.0.1:{free_port()}",
        GATEWAY_AUDIOSOCKET_ALLOW="10.0.0.0/8=pbx,127.0.0.2/32=acme",
        ENGINE_VAD="0",
    )
    await asyncio.to_thread(gw.start)
    app: NativeClient | None = None
    trusted: SimulatedAsterisk | None = None
    try:
        start = time.monotonic()
        untrusted = await SimulatedAsterisk.connect(port_of(gw), audio=False)
        try:
            closed = await untrusted.wait_closed(timeout=2)
        finally:
            await untrusted.aclose()
        assert closed - start < 0.5
        assert not untrusted.received
        refused = "gateway_audiosocket_connections_refused_total"
        assert await metric(gw, refused, reason="untrusted") == 1
        assert await metric(gw, "gateway_sessions_total", protocol="audiosocket") == 0

        trusted = await SimulatedAsterisk.connect(port_of(gw), source="127.0.0.2")

        async def app_connect(token: str | None = "") -> NativeClient:
            return await NativeClient.connect(gw.ws_url, gw.token(tenant="acme"))

        app = await attach(app_connect, trusted.call_id)
        await asyncio.to_thread(gw.stop)  # SIGINT: the drain (1 s here), then the stop
        await trusted.wait_closed(timeout=5)
        assert trusted.received and trusted.received[-1][1:] == (HANGUP, b"")
        assert not trusted.violations
        # The application's own session is drained too: it is told, then closed (1013).
        assert await app.wait_closed(timeout=5) == 1013
        assert {e["code"] for e in app.got.of_type("error")} == {"shutting_down"}
    finally:
        if trusted is not None:
            await trusted.aclose()
        if app is not None:
            await app.aclose()
        await asyncio.to_thread(gw.stop)


async def test_a_peer_without_a_uuid_is_closed_after_the_timeout(
    gateway: GatewayProcess, peers: list[SimulatedAsterisk]
) -> None:
    refused = "gateway_audiosocket_connections_refused_total"
    before = await metric(gateway, refused, reason="uuid_timeout")
    start = time.monotonic()
    peer = await SimulatedAsterisk.connect(port_of(gateway), send_uuid=False, audio=False)
    peers.append(peer)
    closed = await peer.wait_closed(timeout=8)
    assert 4.5 <= closed - start <= 6.5
    assert not peer.received
    assert await metric(gateway, refused, reason="uuid_timeout") == before + 1


async def test_a_malformed_stream_ends_the_call_with_an_error_to_the_application(
    gateway: GatewayProcess, connect: Connect, peers: list[SimulatedAsterisk]
) -> None:
    peer, app = await call(gateway, connect, peers)
    await peer.send(message(0x02))  # the Go library's "silence": no kind Asterisk knows
    error = await app.wait_event("error", timeout=5)
    assert error["code"] == "audiosocket_unknown_kind"
    ended = await app.wait_event("call_ended", timeout=5)
    assert ended["reason"] == "audiosocket_unknown_kind"
    await peer.wait_closed(timeout=3)
    assert await metric(gateway, "gateway_errors_total", code="audiosocket_unknown_kind") >= 1
    assert await sessions_active_reaches_zero(gateway) == 0


async def test_a_silent_leg_starts_at_8_khz_and_a_later_16_khz_stream_is_refused(
    gateway: GatewayProcess, connect: Connect, peers: list[SimulatedAsterisk]
) -> None:
    """No audio after the UUID (a caller behind silence suppression): the call starts at
    8 kHz after 2 s; audio at another rate later ends it."""
    peer = await SimulatedAsterisk.connect(port_of(gateway), rate=16000, audio=False)
    peers.append(peer)

    async def app_connect(token: str | None = "") -> NativeClient:
        return await connect(gateway.token(tenant=TENANT))

    app = await attach(app_connect, peer.call_id, timeout=5)
    ready = app.got.of_type("ready")[0]
    assert ready["format"] == "pcm_8000"
    await app.send(type="speak", text="Hello.", utterance_id="hello")
    await app.wait_event("utterance_done", utterance_id="hello", timeout=10)
    await asyncio.sleep(0.1)
    assert {kind for _, kind, _ in peer.received} == {0x10}  # 8 kHz audio
    peer.start_audio()  # 0x12 frames
    error = await app.wait_event("error", timeout=5)
    assert error["code"] == "audiosocket_sample_rate_changed"
    await app.wait_event("call_ended", timeout=5)
    await peer.wait_closed(timeout=3)
