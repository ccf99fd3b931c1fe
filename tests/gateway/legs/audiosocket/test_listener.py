"""The AudioSocket listener and its call legs in-process, over real loopback sockets: who
gets in, what a call registers, and that whatever ends a connection (the peer, a protocol
error, a refused start, a watchdog, the listener's stop) everything is released: the
call, the session's engine stream, tenant lease and pacer entry, the connection tracking,
the metrics and the socket.

The engine is a fake (the session, pacer, tenant limits and call registry are real); the
end-to-end behaviour with a real engine (audio, pacing, barge-in) is in
tests/integration/test_audiosocket.py.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from engine.ipc.client import EngineUnavailable
from gateway.auth import AuthSettings
from gateway.config import GatewaySettings
from gateway.events import CallEnded, Dtmf, ErrorEvent, MarkReached, SessionEvent
from gateway.legs.audiosocket.config import AudioSocketSettings
from gateway.legs.audiosocket.leg import AudioSocketLeg
from gateway.legs.audiosocket.listener import AudioSocketListener
from gateway.legs.sip.config import parse_allow
from gateway.session import SessionState
from gateway.state import GatewayState
from gateway.voices.store import FileVoiceStore
from tests.gateway.fake_engine_stream import FakeStream

SECRET = "audiosocket-listener-secret-0123456789abcdef"
SILENCE_8K = b"\x10\x01\x40" + bytes(320)  # one 20 ms audio message at 8 kHz
REFUSED = "gateway_audiosocket_connections_refused_total"


def message(kind: int, payload: bytes = b"") -> bytes:
    return bytes((kind,)) + len(payload).to_bytes(2, "big") + payload


async def eventually(condition: Callable[[], bool], timeout: float = 2.0) -> None:
    """Wait until ``condition()`` holds (state owned by the code under test: no event)."""
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


# --------------------------------------------------------------------------- fakes


class FakeEngine:
    lost = False

    def __init__(self) -> None:
        self.streams: list[FakeStream] = []
        self.opened: list[dict[str, Any]] = []
        self.delay_s = 0.0
        self.down = False

    async def open_stream(self, **kwargs: Any) -> FakeStream:
        self.opened.append(kwargs)
        await asyncio.sleep(self.delay_s)
        if self.down:
            raise EngineUnavailable("the engine is down")
        stream = FakeStream()
        self.streams.append(stream)
        return stream


class FakeSupervisor:
    def __init__(self, engine: FakeEngine) -> None:
        self.client = engine


class Recorder:
    """An attached application: records the call's events."""

    def __init__(self) -> None:
        self.events: list[SessionEvent] = []

    def on_call_event(self, event: SessionEvent) -> None:
        self.events.append(event)


