"""EngineServer and EngineClient together, in-process, over a real Unix socket and a
real shared-memory region (in a temporary directory), with the synthetic backend."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from engine.backends.base import PcmChunk, VoiceSettings
from engine.backends.routing import BackendSet
from engine.backends.synthetic import CHAR_MS, SyntheticBackend
from engine.ipc.boundaries import BoundaryReader
from engine.ipc.client import EngineClient, EngineRejected, EngineStream, EngineUnavailable
from engine.ipc.schema import (
    PROTOCOL_VERSION,
    FrameDecoder,
    Hello,
    Message,
    OpenStream,
    Ping,
    ProtocolError,
    SpeechStarted,
    StreamClosed,
    StreamOpened,
    StreamRejected,
    UtteranceAudio,
    UtteranceEnd,
    UtteranceFailed,
    UtteranceWords,
    Welcome,
    encode,
)
from engine.ipc.shm import BOUNDARY_CAPACITY, SharedRegion, SlotArena
from engine.server import EngineLayout, EngineServer
from engine.text import SegmentSplitter

OUT_RING = 256 * 1024
IN_RING = 8 * 1024
WAIT_S = 5.0

# --------------------------------------------------------------------------- helpers


@dataclass
class Engine:
    server: EngineServer
    socket_path: str
    region: SharedRegion
    arena: SlotArena
    clients: list[EngineClient] = field(default_factory=list)

    async def connect(self, name: str = "test-gateway") -> EngineClient:
        client = await EngineClient.connect(self.socket_path, timeout=WAIT_S, client_name=name)
        self.clients.append(client)
        return client

    def drop_connections(self) -> None:
        """Close every control connection from the server's side."""
        for connection in list(self.server.connections):
            transport = connection._transport
            assert transport is not None
            transport.close()


StartEngine = Callable[..., Awaitable[Engine]]


def _socket_path(tmp_path: Path) -> tuple[str, str | None]:
    """A socket path under tmp_path, or in a short temp dir if that is too long."""
    path = str(tmp_path / "engine.sock")
    if len(path.encode()) < 100:
        return path, None
    short = tempfile.mkdtemp(prefix="eng")
    return os.path.join(short, "engine.sock"), short


@pytest.fixture
async def start_engine(tmp_path: Path) -> AsyncIterator[StartEngine]:
    engines: list[Engine] = []
    short_dirs: list[str] = []

    async def start(slots: int = 4, rtf: float = 0.0) -> Engine:
        size = SlotArena.region_size(slots, OUT_RING, IN_RING)
        name = f"test-engine-{os.getpid()}-{secrets.token_hex(4)}"
        region = SharedRegion.create(name, size, directory=str(tmp_path))
        arena = SlotArena(region, slots, OUT_RING, IN_RING)
        arena.reset_all()
        layout = EngineLayout(region, arena, slots, OUT_RING, IN_RING)
        backend = SyntheticBackend()
        backend.rtf = rtf  # seconds of compute per second of audio
        server = EngineServer(BackendSet([backend]), layout, vad_model_factory=LoudnessVad)
        socket_path, short = _socket_path(tmp_path)
        if short is not None:
            short_dirs.append(short)
        engine = Engine(server, socket_path, region, arena)
        engines.append(engine)
        await server.start(socket_path)
        return engine

    yield start

    for engine in engines:
        for client in engine.clients:
            await client.aclose()
        engine.drop_connections()
        await engine.server.stop()
        await asyncio.sleep(0)  # let connection_lost callbacks run
        engine.arena.close()
        engine.region.close()
        engine.region.unlink()
        with contextlib.suppress(OSError):
            os.unlink(engine.socket_path)
    for short in short_dirs:
        with contextlib.suppress(OSError):
            os.rmdir(short)


