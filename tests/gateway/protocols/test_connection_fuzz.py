"""Fuzz the shared connection lifecycle (gateway/protocols/base.py) with every protocol.

Hypothesis drives a whole connection (native, Twilio or Asterisk) with random frames:
well-formed commands, JSON of every shape, deep nesting, random text and bytes, and
messages that make a handler raise an unexpected exception. Whatever arrives, when the
connection ends:

- only documented error codes reached the peer, and it was closed with a documented code
  (1011 when a handler raised something unexpected);
- the session is closed and released everything: engine stream closed, tenant lease
  released, no pacer entry, no admission ticket, no call in the registry, no live
  session, ``gateway_sessions_active`` back to 0.

The engine, the WebSocket and the transport are fakes; the session, pacer, admission
gate, tenant leases, call registry, token verifier and wire codecs are the real ones.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import WSMessage, WSMsgType
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.auth import AuthSettings, mint_token
from gateway.config import GatewaySettings
from gateway.errors import CloseCode
from gateway.legs.websocket.asterisk import AsteriskLeg
from gateway.legs.websocket.twilio import TwilioLeg
from gateway.protocols.base import Connection
from gateway.protocols.native import NativeConnection
from gateway.session import Session, SessionState
from gateway.state import GatewayState
from gateway.voices.store import FileVoiceStore
from gateway.wsframe import FrameWriter
from tests.gateway.fake_engine_stream import FakeStream

SECRET = "connection-fuzz-secret-0123456789abcdefghij"
BOOM = "__boom__"  # text that makes the session's speak() raise an unexpected error

#: Every error code a peer may see (docs/protocol.md); vendor-core codes are prefixed.
DOCUMENTED = {
    "invalid_json", "unknown_type", "invalid_message", "not_started", "already_started",
    "unsupported_format", "unknown_voice", "text_too_long", "queue_full", "closing",
    "too_many_errors", "internal_error", "overloaded", "unexpected_binary", "invalid_audio",
    "not_attached", "unknown_call", "call_not_active", "start_timeout", "token_expired",
    "token_missing", "token_invalid", "token_malformed", "token_claims", "insufficient_scope",
    "engine_unavailable", "queue_timeout", "call_id_in_use", "shutting_down",
    "mark_backlog_full", "message_too_big",
}  # fmt: skip
CLOSE_CODES = {int(c) for c in CloseCode}


# --------------------------------------------------------------------------- fakes


class FakeTransport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 0


class FakeWebSocket:
    """Hands out ``frames`` one by one, then a CLOSE."""

    def __init__(self, frames: list[WSMessage]) -> None:
        self._frames = list(frames)
        self.closed = False
        self.close_code: int | None = None

    async def receive(self, timeout: float | None = None) -> WSMessage:
        await asyncio.sleep(0)
        if self._frames and not self.closed:
            return self._frames.pop(0)
        return WSMessage(WSMsgType.CLOSE, 1000, None)

    async def close(self, *, code: int = 1000, message: bytes = b"") -> bool:
        if not self.closed:
            self.closed = True
            self.close_code = code
        return True


class FakeEngine:
    lost = False

    def __init__(self) -> None:
        self.streams: list[FakeStream] = []

    async def open_stream(self, **kwargs: Any) -> FakeStream:
        stream = FakeStream()
        self.streams.append(stream)
        return stream


class FakeSupervisor:
    def __init__(self, engine: FakeEngine) -> None:
        self.client = engine


class FakeRequest:
    def __init__(self, query: dict[str, str]) -> None:
        self.query = query
        self.headers: dict[str, str] = {}


def make_state(tmp: Path) -> tuple[GatewayState, FakeEngine]:
    auth = AuthSettings(secret=SECRET, public_key_path=None, audience=None, issuer=None)
    gateway_settings = GatewaySettings(auth=auth, max_protocol_errors=5, start_timeout_s=5)
    engine = FakeEngine()
    state = GatewayState.create(
        gateway_settings,
        supervisor=FakeSupervisor(engine),  # type: ignore[arg-type]
        store=FileVoiceStore(tmp),
    )
    return state, engine


# --------------------------------------------------------------------------- inputs

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
native_commands = st.one_of(
    st.builds(
        lambda v, f, i: {"type": "start", "voice": v, "format": f, **i},
        st.sampled_from(["en-us", "zh", "klingon", "vc_0123456789abcdef", ""]),
        st.sampled_from(["mulaw_8000", "pcm_16000", "opus_48000", "mp3"]),
        st.sampled_from([{}, {"input_format": "pcm_16000"}, {"call": "CA1"}, {"speed": 9}]),
    ),
    st.builds(
        lambda t, u, f: {"type": "speak", "text": t, "utterance_id": u, "flush": f},
        st.text(max_size=30) | st.just(BOOM) | st.just("x" * 2100),
        st.none() | st.text(max_size=5),
        st.booleans(),
    ),
    st.sampled_from(
        [
            {"type": "flush"},
            {"type": "clear"},
            {"type": "close"},
            {"type": "hangup"},
            {"type": "mark", "name": "m"},
            {"type": "mark", "name": ""},
            {"type": "dance"},
        ]
    ),
    st.dictionaries(st.sampled_from(["type", "text", "voice", "name"]), json_values, max_size=3),
)


def twilio_message(kind: str, n: int) -> dict[str, Any]:
    sid = "MZ" + "0" * 32
    base: dict[str, Any] = {"event": kind, "sequenceNumber": str(n), "streamSid": sid}
    if kind == "connected":
        return {"event": "connected", "protocol": "Call", "version": "1.0.0"}
    if kind == "start":
        base["start"] = {
            "streamSid": sid,
            "accountSid": "AC1",
            "callSid": "CA1",
            "tracks": ["inbound"],
            "customParameters": {"token": "{token}"},
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        }
    elif kind == "media":
        base["media"] = {"track": "inbound", "chunk": str(n), "timestamp": str(20 * n),
                         "payload": base64.b64encode(b"\xff" * 160).decode()}  # fmt: skip
    elif kind == "mark":
        base["mark"] = {"name": "m1"}
    elif kind == "dtmf":
        base["dtmf"] = {"track": "inbound_track", "digit": "5"}
    return base


twilio_commands = st.builds(
    twilio_message,
    st.sampled_from(["connected", "start", "media", "mark", "dtmf", "stop", "bogus"]),
    st.integers(1, 50),
)
asterisk_commands = st.sampled_from(
    [
        "MEDIA_START connection_id:c1 channel:WebSocket/x channel_id:ch1 format:ulaw "
        "optimal_frame_size:160 ptime:20",
        "DTMF_END digit:5 channel_id:ch1",
        "MEDIA_XOFF channel_id:ch1",
        "MEDIA_XON channel_id:ch1",
        "MEDIA_MARK_PROCESSED correlation_id:m1 channel_id:ch1",
        "HANGUP",
        "BOGUS",
    ]
)
noise_text = st.text(max_size=40) | st.just("[" * 3000 + "]" * 3000) | st.just("{" * 2000)


def frames_for(
    commands: st.SearchStrategy[Any], prelude: list[str]
) -> st.SearchStrategy[list[WSMessage]]:
    """Random frames, most often after ``prelude`` (a valid start), so that the fuzzing
    reaches established sessions and not only the start phase."""
    text = (commands.map(json.dumps) if commands is not asterisk_commands else commands) | (
        noise_text
    )
    frame = st.one_of(
        text.map(lambda t: WSMessage(WSMsgType.TEXT, t, None)),
        st.binary(max_size=400).map(lambda b: WSMessage(WSMsgType.BINARY, b, None)),
        st.just(WSMessage(WSMsgType.ERROR, ValueError("bad frame"), None)),
    )
    start = [WSMessage(WSMsgType.TEXT, t, None) for t in prelude]
    return st.tuples(st.integers(0, 3), st.lists(frame, max_size=25)).map(
        lambda pair: (start if pair[0] else []) + pair[1]
    )


NATIVE_START = [json.dumps({"type": "start", "voice": "en-us", "format": "mulaw_8000",
                            "input_format": "mulaw_8000"})]  # fmt: skip
TWILIO_START = [json.dumps(twilio_message("connected", 0)), json.dumps(twilio_message("start", 1))]
ASTERISK_START = [
    "MEDIA_START connection_id:c1 channel:WebSocket/x channel_id:ch1 format:ulaw "
    "optimal_frame_size:160 ptime:20"
]


# --------------------------------------------------------------------------- the property


async def drive(
    tmp: Path,
    connection: Callable[..., Connection],
    frames: list[WSMessage],
    *,
    authenticate: bool,
) -> None:
    state, engine = make_state(tmp)
    token = mint_token(secret=SECRET, subject="fuzz", tenant="t")
    frames = [
        WSMessage(m.type, m.data.replace("{token}", token), None)
        if m.type is WSMsgType.TEXT and isinstance(m.data, str)
        else m
        for m in frames
    ]
    transport = FakeTransport()
    ws = FakeWebSocket(frames)
    conn = connection(ws, FrameWriter(transport), state)  # type: ignore[arg-type]
    original_speak = Session.speak

    def speak(self: Session, text: str, *args: Any, **kwargs: Any) -> str:
        if text == BOOM:
            raise RuntimeError("an unexpected bug in a handler")
        return original_speak(self, text, *args, **kwargs)

    conn.session.speak = speak.__get__(conn.session)  # type: ignore[method-assign]
    if authenticate:
        conn.authenticate(token)
    async with asyncio.timeout(10):
        await conn.run()
    await state.connections.close()

    session = conn.session
    assert session.state is SessionState.CLOSED
    assert all(stream.closed >= 1 for stream in engine.streams)
    assert state.limits.leases.local_count("t") == 0
    assert state.limits.held == 0
    assert state.pacer.active_count == 0
    assert state.gate.controller.in_flight == 0 and state.gate.controller.queue_length == 0
    assert len(state.calls) == 0
    assert not state.connections.live
    assert state.metrics.sessions_active.labels(protocol=conn.protocol)._value.get() == 0
    codes = [json.loads(f[2:] if f[1] < 126 else f[4:])["code"] for f in transport.written
             if f[0] == 0x81 and b'"type":"error"' in f]  # fmt: skip
    assert set(codes) <= DOCUMENTED | {c for c in codes if c.startswith(("twilio_", "asterisk_"))}
    if ws.close_code is not None:
        assert ws.close_code in CLOSE_CODES


FUZZ = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@FUZZ
@given(frames=frames_for(native_commands, NATIVE_START))
def test_native_connection_always_releases(tmp_path: Path, frames: list[WSMessage]) -> None:
    asyncio.run(drive(tmp_path, NativeConnection, frames, authenticate=True))


@FUZZ
@given(frames=frames_for(twilio_commands, TWILIO_START))
def test_twilio_leg_always_releases(tmp_path: Path, frames: list[WSMessage]) -> None:
    def leg(*args: Any) -> TwilioLeg:
        return TwilioLeg(*args, request=FakeRequest({}))

    asyncio.run(drive(tmp_path, leg, frames, authenticate=False))


@FUZZ
@given(frames=frames_for(asterisk_commands, ASTERISK_START))
def test_asterisk_leg_always_releases(tmp_path: Path, frames: list[WSMessage]) -> None:
    def leg(*args: Any) -> AsteriskLeg:
        return AsteriskLeg(*args, request=FakeRequest({"say": "Hello."}))

    asyncio.run(drive(tmp_path, leg, frames, authenticate=True))


@pytest.mark.parametrize("extra", [[], [{"type": "speak", "text": "hello"}]])
async def test_native_boom_is_internal_error(tmp_path: Path, extra: list[dict[str, Any]]) -> None:
    state, engine = make_state(tmp_path)
    token = mint_token(secret=SECRET, subject="fuzz", tenant="t")
    messages = [{"type": "start", "voice": "en-us", "format": "mulaw_8000"}, *extra]
    frames = [WSMessage(WSMsgType.TEXT, json.dumps(m), None) for m in messages]
    frames.append(WSMessage(WSMsgType.TEXT, json.dumps({"type": "speak", "text": BOOM}), None))
    transport = FakeTransport()
    ws = FakeWebSocket(frames)
    conn = NativeConnection(ws, FrameWriter(transport), state)  # type: ignore[arg-type]
    original = conn.session.speak

    def speak(text: str, *args: Any, **kwargs: Any) -> str:
        if text == BOOM:
            raise RuntimeError("bug")
        return original(text, *args, **kwargs)

    conn.session.speak = speak  # type: ignore[method-assign]
    conn.authenticate(token)
    await conn.run()
    assert ws.close_code == CloseCode.INTERNAL_ERROR
    assert engine.streams and engine.streams[0].closed == 1
    assert state.limits.leases.local_count("t") == 0
    sent = b"".join(transport.written)
    assert b'"code":"internal_error"' in sent and b"RuntimeError" not in sent