class Peer:
    """A raw AudioSocket client (what Asterisk would be)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.call_id = str(uuid.uuid4())

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def send_uuid(self) -> None:
        await self.send(message(0x01, uuid.UUID(self.call_id).bytes))

    async def read_to_eof(self, timeout: float = 3.0) -> bytes:
        """Everything the gateway sends until it closes its end."""
        data = bytearray()
        async with asyncio.timeout(timeout):
            while chunk := await self.reader.read(65536):
                data += chunk
        return bytes(data)

    def close(self) -> None:
        self.writer.close()


class Harness:
    def __init__(
        self, state: GatewayState, engine: FakeEngine, listener: AudioSocketListener
    ) -> None:
        self.state, self.engine, self.listener = state, engine, listener
        self.peers: list[Peer] = []

    async def connect(self) -> Peer:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.listener.port)
        peer = Peer(reader, writer)
        self.peers.append(peer)
        return peer

    async def call(self, first: bytes = SILENCE_8K) -> tuple[Peer, AudioSocketLeg]:
        """A peer that sent its UUID and ``first``, with its call registered."""
        peer = await self.connect()
        await peer.send_uuid()
        await peer.send(first)
        leg = await self.leg(peer.call_id)
        return peer, leg

    async def leg(self, call_id: str, timeout: float = 2.0) -> AudioSocketLeg:
        async with asyncio.timeout(timeout):
            while True:
                for leg in self.listener._legs:
                    if leg.call_id == call_id and leg.call is not None:
                        return leg
                await asyncio.sleep(0.01)

    def metric(self, name: str, **labels: str) -> float:
        value = self.state.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    async def released(self, timeout: float = 3.0) -> None:
        """Every connection ended and everything it held was given back."""
        await eventually(
            lambda: not (self.listener.connections or self.state.connections.live), timeout
        )
        await self.state.connections.close()  # the teardowns still running
        state = self.state
        assert not self.listener.calls
        assert len(state.calls) == 0
        assert state.limits.held == 0
        assert state.pacer.active_count == 0
        assert all(stream.closed == 1 for stream in self.engine.streams)
        assert self.metric("gateway_sessions_active", protocol="audiosocket") == 0
        assert self.metric("gateway_audiosocket_calls_active") == 0


Make = Callable[..., Awaitable[Harness]]


@pytest.fixture
async def make(tmp_path: Path) -> AsyncIterator[Make]:
    made: list[Harness] = []

    async def _make(**overrides: Any) -> Harness:
        auth = AuthSettings(secret=SECRET, public_key_path=None, audience=None, issuer=None)
        engine = FakeEngine()
        state = GatewayState.create(
            GatewaySettings(auth=auth),
            supervisor=FakeSupervisor(engine),  # type: ignore[arg-type]
            store=FileVoiceStore(tmp_path),
        )
        settings = replace(
            AudioSocketSettings(listen=("127.0.0.1", 0), first_audio_wait_s=0.3), **overrides
        )
        listener = AudioSocketListener(state, settings)
        await listener.start()
        harness = Harness(state, engine, listener)
        made.append(harness)
        return harness

    yield _make
    for harness in made:
        for peer in harness.peers:
            peer.close()
        await harness.listener.stop()


# --------------------------------------------------------------------------- a call


@pytest.mark.parametrize(("kind", "rate"), [(0x10, 8000), (0x12, 16000), (0x16, 48000)])
async def test_a_call_is_registered_in_the_rate_of_its_first_audio(
    make: Make, kind: int, rate: int
) -> None:
    gw = await make(voice="en-us", say="Welcome.")
    peer, leg = await gw.call(message(kind, bytes(rate // 50 * 2)))
    call = leg.call
    assert call is not None and call.call_id == peer.call_id
    assert call.tenant == "audiosocket" and call.protocol == "audiosocket"
    assert gw.state.calls.get(peer.call_id, "audiosocket") is call
    options = leg.session.options
    assert options is not None and options.format.name == f"pcm_{rate}"
    assert options.input_format == options.format and options.barge_in
    assert gw.engine.opened[0]["voice"] == "en-us"
    assert gw.engine.opened[0]["sample_rate"] == rate
    assert gw.metric("gateway_sessions_active", protocol="audiosocket") == 1
    assert gw.metric("gateway_audiosocket_calls_active") == 1
    # Our audio goes out as one message of the call's kind per frame.
    leg.send_audio(bytes(rate // 50 * 2))
    peer.close()
    await gw.released()
    assert gw.metric("gateway_audiosocket_calls_total", reason="remote_closed") == 1


async def test_the_source_network_names_the_tenant(make: Make) -> None:
    gw = await make(allow=parse_allow("10.0.0.0/8=pbx,127.0.0.0/8=acme"))
    peer, leg = await gw.call()
    assert leg.call is not None and leg.call.tenant == "acme"
    assert leg.session.tenant == "acme"
    assert gw.state.calls.get(peer.call_id, "audiosocket") is None  # another tenant's
    peer.close()
    await gw.released()


async def test_a_leg_without_audio_starts_at_8_khz(make: Make) -> None:
    gw = await make(first_audio_wait_s=0.1)
    peer = await gw.connect()
    await peer.send_uuid()
    leg = await gw.leg(peer.call_id)
    assert leg.sample_rate == 8000
    assert leg.session.options is not None and leg.session.options.format.name == "pcm_8000"
    # 16 kHz audio now is not the call's rate: the call ends.
    app = Recorder()
    assert leg.call is not None
    leg.call.subscribers.add(app)
    await peer.send(message(0x12, bytes(640)))
    await peer.read_to_eof()
    await gw.released()
    errors = [e for e in app.events if isinstance(e, ErrorEvent)]
    assert [e.code for e in errors] == ["audiosocket_sample_rate_changed"]
    assert gw.metric("gateway_audiosocket_calls_total", reason="protocol_error") == 1


async def test_audio_dtmf_marks_and_the_applications_hangup(make: Make) -> None:
    gw = await make()
    peer, leg = await gw.call()
    app = Recorder()
    assert leg.call is not None
    leg.call.subscribers.add(app)
    await peer.send(message(0x03, b"7") + message(0x03, b"c") + SILENCE_8K)
    await eventually(lambda: len([e for e in app.events if isinstance(e, Dtmf)]) == 2)
    assert [e.digit for e in app.events if isinstance(e, Dtmf)] == ["7", "C"]
    assert gw.metric("gateway_audiosocket_dtmf_total") == 2
    leg.send_audio(b"\x01\x00" * 160)
    leg.mark_reached("m1")  # no vendor marks: reported at once
    assert MarkReached("m1") in app.events
    leg.hangup()  # what an attached application's hangup does
    received = await peer.read_to_eof()
    assert received == message(0x10, b"\x01\x00" * 160) + b"\x00\x00\x00"
    await gw.released()
    ended = [e for e in app.events if isinstance(e, CallEnded)]
    assert ended == [CallEnded(peer.call_id, "hangup")]
    assert gw.metric("gateway_audiosocket_calls_total", reason="hangup") == 1


async def test_a_terminate_from_asterisk_ends_the_call(make: Make) -> None:
    gw = await make()
    peer, leg = await gw.call()
    app = Recorder()
    assert leg.call is not None
    leg.call.subscribers.add(app)
    await peer.send(message(0x00))
    assert await peer.read_to_eof() == b""  # no terminate back: the call is over
    await gw.released()
    assert [e for e in app.events if isinstance(e, CallEnded)] == [
        CallEnded(peer.call_id, "remote_hangup")
    ]
    assert gw.metric("gateway_audiosocket_calls_total", reason="remote_hangup") == 1


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"\x02\x00\x00", "audiosocket_unknown_kind"),
        (message(0x01, bytes(16)), "audiosocket_unexpected_message"),  # a second UUID
        (message(0x10, b"\x00"), "audiosocket_bad_audio_length"),
        (message(0x03, b"x"), "audiosocket_bad_dtmf"),
        (b"\x10\xff\xff", "audiosocket_frame_too_large"),
        (message(0xFF, b"\x02"), "audiosocket_peer_error"),
    ],
)
async def test_a_malformed_stream_ends_the_call_with_an_error(
    make: Make, data: bytes, code: str
) -> None:
    gw = await make()
    peer, leg = await gw.call()
    app = Recorder()
    assert leg.call is not None
    leg.call.subscribers.add(app)
    await peer.send(message(0x03, b"1") + data)  # what came before the bad message counts
    await peer.read_to_eof()
    await gw.released()
    assert app.events[0] == Dtmf("1")
    assert [e.code for e in app.events if isinstance(e, ErrorEvent)] == [code]
    assert [e for e in app.events if isinstance(e, CallEnded)] == [CallEnded(peer.call_id, code)]
    assert gw.metric("gateway_errors_total", code=code) == 1


# --------------------------------------------------------------------------- refusals


@pytest.mark.realtime  # closed within 1 s: runs alone (Makefile)
async def test_untrusted_sources_are_closed_at_once(make: Make) -> None:
    gw = await make(allow=parse_allow("10.0.0.0/8"))
    peer = await gw.connect()
    assert await peer.read_to_eof(timeout=1) == b""
    assert gw.metric(REFUSED, reason="untrusted") == 1
    assert not gw.engine.opened
    await gw.released()


@pytest.mark.realtime  # closed within 1 s: runs alone (Makefile)
async def test_the_cap_counts_connections_waiting_for_their_uuid(make: Make) -> None:
    gw = await make(max_calls=1)
    waiting = await gw.connect()
    await eventually(lambda: gw.listener.connections == 1)
    second = await gw.connect()
    assert await second.read_to_eof(timeout=1) == b""
    assert gw.metric(REFUSED, reason="limit") == 1
    waiting.close()
    await gw.released()
    assert gw.metric(REFUSED, reason="bad_start") == 1  # closed before its UUID


async def test_no_uuid_in_time_or_something_else_first_is_closed(make: Make) -> None:
    gw = await make(uuid_timeout_s=0.2)
    silent = await gw.connect()
    started = asyncio.get_running_loop().time()
    assert await silent.read_to_eof() == b""
    assert asyncio.get_running_loop().time() - started >= 0.19
    assert gw.metric(REFUSED, reason="uuid_timeout") == 1
    audio_first = await gw.connect()
    await audio_first.send(SILENCE_8K)
    assert await audio_first.read_to_eof() == b""
    assert gw.metric(REFUSED, reason="bad_start") == 1
    assert not gw.engine.opened
    await gw.released()


async def test_a_draining_worker_takes_no_new_call(make: Make) -> None:
    gw = await make()
    gw.state.connections.draining = True
    peer = await gw.connect()
    assert await peer.read_to_eof() == b""
    assert gw.metric(REFUSED, reason="draining") == 1
    await gw.released()


async def test_an_unsupported_rate_or_a_refused_start_closes_the_socket(make: Make) -> None:
    gw = await make()
    peer = await gw.connect()
    await peer.send_uuid()
    await peer.send(message(0x11, bytes(480)))  # 12 kHz: no gateway format
    await peer.read_to_eof()
    await gw.released()
    assert not gw.engine.opened
    assert gw.metric("gateway_audiosocket_calls_total", reason="protocol_error") == 1
    gw.engine.down = True
    peer = await gw.connect()
    await peer.send_uuid()
    await peer.send(SILENCE_8K)
    assert await peer.read_to_eof() == b"\x00\x00\x00"  # terminate: the call was up here
    await gw.released()
    assert gw.metric("gateway_audiosocket_calls_total", reason="refused") == 1
    assert gw.metric("gateway_errors_total", code="engine_unavailable") == 1


async def test_the_peer_leaves_while_the_session_starts(make: Make) -> None:
    gw = await make()
    gw.engine.delay_s = 0.3
    peer = await gw.connect()
    await peer.send_uuid()
    await peer.send(SILENCE_8K)
    await eventually(lambda: bool(gw.engine.opened))
    peer.close()
    await gw.released()  # the engine stream that opened late was closed too
    assert gw.metric("gateway_audiosocket_calls_total", reason="remote_closed") == 1


# --------------------------------------------------------------------------- watchdogs, stop


async def test_a_call_nobody_attaches_to_is_hung_up(make: Make) -> None:
    gw = await make(attach_timeout_s=0.2)
    peer, _leg = await gw.call()
    assert await peer.read_to_eof() == b"\x00\x00\x00"
    await gw.released()
    assert gw.metric("gateway_audiosocket_calls_total", reason="no_application") == 1


async def test_a_call_longer_than_the_maximum_is_hung_up(make: Make) -> None:
    gw = await make(attach_timeout_s=0.1, max_call_s=0.3)
    peer, leg = await gw.call()
    assert leg.call is not None
    leg.call.subscribers.add(Recorder())
    assert await peer.read_to_eof() == b"\x00\x00\x00"
    await gw.released()
    assert gw.metric("gateway_audiosocket_calls_total", reason="max_duration") == 1


async def test_stop_hangs_up_every_call_and_closes_waiting_connections(make: Make) -> None:
    gw = await make()
    peer, leg = await gw.call()
    waiting = await gw.connect()
    await eventually(lambda: gw.listener.connections == 2)
    stopping = asyncio.create_task(gw.listener.stop())
    assert await peer.read_to_eof() == b"\x00\x00\x00"
    assert await waiting.read_to_eof() == b""
    await stopping
    await gw.released()
    assert leg.session.state is SessionState.CLOSED
    assert gw.metric(REFUSED, reason="draining") == 1  # the one still before its UUID


async def test_a_peer_that_stops_reading_holds_the_pacer_back(make: Make) -> None:
    gw = await make()
    peer, leg = await gw.call()
    assert not leg.backlogged()
    leg.pause(True)  # the shared flow control still applies
    assert leg.backlogged()
    leg.pause(False)
    assert not leg.backlogged()
    for _ in range(100_000):  # until the socket's buffers are full and the transport keeps some
        leg.send_audio(bytes(320))
        if leg.backlogged():
            break
    assert leg.backlogged()
    drained = asyncio.create_task(peer.read_to_eof(timeout=10))
    await eventually(lambda: not leg.backlogged(), timeout=5)
    peer.close()
    await asyncio.wait([drained])
    await gw.released()