class LoudnessVad:
    """A stand-in VAD model: a window is speech when it is loud (tests the wiring)."""

    def step(self, windows: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rms = np.sqrt((windows[:, 32:] ** 2).mean(axis=1))
        return (rms > 0.05).astype(np.float32), state


@dataclass
class Listener:
    audio: list[UtteranceAudio] = field(default_factory=list)
    ends: list[UtteranceEnd] = field(default_factory=list)
    failures: list[UtteranceFailed] = field(default_factory=list)
    speech: list[SpeechStarted] = field(default_factory=list)
    words: list[UtteranceWords] = field(default_factory=list)
    lost: int = 0

    def on_speech_started(self, event: SpeechStarted) -> None:
        self.speech.append(event)

    def on_utterance_audio(self, event: UtteranceAudio) -> None:
        self.audio.append(event)

    def on_utterance_words(self, event: UtteranceWords) -> None:
        self.words.append(event)

    def on_utterance_end(self, event: UtteranceEnd) -> None:
        self.ends.append(event)

    def on_utterance_failed(self, event: UtteranceFailed) -> None:
        self.failures.append(event)

    def on_engine_lost(self) -> None:
        self.lost += 1


async def until(condition: Callable[[], object], timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)


def expected_pcm(text: str, voice: str = "en-us") -> bytes:
    backend = SyntheticBackend()
    handle = backend.resolve_voice(VoiceSettings(voice))
    splitter = SegmentSplitter(language="und")  # the synthetic voices' language
    chunks: list[bytes] = []

    def emit(chunk: PcmChunk) -> bool:
        chunks.append(chunk.tobytes())
        return True

    for segment in splitter.feed(text) + splitter.flush():
        backend.synthesize(segment, handle, emit)
    return b"".join(chunks)


async def open_stream(
    client: EngineClient, listener: Listener | None = None, **kwargs: object
) -> EngineStream:
    params: dict[str, object] = {"voice": "en-us", "sample_rate": 16000}
    params.update(kwargs)
    return await client.open_stream(
        listener=Listener() if listener is None else listener,
        **params,  # type: ignore[arg-type]
    )


class RawPeer:
    """A bare control connection, to speak the protocol without EngineClient."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = FrameDecoder("from_engine")
        self.received: list[Message] = []

    @classmethod
    async def connect(cls, socket_path: str) -> RawPeer:
        reader, writer = await asyncio.open_unix_connection(socket_path)
        return cls(reader, writer)

    def send(self, message: Message) -> None:
        self.writer.write(encode(message))

    async def receive(self, count: int = 1) -> list[Message]:
        async with asyncio.timeout(WAIT_S):
            while len(self.received) < count:
                data = await self.reader.read(65536)
                if not data:
                    break
                self.received += self.decoder.feed(data)
        out, self.received = self.received[:count], self.received[count:]
        return out

    async def closed_by_peer(self) -> bool:
        async with asyncio.timeout(WAIT_S):
            while True:
                data = await self.reader.read(65536)
                if not data:
                    return True
                self.received += self.decoder.feed(data)

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


# ---------------------------------------------------------------------------- welcome


async def test_welcome(start_engine, tmp_path):
    engine = await start_engine(slots=3)
    client = await engine.connect()
    welcome = client.welcome
    assert isinstance(welcome, Welcome)
    assert welcome.protocol_version == PROTOCOL_VERSION
    assert welcome.engine_pid == os.getpid()
    assert welcome.backend == "synthetic"
    assert welcome.shm_name == engine.region.name
    assert welcome.shm_directory == str(tmp_path)
    assert welcome.slots == 3
    assert welcome.out_ring_bytes == OUT_RING
    assert welcome.in_ring_bytes == IN_RING
    assert welcome.native_sample_rate == SyntheticBackend.native_sample_rate
    assert welcome.max_text_chars == SyntheticBackend.max_text_chars
    assert {v.id for v in welcome.voices} == {"en-us", "zh", "yue", "tone"}
    assert all(v.backend == "synthetic" for v in welcome.voices)
    assert client.region is not None
    assert client.region.size == engine.region.size


async def test_socket_is_private(start_engine):
    engine = await start_engine()
    assert os.stat(engine.socket_path).st_mode & 0o777 == 0o600


# ----------------------------------------------------------------------------- streams


async def test_open_stream_returns_slot_and_rings(start_engine):
    engine = await start_engine(slots=4)
    client = await engine.connect()
    first = await open_stream(client)
    second = await open_stream(client, voice="zh", sample_rate=8000)
    assert first.slot != second.slot
    assert {first.slot, second.slot} <= set(range(4))
    assert first.stream_id != second.stream_id
    assert client.streams == {first.stream_id: first, second.stream_id: second}
    assert first.outbound.capacity == OUT_RING
    assert first.inbound.capacity == IN_RING
    assert first.boundaries.capacity == BOUNDARY_CAPACITY
    assert first.outbound.write_pos == 0
    # The client's rings are views of the engine's slots.
    engine.arena.inbound(first.slot).write(b"caller audio")
    assert first.inbound.read(100) == b"caller audio"
    assert engine.server.pool.in_use == 2


async def test_speak(start_engine):
    engine = await start_engine()
    client = await engine.connect()
    listener = Listener()
    stream = await open_stream(client, listener)
    text = "Hello there, welcome to the test."
    stream.speak(1, text, final=True)
    await until(lambda: listener.ends)

    (end,) = listener.ends
    assert listener.audio == [UtteranceAudio(stream_id=stream.stream_id, utterance=1, start_pos=0)]
    assert end.utterance == 1
    assert end.start_pos == 0
    assert end.end_pos == 2 * end.samples
    assert stream.outbound.readable_bytes() == end.end_pos
    assert stream.outbound.read(end.end_pos) == expected_pcm(text)
    assert BoundaryReader(stream.boundaries).drain() == [(1, end.end_pos)]
    assert listener.failures == []


async def test_speak_in_pieces_and_resampled(start_engine):
    engine = await start_engine()
    client = await engine.connect()
    listener = Listener()
    stream = await open_stream(client, listener, sample_rate=8000)
    stream.speak(1, "Hello there. ", final=False)
    await until(lambda: listener.audio)
    stream.speak(1, "How are you?", final=False)
    stream.speak(1, "", final=True)
    await until(lambda: listener.ends)
    (end,) = listener.ends
    chars = len("Hello there.") + len("How are you?")
    assert abs(end.samples - chars * CHAR_MS / 1000 * 8000) <= 2
    assert stream.outbound.readable_bytes() == 2 * end.samples


async def test_two_clients_are_independent(start_engine):
    engine = await start_engine()
    client_a = await engine.connect("a")
    client_b = await engine.connect("b")
    listener_a, listener_b = Listener(), Listener()
    stream_a = await open_stream(client_a, listener_a)
    stream_b = await open_stream(client_b, listener_b)
    assert stream_a.slot != stream_b.slot
    stream_a.speak(1, "For A.", final=True)
    stream_b.speak(1, "For B, a bit longer.", final=True)
    await until(lambda: listener_a.ends and listener_b.ends)
    assert stream_a.outbound.read(1 << 20) == expected_pcm("For A.")
    assert stream_b.outbound.read(1 << 20) == expected_pcm("For B, a bit longer.")


async def test_cancel(start_engine):
    engine = await start_engine(rtf=0.02)
    client = await engine.connect()
    listener = Listener()
    stream = await open_stream(client, listener)
    stream.speak(1, "Hello. " * 20, final=True)
    await until(lambda: listener.audio)
    write_pos = await stream.request_cancel()
    assert write_pos > 0
    await asyncio.sleep(0.05)
    assert stream.outbound.write_pos == write_pos
    assert listener.ends == []


async def test_close_stream_frees_its_slot(start_engine):
    engine = await start_engine()
    client = await engine.connect()
    stream = await open_stream(client)
    assert engine.server.pool.in_use == 1
    await stream.close()
    assert stream.closed
    assert stream.stream_id not in client.streams
    assert engine.server.pool.in_use == 0
    await stream.close()  # idempotent


async def test_ping(start_engine):
    engine = await start_engine()
    client = await engine.connect()
    pong = await client.ping(timeout=WAIT_S)
    assert pong.seq >= 1
    assert pong.active_streams == 0
    assert pong.queued_utterances == 0
    assert pong.rss_bytes > 0
    assert client.last_pong == pong

    await open_stream(client)
    for _ in range(200):
        pong = await client.ping(timeout=WAIT_S)
        if pong.active_streams == 1:
            break
        await asyncio.sleep(0.005)
    assert pong.active_streams == 1
    second = await client.ping(timeout=WAIT_S)
    assert second.seq > pong.seq


# ------------------------------------------------------------------------ rejections


async def test_slot_pool_exhaustion_and_reuse(start_engine):
    engine = await start_engine(slots=2)
    client = await engine.connect()
    first = await open_stream(client)
    second = await open_stream(client)
    with pytest.raises(EngineRejected) as info:
        await open_stream(client)
    assert info.value.code == "overloaded"
    assert engine.server.pool.in_use == 2

    freed = first.slot
    await first.close()
    listener = Listener()
    third = await open_stream(client, listener)
    assert third.slot == freed
    # The reused slot works: fresh ring positions, audio arrives.
    assert third.outbound.write_pos == 0
    third.speak(1, "Reused slot.", final=True)
    await until(lambda: listener.ends)
    assert third.outbound.read(1 << 20) == expected_pcm("Reused slot.")
    assert second.slot != third.slot


async def test_unknown_voice(start_engine):
    engine = await start_engine()
    client = await engine.connect()
    with pytest.raises(EngineRejected) as info:
        await open_stream(client, voice="klingon")
    assert info.value.code == "unknown_voice"
    assert engine.server.pool.in_use == 0


@pytest.mark.parametrize("rate", [11025, 0, 96000])
async def test_unsupported_sample_rate(start_engine, rate):
    engine = await start_engine()
    client = await engine.connect()
    with pytest.raises(EngineRejected) as info:
        await open_stream(client, sample_rate=rate)
    assert info.value.code == "unsupported_format"
    assert engine.server.pool.in_use == 0


async def test_invalid_speed(start_engine):
    engine = await start_engine()
    client = await engine.connect()
    with pytest.raises(EngineRejected) as info:
        await open_stream(client, speed=10.0)
    assert info.value.code == "invalid_speed"


async def test_duplicate_stream_id_is_rejected(start_engine):
    engine = await start_engine()
    peer = await RawPeer.connect(engine.socket_path)
    peer.send(Hello(protocol_version=PROTOCOL_VERSION, client="raw"))
    (welcome,) = await peer.receive()
    assert isinstance(welcome, Welcome)
    peer.send(OpenStream(stream_id=1, voice="en-us", sample_rate=16000))
    peer.send(OpenStream(stream_id=1, voice="en-us", sample_rate=16000))
    opened, rejected = await peer.receive(2)
    assert isinstance(opened, StreamOpened)
    assert isinstance(rejected, StreamRejected)
    assert rejected.code == "protocol_error"
    assert engine.server.pool.in_use == 1
    await peer.close()
    await until(lambda: engine.server.pool.in_use == 0)


# ----------------------------------------------------------------- connection handling


async def test_closing_the_connection_frees_its_slots(start_engine):
    engine = await start_engine(slots=2)
    client = await engine.connect()
    await open_stream(client)
    await open_stream(client)
    assert engine.server.pool.in_use == 2
    await client.aclose()
    assert client.lost
    await until(lambda: engine.server.pool.in_use == 0)

    again = await engine.connect()
    listeners = [Listener(), Listener()]
    streams = [await open_stream(again, listener) for listener in listeners]
    assert sorted(s.slot for s in streams) == [0, 1]
    for stream in streams:
        stream.speak(1, "Back again.", final=True)
    await until(lambda: all(listener.ends for listener in listeners))


async def test_message_before_hello_closes_the_connection(start_engine):
    engine = await start_engine()
    peer = await RawPeer.connect(engine.socket_path)
    peer.send(Ping(seq=1))
    (error,) = await peer.receive()
    assert error == ProtocolError(message="Hello expected first")
    assert await peer.closed_by_peer()
    await peer.close()
    # The server keeps serving others.
    client = await engine.connect()
    assert client.welcome is not None


async def test_open_stream_before_hello_is_refused(start_engine):
    engine = await start_engine()
    peer = await RawPeer.connect(engine.socket_path)
    peer.send(OpenStream(stream_id=1, voice="en-us", sample_rate=16000))
    (error,) = await peer.receive()
    assert isinstance(error, ProtocolError)
    assert await peer.closed_by_peer()
    await peer.close()
    assert engine.server.pool.in_use == 0


async def test_wrong_protocol_version_closes_the_connection(start_engine):
    engine = await start_engine()
    peer = await RawPeer.connect(engine.socket_path)
    peer.send(Hello(protocol_version=PROTOCOL_VERSION + 1, client="future"))
    (error,) = await peer.receive()
    assert isinstance(error, ProtocolError)
    assert "version" in error.message
    assert await peer.closed_by_peer()
    await peer.close()


async def test_garbage_closes_the_connection(start_engine):
    engine = await start_engine()
    peer = await RawPeer.connect(engine.socket_path)
    peer.writer.write(b"\x00\x00\x00\x03\xc1\xc1\xc1")
    (error,) = await peer.receive()
    assert isinstance(error, ProtocolError)
    assert await peer.closed_by_peer()
    await peer.close()


async def test_engine_to_gateway_message_is_refused(start_engine):
    engine = await start_engine()
    peer = await RawPeer.connect(engine.socket_path)
    peer.send(Hello(protocol_version=PROTOCOL_VERSION, client="raw"))
    await peer.receive()
    peer.send(StreamClosed(stream_id=1))
    (error,) = await peer.receive()
    assert isinstance(error, ProtocolError)
    assert await peer.closed_by_peer()
    await peer.close()


async def test_server_side_close_reaches_the_streams(start_engine):
    engine = await start_engine()
    client = await engine.connect()
    listeners = [Listener(), Listener()]
    streams = [await open_stream(client, listener) for listener in listeners]
    pending_cancel = asyncio.ensure_future(streams[0].request_cancel(timeout=WAIT_S))
    await asyncio.sleep(0)  # the Cancel is sent; its answer never comes
    engine.drop_connections()

    with pytest.raises(EngineUnavailable):
        await pending_cancel
    await asyncio.wait_for(asyncio.shield(client.closed), WAIT_S)
    assert client.lost
    assert [listener.lost for listener in listeners] == [1, 1]
    assert all(stream.closed for stream in streams)
    assert client.streams == {}
    with pytest.raises(EngineUnavailable):
        client.send(Ping(seq=99))
    with pytest.raises(EngineUnavailable):
        await open_stream(client)
    with pytest.raises(EngineUnavailable):
        await client.ping(timeout=1.0)
    await streams[1].close()  # harmless after the loss
    # The engine freed the slots of the dropped connection.
    await until(lambda: engine.server.pool.in_use == 0)


async def test_connect_to_missing_socket(tmp_path):
    with pytest.raises(OSError):
        await EngineClient.connect(str(tmp_path / "nobody.sock"), timeout=1.0)


async def test_duplex_stream_reports_caller_speech_and_frees_its_slot(start_engine):
    engine = await start_engine(slots=2)
    client = await engine.connect()
    listener = Listener()
    stream = await open_stream(client, listener, input_sample_rate=8000)
    loud = (np.sin(np.arange(8000) / 3) * 12000).astype("<i2").tobytes()
    quiet = bytes(16000)
    for chunk in (quiet, loud, quiet, quiet, loud, quiet):  # 1 s each, four times real time
        for i in range(0, len(chunk), 320):
            assert stream.inbound.write(chunk[i : i + 320]) == 320
            await asyncio.sleep(0.005)
    await until(lambda: len(listener.speech) >= 2, timeout=10)
    first, second = listener.speech[:2]  # the end of the first re-armed the detector
    assert 1000 <= first.audio_ms <= 1200  # three 32 ms windows after the onset
    assert 4000 <= second.audio_ms <= 4200
    await stream.close()
    await until(lambda: engine.server.pool.in_use == 0)  # VAD and scheduler let go
    again = [await open_stream(client) for _ in range(2)]
    assert sorted(s.slot for s in again) == [0, 1]


async def test_a_stream_opened_for_a_caller_that_left_is_closed(start_engine):
    """An OpenStream whose caller was cancelled (or timed out) before StreamOpened came back
    must not keep its slot: the client closes what nobody waits for."""
    engine = await start_engine(slots=2)
    client = await engine.connect()
    for _ in range(3):
        opening = asyncio.ensure_future(open_stream(client))
        await asyncio.sleep(0)  # OpenStream is on its way
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
    await until(lambda: engine.server.pool.in_use == 0)
    streams = [await open_stream(client) for _ in range(2)]  # both slots are free again
    assert sorted(s.slot for s in streams) == [0, 1]
