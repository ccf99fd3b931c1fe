"""The native protocol v1, ``GET /v1/stream`` (design brief, section 3).

Two layers in this file:

- the wire codec, sans-I/O: :func:`decode_client_message` turns one text frame into a
  typed message or raises :class:`ProtocolViolation` with the exact error code;
  :func:`encode_event` turns a session event into the JSON text the peer receives;
- :class:`NativeConnection`, the thin asyncio layer: authenticate, upgrade, feed frames
  to the codec and the session, close with the right code.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Literal

import msgspec
from aiohttp import web

from gateway.auth import token_from_request
from gateway.calls import MAX_CALL_ID_CHARS, Call
from gateway.errors import CloseCode, ProtocolViolation, SessionError
from gateway.events import (
    BargeIn,
    CallEnded,
    CallStarted,
    Cleared,
    Dtmf,
    ErrorEvent,
    MarkReached,
    Ready,
    SessionEvent,
    UtteranceDone,
    UtteranceStarted,
)
from gateway.formats import FORMATS, INPUT_FORMATS
from gateway.protocols.base import Connection, serve
from gateway.session import Session, SessionState, StartOptions
from gateway.state import GatewayState
from gateway.wsframe import FrameWriter

log = logging.getLogger(__name__)
MAX_NAME_CHARS = 256


# --- wire codec (sans-I/O) ----------------------------------------------------------------


class _Msg(msgspec.Struct, tag_field="type", forbid_unknown_fields=False):
    pass


class StartMsg(_Msg, tag="start"):
    voice: str | None = None  # required unless ``call`` is given
    format: str | None = None
    language: str | None = None
    speed: float = 1.0
    pacing: Literal["realtime", "burst"] = "realtime"
    input_format: str | None = None
    barge_in: bool | None = None
    call: str | None = None  # attach to a telephony call instead of opening a stream


class SpeakMsg(_Msg, tag="speak"):
    text: str
    utterance_id: str | None = None
    flush: bool = True


class FlushMsg(_Msg, tag="flush"):
    utterance_id: str | None = None


class ClearMsg(_Msg, tag="clear"):
    pass


class MarkMsg(_Msg, tag="mark"):
    name: str


class CloseMsg(_Msg, tag="close"):
    pass


class HangupMsg(_Msg, tag="hangup"):
    pass


ClientMessage = StartMsg | SpeakMsg | FlushMsg | ClearMsg | MarkMsg | CloseMsg | HangupMsg
_BY_TYPE: dict[str, type[ClientMessage]] = {
    "start": StartMsg,
    "speak": SpeakMsg,
    "flush": FlushMsg,
    "clear": ClearMsg,
    "mark": MarkMsg,
    "close": CloseMsg,
    "hangup": HangupMsg,
}
_json_encoder = msgspec.json.Encoder()


def decode_client_message(data: str | bytes) -> ClientMessage:
    """Decode one client text frame.

    Raises :class:`ProtocolViolation` with code ``invalid_json`` (not JSON or not an
    object), ``unknown_type`` (missing or unknown ``type``) or ``invalid_message``
    (a field is missing or has the wrong type or range).
    """
    try:
        obj = msgspec.json.decode(data)
    except msgspec.DecodeError:
        raise ProtocolViolation("invalid_json", "message is not valid JSON") from None
    except RecursionError:
        raise ProtocolViolation("invalid_json", "message is nested too deeply") from None
    if not isinstance(obj, dict):
        raise ProtocolViolation("invalid_json", "message must be a JSON object")
    kind = obj.get("type")
    cls = _BY_TYPE.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolViolation("unknown_type", "missing or unknown message type")
    try:
        message = msgspec.convert(obj, cls)
    except msgspec.ValidationError as exc:
        raise ProtocolViolation("invalid_message", f"{kind}: {exc}") from None
    _check_ranges(message)
    return message


def _check_ranges(message: ClientMessage) -> None:
    if isinstance(message, StartMsg) and not 0.25 <= message.speed <= 4.0:
        raise ProtocolViolation("invalid_message", "start: speed must be between 0.25 and 4")
    if isinstance(message, StartMsg) and message.call is None and message.voice is None:
        raise ProtocolViolation("invalid_message", "start: voice is required (or call)")
    if isinstance(message, MarkMsg) and not 0 < len(message.name) <= MAX_NAME_CHARS:
        raise ProtocolViolation("invalid_message", "mark: name must be 1 to 256 characters")
    call = message.call if isinstance(message, StartMsg) else None
    if call is not None and not 0 < len(call) <= MAX_CALL_ID_CHARS:
        raise ProtocolViolation("invalid_message", "start: call must be 1 to 128 characters")
    utterance_id = getattr(message, "utterance_id", None)
    if utterance_id is not None and not 0 < len(utterance_id) <= MAX_NAME_CHARS:
        raise ProtocolViolation("invalid_message", "utterance_id must be 1 to 256 characters")


def encode_event(event: SessionEvent) -> str:
    """The JSON text of ``event`` (design brief, section 3, server to client)."""
    body: dict[str, object]
    if isinstance(event, Ready):
        body = {
            "type": "ready",
            "session_id": event.session_id,
            "format": event.format,
            "sample_rate": event.sample_rate,
            "frame_ms": event.frame_ms,
        }
    elif isinstance(event, UtteranceStarted):
        body = {"type": "utterance_started", "utterance_id": event.utterance_id}
    elif isinstance(event, UtteranceDone):
        body = {
            "type": "utterance_done",
            "utterance_id": event.utterance_id,
            "audio_ms": event.audio_ms,
            "first_audio_ms": event.first_audio_ms,
        }
    elif isinstance(event, MarkReached):
        body = {"type": "mark", "name": event.name, "cleared": event.cleared}
    elif isinstance(event, Cleared):
        body = {"type": "cleared"}
    elif isinstance(event, BargeIn):
        body = {"type": "barge_in"}
    elif isinstance(event, ErrorEvent):
        body = {"type": "error", "code": event.code, "message": event.message}
        if event.utterance_id is not None:
            body["utterance_id"] = event.utterance_id
        if event.retry_after_ms is not None:
            body["retry_after_ms"] = event.retry_after_ms
    elif isinstance(event, CallStarted):
        body = {
            "type": "call_started",
            "call_id": event.call_id,
            "protocol": event.protocol,
            "custom_parameters": event.custom_parameters,
        }
    elif isinstance(event, Dtmf):
        body = {"type": "dtmf", "digit": event.digit}
    elif isinstance(event, CallEnded):
        body = {"type": "call_ended", "call_id": event.call_id, "reason": event.reason}
    else:  # pragma: no cover - exhaustive
        raise TypeError(f"no wire form for {event!r}")
    return _json_encoder.encode(body).decode()


def start_options(message: StartMsg) -> StartOptions:
    """Validate ``start``; raises a fatal :class:`SessionError` for what cannot start.

    ``barge_in`` defaults to on when the session sends caller audio (``input_format``).
    """
    if message.voice is None:
        raise ProtocolViolation("invalid_message", "start: voice is required", CloseCode.POLICY)
    if message.format is None:
        raise ProtocolViolation("invalid_message", "start: format is required", CloseCode.POLICY)
    fmt = FORMATS.get(message.format)
    if fmt is None:
        raise SessionError(
            "unsupported_format", f"unknown format {message.format!r}", CloseCode.POLICY
        )
    input_fmt = None
    if message.input_format is not None:
        if message.input_format not in INPUT_FORMATS:
            raise SessionError(
                "unsupported_format",
                f"unknown input_format {message.input_format!r}",
                CloseCode.POLICY,
            )
        input_fmt = FORMATS[message.input_format]
    return StartOptions(
        voice=message.voice,
        format=fmt,
        language=message.language,
        speed=message.speed,
        pacing=message.pacing,
        input_format=input_fmt,
        barge_in=message.barge_in if message.barge_in is not None else input_fmt is not None,
    )


# --- asyncio layer ------------------------------------------------------------------------


class NativeConnection(Connection):
    """One ``/v1/stream`` WebSocket: the native codec over the shared connection base."""

    protocol = "native"

    def __init__(self, ws: web.WebSocketResponse, writer: FrameWriter, state: GatewayState) -> None:
        super().__init__(ws, writer, state)
        self.call: Call | None = None  # set when attached to a telephony call

    def credentials(self, request: web.Request) -> str | None:
        return token_from_request(request.headers, request.query)

    def refuse(self, error: SessionError) -> None:
        self._writer.send_text(encode_event(ErrorEvent(error.code, error.message)))

    # Peer
    def send_audio(self, frame: bytes) -> None:
        self._writer.send_binary(frame)

    def send_event(self, event: SessionEvent) -> None:
        self._writer.send_text(encode_event(event))

    # CallSubscriber
    def on_call_event(self, event: SessionEvent) -> None:
        self.send_event(event)
        if isinstance(event, CallEnded):
            self.session.finish(CloseCode.NORMAL, "call ended")

    @property
    def established(self) -> bool:
        """Started, or attached to a call (an attached app may stay quiet)."""
        return self.session.started or self.call is not None

    @property
    def target(self) -> Session:
        """The session commands act on: the call's when attached, else our own."""
        return self.call.session if self.call is not None else self.session

    async def on_release(self, reason: str) -> None:
        if self.call is not None:
            self.call.subscribers.discard(self)

    def _attach(self, call_id: str) -> None:
        assert self.principal is not None
        call = self._state.calls.get(call_id, self.principal.tenant)
        if call is None:
            raise SessionError("unknown_call", f"no call {call_id[:64]!r}", CloseCode.POLICY)
        self.call = call
        call.subscribers.add(self)
        session = call.session
        fmt = session.options.format if session.options else None
        self.send_event(
            Ready(session.id, fmt.name if fmt else "", fmt.sample_rate if fmt else 0, 20)
        )
        self.send_event(CallStarted(call.call_id, call.protocol, dict(call.custom_parameters)))
        log.info("session %s attached to call %s", self.session.id, call.call_id)

    async def on_text(self, text: str) -> None:
        await self._dispatch(decode_client_message(text))

    async def _dispatch(self, message: ClientMessage) -> None:
        own = self.session
        if isinstance(message, StartMsg):
            if own.state is not SessionState.AWAITING_START or self.call is not None:
                raise ProtocolViolation("already_started", "start was already received")
            if message.call is not None:
                self._attach(message.call)
            else:
                assert self.principal is not None
                options = start_options(message)
                voice, profile = await self._state.resolve_voice(
                    self.principal.tenant, options.voice
                )
                await own.start(replace(options, voice=voice, voice_profile=profile))
            return
        if isinstance(message, CloseMsg) and self.call is not None:
            own.finish(CloseCode.NORMAL, "detached")  # the call goes on without us
            return
        if isinstance(message, HangupMsg):
            if self.call is None:
                raise ProtocolViolation("not_attached", "hangup needs a call (start.call)")
            self.call.hangup()
            return
        session = self.target
        if not session.started and not isinstance(message, CloseMsg):
            if self.call is not None:
                raise SessionError("call_not_active", "the call is not active")
            raise ProtocolViolation("not_started", "send start first", CloseCode.POLICY)
        if isinstance(message, SpeakMsg):
            session.speak(message.text, message.utterance_id, flush=message.flush)
        elif isinstance(message, FlushMsg):
            session.flush(message.utterance_id)
        elif isinstance(message, ClearMsg):
            session.clear()
        elif isinstance(message, MarkMsg):
            session.mark(message.name)
        elif isinstance(message, CloseMsg):
            session.request_close()

    async def on_binary(self, data: bytes) -> None:
        if not self.session.started:
            raise ProtocolViolation("not_started", "binary before start", CloseCode.POLICY)
        self.session.feed_caller_audio(data)


async def handle_stream(request: web.Request) -> web.StreamResponse:
    return await serve(request, NativeConnection)
