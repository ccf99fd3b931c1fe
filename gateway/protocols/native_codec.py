"""The native protocol v1's wire codec, sans-I/O (design brief, section 3).

:func:`decode_client_message` turns one client text frame into a typed message or raises
:class:`ProtocolViolation` with the exact error code; :func:`encode_event` turns a session
event into the JSON text the peer receives; :func:`start_options` validates ``start``.
No I/O and no event loop: tested byte for byte in tests/gateway/protocols/.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from engine.ipc.schema import MAX_INSTRUCT_CHARS
from gateway.calls import MAX_CALL_ID_CHARS
from gateway.errors import CloseCode, ErrorCode, ProtocolViolation, SessionError
from gateway.events import (
    BargeIn,
    CallEnded,
    CallStarted,
    Cleared,
    Dtmf,
    ErrorEvent,
    Flushed,
    MarkReached,
    Played,
    Ready,
    SessionEvent,
    UtteranceDone,
    UtteranceStarted,
    Words,
)
from gateway.formats import FORMATS, INPUT_FORMATS
from gateway.session import DEFAULT_MAX_BUFFER_DELAY_MS, StartOptions

MAX_NAME_CHARS = 256
MAX_BUFFER_DELAY_MS = 5000


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
    max_buffer_delay_ms: int | None = None
    timestamps: Literal["word"] | None = None
    instruct: str | None = None  # a style instruction for backends that follow one
    cache: bool | None = None  # false: the speech cache keeps none of the session's speech


class SpeakMsg(_Msg, tag="speak"):
    text: str
    utterance_id: str | None = None
    flush: bool = True
    instruct: str | None = None  # this utterance's own style instruction (a new one only)
    cache: bool | None = None  # false: the speech cache keeps none of it (a new one only)


class FlushMsg(_Msg, tag="flush"):
    utterance_id: str | None = None
    flush_id: str | None = None


class CancelMsg(_Msg, tag="cancel"):
    utterance_id: str


class KeepaliveMsg(_Msg, tag="keepalive"):
    pass


class ClearMsg(_Msg, tag="clear"):
    pass


class MarkMsg(_Msg, tag="mark"):
    name: str


class CloseMsg(_Msg, tag="close"):
    pass


class HangupMsg(_Msg, tag="hangup"):
    pass


ClientMessage = (
    StartMsg
    | SpeakMsg
    | FlushMsg
    | CancelMsg
    | KeepaliveMsg
    | ClearMsg
    | MarkMsg
    | CloseMsg
    | HangupMsg
)
_BY_TYPE: dict[str, type[ClientMessage]] = {
    "start": StartMsg,
    "speak": SpeakMsg,
    "flush": FlushMsg,
    "cancel": CancelMsg,
    "keepalive": KeepaliveMsg,
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
        raise ProtocolViolation(ErrorCode.INVALID_JSON, "message is not valid JSON") from None
    except RecursionError:
        raise ProtocolViolation(ErrorCode.INVALID_JSON, "message is nested too deeply") from None
    if not isinstance(obj, dict):
        raise ProtocolViolation(ErrorCode.INVALID_JSON, "message must be a JSON object")
    kind = obj.get("type")
    cls = _BY_TYPE.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolViolation(ErrorCode.UNKNOWN_TYPE, "missing or unknown message type")
    try:
        message = msgspec.convert(obj, cls)
    except msgspec.ValidationError as exc:
        raise ProtocolViolation(ErrorCode.INVALID_MESSAGE, f"{kind}: {exc}") from None
    _check_ranges(message)
    return message


def _check_ranges(message: ClientMessage) -> None:
    if isinstance(message, StartMsg) and not 0.25 <= message.speed <= 4.0:
        raise ProtocolViolation(
            ErrorCode.INVALID_MESSAGE, "start: speed must be between 0.25 and 4"
        )
    delay = message.max_buffer_delay_ms if isinstance(message, StartMsg) else None
    if delay is not None and not 0 <= delay <= MAX_BUFFER_DELAY_MS:
        raise ProtocolViolation(
            ErrorCode.INVALID_MESSAGE,
            f"start: max_buffer_delay_ms must be from 0 to {MAX_BUFFER_DELAY_MS}",
        )
    if isinstance(message, StartMsg) and message.call is None and message.voice is None:
        raise ProtocolViolation(ErrorCode.INVALID_MESSAGE, "start: voice is required (or call)")
    if isinstance(message, MarkMsg) and not 0 < len(message.name) <= MAX_NAME_CHARS:
        raise ProtocolViolation(ErrorCode.INVALID_MESSAGE, "mark: name must be 1 to 256 characters")
    call = message.call if isinstance(message, StartMsg) else None
    if call is not None and not 0 < len(call) <= MAX_CALL_ID_CHARS:
        raise ProtocolViolation(
            ErrorCode.INVALID_MESSAGE, "start: call must be 1 to 128 characters"
        )
    utterance_id = (
        message.utterance_id if isinstance(message, SpeakMsg | FlushMsg | CancelMsg) else None
    )
    if utterance_id is not None and not 0 < len(utterance_id) <= MAX_NAME_CHARS:
        raise ProtocolViolation(
            ErrorCode.INVALID_MESSAGE, "utterance_id must be 1 to 256 characters"
        )
    flush_id = message.flush_id if isinstance(message, FlushMsg) else None
    if flush_id is not None and not 0 < len(flush_id) <= MAX_NAME_CHARS:
        raise ProtocolViolation(ErrorCode.INVALID_MESSAGE, "flush_id must be 1 to 256 characters")
    instruct = message.instruct if isinstance(message, StartMsg | SpeakMsg) else None
    if instruct is not None and len(instruct) > MAX_INSTRUCT_CHARS:
        raise ProtocolViolation(
            ErrorCode.INVALID_MESSAGE, f"instruct over {MAX_INSTRUCT_CHARS} characters"
        )


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
        if event.cancelled:
            body["cancelled"] = True
        _add_played(body, event.played)
    elif isinstance(event, Words):
        body = {
            "type": "words",
            "utterance_id": event.utterance_id,
            "words": [
                {"text": w.text, "start_ms": w.start_ms, "end_ms": w.end_ms} for w in event.words
            ],
        }
    elif isinstance(event, Flushed):
        body = {"type": "flushed", "flush_id": event.flush_id}
    elif isinstance(event, MarkReached):
        body = {"type": "mark", "name": event.name, "cleared": event.cleared}
    elif isinstance(event, Cleared):
        body = {"type": "cleared"}
        _add_played(body, event.played, with_id=True)
    elif isinstance(event, BargeIn):
        body = {"type": "barge_in"}
        _add_played(body, event.played, with_id=True)
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


def _add_played(body: dict[str, object], played: Played | None, *, with_id: bool = False) -> None:
    """``played_ms`` and ``played_text`` (when words were timed) of what went out."""
    if played is None:
        return
    if with_id:
        body["utterance_id"] = played.utterance_id
    body["played_ms"] = played.played_ms
    if played.played_text is not None:
        body["played_text"] = played.played_text


def start_options(message: StartMsg) -> StartOptions:
    """Validate ``start``; raises a fatal :class:`SessionError` for what cannot start.

    ``barge_in`` defaults to on when the session sends caller audio (``input_format``).
    """
    if message.voice is None:
        raise ProtocolViolation(
            ErrorCode.INVALID_MESSAGE, "start: voice is required", CloseCode.POLICY
        )
    if message.format is None:
        raise ProtocolViolation(
            ErrorCode.INVALID_MESSAGE, "start: format is required", CloseCode.POLICY
        )
    fmt = FORMATS.get(message.format)
    if fmt is None:
        raise SessionError(
            ErrorCode.UNSUPPORTED_FORMAT,
            f"unknown format {message.format[:64]!r}",
            CloseCode.POLICY,
        )
    input_fmt = None
    if message.input_format is not None:
        if message.input_format not in INPUT_FORMATS:
            raise SessionError(
                ErrorCode.UNSUPPORTED_FORMAT,
                f"unknown input_format {message.input_format[:64]!r}",
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
        word_timestamps=message.timestamps == "word",
        instruct=message.instruct or None,
        cache=message.cache,
        max_buffer_delay_ms=(
            message.max_buffer_delay_ms
            if message.max_buffer_delay_ms is not None
            else DEFAULT_MAX_BUFFER_DELAY_MS
        ),
    )
