"""Twilio Media Streams, bidirectional (``<Connect><Stream>``): a sans-I/O protocol core.

We are the WebSocket *server* that Twilio connects to. Every message in both directions is
a JSON text frame; this module turns text into typed events and intents into text, and
never touches a socket, a clock or an event loop.

Vendor reference (all section names below are headings of this page):
"Media Streams - WebSocket Messages",
https://www.twilio.com/docs/voice/media-streams/websocket-messages

* "WebSocket messages from Twilio": ``connected`` (first message), ``start`` (once, right
  after ``connected``), then ``media``, ``dtmf``, ``mark`` (bidirectional Streams only),
  and finally ``stop``.
* "Send WebSocket messages to Twilio": ``media``, ``mark`` and ``clear``, only on
  bidirectional Streams.

States (one table, :data:`TRANSITIONS`)::

    AWAITING_CONNECTED --connected--> AWAITING_START --start--> STREAMING --stop--> STOPPED
                                                      STREAMING --media|dtmf|mark--> STREAMING
    any state --remote misbehaviour--> FAILED

A message that has no entry for the current state is remote misbehaviour and raises
:class:`TwilioProtocolError`; after that the connection is ``FAILED`` and the caller
should close the leg. Calling a sender in the wrong state is local misuse and raises
:class:`TwilioUsageError`; it does not change the state.

Marks: Twilio echoes a ``mark`` "when that ``media`` message's playback is complete", and
after a ``clear`` "sends back ``mark`` messages matching any remaining ``mark`` messages"
("Mark message"). An echo alone therefore cannot tell played from dropped; this core
remembers which marks were outstanding when it built a ``clear`` and reports their echoes
with ``cleared=True``. A mark whose audio finished playing while the ``clear`` was in
flight is also reported as cleared: ``cleared`` means "not confirmed played before the
clear was sent".

Authentication: Twilio cannot set request headers on the stream's WebSocket, so a token
travels as a ``<Parameter>`` and arrives in ``start.customParameters`` ("Start message").
This core only exposes it (:attr:`TwilioStart.custom_parameters`, :attr:`TwilioStart.token`);
the caller verifies it. Neither field appears in ``repr`` so events can be logged safely.

Ids: ``start.streamSid``, ``start.callSid``, ``start.accountSid`` and ``stop``'s
``accountSid``/``callSid`` must obey :func:`telephony.limits.call_id_problem` (1..128
printable characters, no whitespace), else ``invalid_id``. Twilio's sids are 34 characters,
``MZ``/``CA``/``AC`` and 32 hex digits (the REST API reference gives a Call sid the pattern
``^CA[0-9a-fA-F]{32}$``; this page's examples shorten them), but that shape is not
required: test tools and other vendors speaking this protocol send other ids.
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

import msgspec

from telephony.core import CoreError, JsonFields
from telephony.limits import call_id_problem, excerpt

__all__ = [
    "DEFAULT_MAX_MESSAGE_CHARS",
    "DEFAULT_MAX_PENDING_MARKS",
    "FRAME_MS",
    "MAX_MARK_NAME_CHARS",
    "MULAW_FRAME_BYTES",
    "TRANSITIONS",
    "TwilioConnected",
    "TwilioConnection",
    "TwilioDtmf",
    "TwilioError",
    "TwilioErrorCode",
    "TwilioEvent",
    "TwilioMark",
    "TwilioMedia",
    "TwilioMediaFormat",
    "TwilioProtocolError",
    "TwilioStart",
    "TwilioState",
    "TwilioStop",
    "TwilioUsageError",
    "build_clear",
    "build_mark",
    "build_media",
]

# "Start message": mediaFormat.encoding "is always audio/x-mulaw", sampleRate "is always
# 8000", channels "is always 1". Anything else is a stream this gateway cannot speak.
MULAW_ENCODING: Final = "audio/x-mulaw"
SAMPLE_RATE: Final = 8000
CHANNELS: Final = 1
FRAME_MS: Final = 20
MULAW_FRAME_BYTES: Final = SAMPLE_RATE * FRAME_MS // 1000  # 160 mu-law bytes per 20 ms

DEFAULT_MAX_MESSAGE_CHARS: Final = 65_536  # inbound text frame limit (ours, not Twilio's)
DEFAULT_MAX_PENDING_MARKS: Final = 1_000  # marks sent and not yet echoed
MAX_MARK_NAME_CHARS: Final = 256  # Twilio documents no limit; this bounds our bookkeeping
# sequenceNumber, chunk, timestamp: decimal strings; 20 digits hold any 64-bit counter
_MAX_COUNTER_DIGITS: Final = 20


class TwilioState(enum.Enum):
    """Where a Media Stream is in its life ("WebSocket messages from Twilio")."""

    AWAITING_CONNECTED = "awaiting_connected"
    AWAITING_START = "awaiting_start"
    STREAMING = "streaming"
    STOPPED = "stopped"
    FAILED = "failed"


#: The only legal inbound transitions: (state, Twilio ``event``) -> next state.
#: ``connected`` is "the first message your WebSocket server receives"; ``start`` "is sent
#: immediately after the connected message" and "only sent once"; ``stop`` ends the Stream.
TRANSITIONS: Final[Mapping[tuple[TwilioState, str], TwilioState]] = {
    (TwilioState.AWAITING_CONNECTED, "connected"): TwilioState.AWAITING_START,
    (TwilioState.AWAITING_START, "start"): TwilioState.STREAMING,
    (TwilioState.STREAMING, "media"): TwilioState.STREAMING,
    (TwilioState.STREAMING, "dtmf"): TwilioState.STREAMING,
    (TwilioState.STREAMING, "mark"): TwilioState.STREAMING,
    (TwilioState.STREAMING, "stop"): TwilioState.STOPPED,
}

_STREAM_EVENTS: Final = frozenset({"media", "dtmf", "mark", "stop"})


class TwilioErrorCode(enum.StrEnum):
    """Machine-readable codes carried by :class:`TwilioError` subclasses."""

    # Remote misbehaviour (TwilioProtocolError)
    INVALID_JSON = "invalid_json"  # not JSON, or not a JSON object
    MESSAGE_TOO_LARGE = "message_too_large"
    UNKNOWN_EVENT = "unknown_event"  # an ``event`` this protocol does not define
    UNEXPECTED_EVENT = "unexpected_event"  # a known event the state table does not allow
    MEDIA_BEFORE_START = "media_before_start"  # media/dtmf/mark/stop before ``start``
    MISSING_FIELD = "missing_field"
    INVALID_FIELD = "invalid_field"  # present but of the wrong type or form
    INVALID_ID = "invalid_id"  # a sid that is empty, over 128 characters, or not printable
    INVALID_BASE64 = "invalid_base64"  # media.payload does not decode
    UNSUPPORTED_CODEC = "unsupported_codec"  # mediaFormat other than mu-law/8000/mono
    STREAM_SID_MISMATCH = "stream_sid_mismatch"
    UNKNOWN_MARK = "unknown_mark"  # a mark echo for a name we never sent (or already got)
    # Local misuse (TwilioUsageError)
    NOT_STREAMING = "not_streaming"  # sending before ``start`` or after ``stop``
    CONNECTION_FAILED = "connection_failed"  # used after a protocol error
    EMPTY_MEDIA = "empty_media"
    INVALID_MARK_NAME = "invalid_mark_name"
    TOO_MANY_MARKS = "too_many_marks"


class TwilioError(CoreError[TwilioErrorCode]):
    """Base of this module's errors: ``code`` for machines, ``message`` for the log."""


class TwilioProtocolError(TwilioError):
    """Twilio sent something the protocol does not allow (remote misbehaviour)."""


class TwilioUsageError(TwilioError):
    """This process called the core in a way its contract forbids (local misuse)."""


# --------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class TwilioMediaFormat:
    """``start.mediaFormat`` ("Start message")."""

    encoding: str
    sample_rate: int
    channels: int


@dataclass(frozen=True, slots=True)
class TwilioConnected:
    """``connected`` ("Connected message"): ``protocol`` (e.g. ``Call``), ``version``."""

    protocol: str
    version: str


@dataclass(frozen=True, slots=True)
class TwilioStart:
    """``start`` ("Start message"): Stream metadata, sent once."""

    sequence_number: int
    stream_sid: str
    account_sid: str
    call_sid: str
    tracks: tuple[str, ...]
    media_format: TwilioMediaFormat
    #: ``start.customParameters``: the ``<Parameter>`` name/value pairs of the TwiML
    #: ``<Stream>``. May hold a bearer token, so it is kept out of ``repr``.
    custom_parameters: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def token(self) -> str | None:
        """``customParameters.token``: where a JWT travels, since Twilio sets no headers."""
        return self.custom_parameters.get("token")


@dataclass(frozen=True, slots=True)
class TwilioMedia:
    """``media`` ("Media message") with ``payload`` already base64-decoded (raw mu-law)."""

    sequence_number: int
    stream_sid: str
    track: str
    chunk: int
    timestamp: int  # "Presentation Timestamp in Milliseconds from the start of the stream"
    payload: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class TwilioDtmf:
    """``dtmf`` ("DTMF message"): ``track`` is always ``inbound_track``."""

    sequence_number: int
    stream_sid: str
    track: str
    digit: str


@dataclass(frozen=True, slots=True)
class TwilioMark:
    """``mark`` echo ("Mark message"); ``cleared`` is this core's bookkeeping.

    ``cleared`` is True when the mark was outstanding when :meth:`TwilioConnection.send_clear`
    built a ``clear``: Twilio echoes those marks too, and their audio was dropped.
    """

    sequence_number: int
    stream_sid: str
    name: str
    cleared: bool


@dataclass(frozen=True, slots=True)
class TwilioStop:
    """``stop`` ("Stop message"); ``unechoed_marks`` lists marks Twilio never echoed."""

    sequence_number: int
    stream_sid: str
    account_sid: str
    call_sid: str
    unechoed_marks: tuple[str, ...] = ()


TwilioEvent: TypeAlias = (
    TwilioConnected | TwilioStart | TwilioMedia | TwilioDtmf | TwilioMark | TwilioStop
)


# --------------------------------------------------------------------------- builders


_json_decode = msgspec.json.Decoder().decode


def _dumps(obj: dict[str, Any]) -> str:
    # Compact JSON, keys in the documented order ("Send WebSocket messages to Twilio").
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def build_media(stream_sid: str, mulaw: bytes) -> str:
    """Outbound ``media`` ("Send a media message"): raw mu-law/8000, base64, no headers.

    ``{"event":"media","streamSid":...,"media":{"payload":...}}``. "The audio can be of
    any size"; one 20 ms frame is :data:`MULAW_FRAME_BYTES` (160) bytes.
    """
    return media_builder(stream_sid)(mulaw)


def media_builder(stream_sid: str) -> Callable[[bytes], str]:
    """:func:`build_media` for one stream: the compact JSON text with the stream's part
    built once, not a dict serialized per frame (base64 needs no JSON escaping)."""
    head = '{"event":"media","streamSid":' + json.dumps(stream_sid, ensure_ascii=False)
    head += ',"media":{"payload":"'
    b64encode = base64.b64encode

    def build(mulaw: bytes) -> str:
        return head + b64encode(mulaw).decode("ascii") + '"}}'

    return build


def build_mark(stream_sid: str, name: str) -> str:
    """Outbound ``mark`` ("Send a mark message"): ``{"event":"mark","streamSid":...,
    "mark":{"name":...}}``."""
    return _dumps({"event": "mark", "streamSid": stream_sid, "mark": {"name": name}})


def build_clear(stream_sid: str) -> str:
    """Outbound ``clear`` ("Send a clear message"): ``{"event":"clear","streamSid":...}``."""
    return _dumps({"event": "clear", "streamSid": stream_sid})


# --------------------------------------------------------------------------- parsing helpers


def _fail(code: TwilioErrorCode, message: str) -> TwilioProtocolError:
    return TwilioProtocolError(code, message)


_FIELDS: Final = JsonFields(
    TwilioProtocolError, TwilioErrorCode.MISSING_FIELD, TwilioErrorCode.INVALID_FIELD
)
_get = _FIELDS.get
_str = _FIELDS.string
_object = _FIELDS.object
_int = _FIELDS.integer


def _nonempty_str(obj: Mapping[str, Any], key: str, path: str) -> str:
    value = _str(obj, key, path)
    if not value:
        raise _fail(TwilioErrorCode.INVALID_FIELD, f"{path} must not be empty")
    return value


def _call_id(obj: Mapping[str, Any], key: str, path: str) -> str:
    """A sid: a string obeying :func:`telephony.limits.call_id_problem`."""
    value = _str(obj, key, path)
    problem = call_id_problem(value)
    if problem is not None:
        raise _fail(TwilioErrorCode.INVALID_ID, f"{path} {excerpt(value)} {problem}")
    return value


def _counter(obj: Mapping[str, Any], key: str, path: str) -> int:
    """A non-negative integer that Twilio sends as a decimal string (e.g. ``"1"``)."""
    value = _get(obj, key, path)
    if (
        isinstance(value, str)
        and len(value) <= _MAX_COUNTER_DIGITS  # int() raises ValueError past 4,300 digits
        and value.isascii()
        and value.isdigit()
    ):
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise _fail(TwilioErrorCode.INVALID_FIELD, f"{path} must be a non-negative integer")


# --------------------------------------------------------------------------- connection


class TwilioConnection:
    """One bidirectional Media Stream, seen from our WebSocket server.

    Feed every inbound text frame to :meth:`receive_text`; put the strings returned by
    :meth:`send_media`, :meth:`send_mark` and :meth:`send_clear` on the socket as text
    frames, in the order they were returned. Binary frames are not part of this protocol.
    """

    def __init__(
        self,
        *,
        max_message_chars: int = DEFAULT_MAX_MESSAGE_CHARS,
        max_pending_marks: int = DEFAULT_MAX_PENDING_MARKS,
    ) -> None:
        if max_message_chars <= 0 or max_pending_marks <= 0:
            raise ValueError("limits must be positive")
        self._max_message_chars = max_message_chars
        self._max_pending_marks = max_pending_marks
        self._state = TwilioState.AWAITING_CONNECTED
        self._start: TwilioStart | None = None
        # Marks sent and not yet echoed, oldest first: [name, cleared].
        self._pending: list[tuple[str, bool]] = []
        self._media: Callable[[bytes], str] | None = None  # media_builder for the stream
        self._media_sid: str | None = None

    # ----------------------------------------------------------------- properties

    @property
    def state(self) -> TwilioState:
        return self._state

    @property
    def start(self) -> TwilioStart | None:
        """The ``start`` event, once received."""
        return self._start

    @property
    def stream_sid(self) -> str | None:
        return self._start.stream_sid if self._start is not None else None

    @property
    def pending_marks(self) -> tuple[str, ...]:
        """Names of marks sent and not yet echoed, oldest first."""
        return tuple(name for name, _ in self._pending)

    # ----------------------------------------------------------------- inbound

    def receive_text(self, text: str) -> list[TwilioEvent]:
        """Parse one inbound text frame; return the events it carries (exactly one).

        Raises :class:`TwilioProtocolError` on remote misbehaviour (the state becomes
        ``FAILED``) and :class:`TwilioUsageError` if called after a failure.
        """
        if self._state is TwilioState.FAILED:
            raise TwilioUsageError(
                TwilioErrorCode.CONNECTION_FAILED, "receive_text after a protocol error"
            )
        try:
            event = self._parse(text)
        except TwilioProtocolError:
            self._state = TwilioState.FAILED
            raise
        return [event]

    def _parse(self, text: str) -> TwilioEvent:
        if len(text) > self._max_message_chars:
            raise _fail(
                TwilioErrorCode.MESSAGE_TOO_LARGE,
                f"{len(text)} characters, limit {self._max_message_chars}",
            )
        try:
            msg = _json_decode(text)  # 50 media events a second per call: the C decoder
        except (msgspec.DecodeError, RecursionError) as exc:
            raise _fail(TwilioErrorCode.INVALID_JSON, f"not JSON: {exc}") from None
        except UnicodeEncodeError:
            # msgspec decodes UTF-8: a str with a lone surrogate cannot be encoded, and
            # cannot have come off the wire either (a text frame is UTF-8, RFC 6455 5.6).
            raise _fail(TwilioErrorCode.INVALID_JSON, "not UTF-8 text") from None
        if not isinstance(msg, dict):
            raise _fail(TwilioErrorCode.INVALID_JSON, "not a JSON object")
        name = _str(msg, "event", "event")
        if name not in _DECODERS:
            raise _fail(TwilioErrorCode.UNKNOWN_EVENT, f"unknown event {name[:64]!r}")
        next_state = TRANSITIONS.get((self._state, name))
        if next_state is None:
            if name in _STREAM_EVENTS and self._start is None:
                raise _fail(TwilioErrorCode.MEDIA_BEFORE_START, f"{name!r} before 'start'")
            raise _fail(TwilioErrorCode.UNEXPECTED_EVENT, f"{name!r} in state {self._state.value}")
        event = _DECODERS[name](self, msg)
        self._state = next_state
        return event

    def _decode_connected(self, msg: Mapping[str, Any]) -> TwilioConnected:
        # "Connected message": {"event", "protocol", "version"}
        return TwilioConnected(
            protocol=_str(msg, "protocol", "protocol"),
            version=_str(msg, "version", "version"),
        )

    def _decode_media(self, msg: Mapping[str, Any]) -> TwilioMedia:
        # "Media message": sequenceNumber, streamSid, media.{track, chunk, timestamp,
        # payload ("Raw audio encoded in base64")}
        seq, sid = self._sequence_and_sid(msg)
        media = _object(msg, "media", "media")
        track = _str(media, "track", "media.track")
        chunk = _counter(media, "chunk", "media.chunk")
        timestamp = _counter(media, "timestamp", "media.timestamp")
        payload_b64 = _str(media, "payload", "media.payload")
        try:
            payload = base64.b64decode(payload_b64, validate=True)
        except (binascii.Error, ValueError):
            raise _fail(
                TwilioErrorCode.INVALID_BASE64, "media.payload is not valid base64"
            ) from None
        return TwilioMedia(seq, sid, track, chunk, timestamp, payload)

    def _decode_dtmf(self, msg: Mapping[str, Any]) -> TwilioDtmf:
        # "DTMF message": streamSid, sequenceNumber, dtmf.{track ("inbound_track"), digit}
        seq, sid = self._sequence_and_sid(msg)
        dtmf = _object(msg, "dtmf", "dtmf")
        track = _str(dtmf, "track", "dtmf.track")
        digit = _str(dtmf, "digit", "dtmf.digit")
        # "DTMF message": dtmf.digit is "the number-pad digit detected": one character.
        # Which characters are digits is the gateway's business (telephony.limits).
        if len(digit) != 1:
            raise _fail(
                TwilioErrorCode.INVALID_FIELD, f"dtmf.digit {excerpt(digit)} is not one character"
            )
        return TwilioDtmf(seq, sid, track, digit)

    def _decode_mark(self, msg: Mapping[str, Any]) -> TwilioMark:
        # "Mark message": streamSid, sequenceNumber, mark.name (the name our server sent)
        seq, sid = self._sequence_and_sid(msg)
        name = _str(_object(msg, "mark", "mark"), "name", "mark.name")
        return TwilioMark(seq, sid, name, self._take_mark(name))

    def _decode_stop(self, msg: Mapping[str, Any]) -> TwilioStop:
        # "Stop message": sequenceNumber, stop.{accountSid, callSid}, streamSid
        seq, sid = self._sequence_and_sid(msg)
        stop = _object(msg, "stop", "stop")
        account_sid = _call_id(stop, "accountSid", "stop.accountSid")
        call_sid = _call_id(stop, "callSid", "stop.callSid")
        unechoed = self.pending_marks
        self._pending.clear()
        return TwilioStop(seq, sid, account_sid, call_sid, unechoed)

    def _decode_start(self, msg: Mapping[str, Any]) -> TwilioStart:
        # "Start message": sequenceNumber, start.{streamSid, accountSid, callSid, tracks,
        # customParameters, mediaFormat.{encoding, sampleRate, channels}}, streamSid
        seq = _counter(msg, "sequenceNumber", "sequenceNumber")
        start = _object(msg, "start", "start")
        _nonempty_str(start, "streamSid", "start.streamSid")  # "" stays invalid_field, as ever
        sid = _call_id(start, "streamSid", "start.streamSid")
        if "streamSid" in msg and msg["streamSid"] != sid:
            raise _fail(
                TwilioErrorCode.STREAM_SID_MISMATCH, "streamSid differs from start.streamSid"
            )
        tracks = _get(start, "tracks", "start.tracks")
        if not isinstance(tracks, list) or not all(isinstance(t, str) for t in tracks):
            raise _fail(TwilioErrorCode.INVALID_FIELD, "start.tracks must be a list of strings")
        params: Mapping[str, Any] = {}
        if "customParameters" in start:
            params = _object(start, "customParameters", "start.customParameters")
            if not all(isinstance(v, str) for v in params.values()):
                raise _fail(
                    TwilioErrorCode.INVALID_FIELD,
                    "start.customParameters values must be strings",
                )
        fmt = _object(start, "mediaFormat", "start.mediaFormat")
        media_format = TwilioMediaFormat(
            encoding=_str(fmt, "encoding", "start.mediaFormat.encoding"),
            sample_rate=_int(fmt, "sampleRate", "start.mediaFormat.sampleRate"),
            channels=_int(fmt, "channels", "start.mediaFormat.channels"),
        )
        if media_format != TwilioMediaFormat(MULAW_ENCODING, SAMPLE_RATE, CHANNELS):
            raise _fail(
                TwilioErrorCode.UNSUPPORTED_CODEC,
                f"mediaFormat {excerpt(media_format.encoding)}/{media_format.sample_rate}"
                f"/{media_format.channels}, need {MULAW_ENCODING}/{SAMPLE_RATE}/{CHANNELS}",
            )
        event = TwilioStart(
            sequence_number=seq,
            stream_sid=sid,
            account_sid=_call_id(start, "accountSid", "start.accountSid"),
            call_sid=_call_id(start, "callSid", "start.callSid"),
            tracks=tuple(tracks),
            media_format=media_format,
            custom_parameters=dict(params),
        )
        self._start = event
        return event

    def _sequence_and_sid(self, msg: Mapping[str, Any]) -> tuple[int, str]:
        """``sequenceNumber`` and ``streamSid``, which must be this Stream's."""
        assert self._start is not None  # the state table admits these only after start
        seq = _counter(msg, "sequenceNumber", "sequenceNumber")
        sid = _str(msg, "streamSid", "streamSid")
        if sid != self._start.stream_sid:
            raise _fail(
                TwilioErrorCode.STREAM_SID_MISMATCH,
                f"streamSid {excerpt(sid)} is not this stream's {self._start.stream_sid!r}",
            )
        return seq, sid

    def _take_mark(self, name: str) -> bool:
        """Remove the oldest outstanding mark called ``name``; return its cleared flag."""
        for index, (pending, cleared) in enumerate(self._pending):
            if pending == name:
                del self._pending[index]
                return cleared
        raise _fail(TwilioErrorCode.UNKNOWN_MARK, f"echo of mark {name[:64]!r} we did not send")

    # ----------------------------------------------------------------- outbound

    def _require_streaming(self, what: str) -> str:
        if self._state is TwilioState.FAILED:
            raise TwilioUsageError(
                TwilioErrorCode.CONNECTION_FAILED, f"{what} after a protocol error"
            )
        if self._state is not TwilioState.STREAMING or self._start is None:
            raise TwilioUsageError(
                TwilioErrorCode.NOT_STREAMING, f"{what} in state {self._state.value}"
            )
        return self._start.stream_sid

    def send_media(self, mulaw: bytes) -> str:
        """Text of a ``media`` message carrying ``mulaw`` (raw mu-law/8000, any length > 0)."""
        sid = self._require_streaming("send_media")
        if not mulaw:
            raise TwilioUsageError(TwilioErrorCode.EMPTY_MEDIA, "no audio to send")
        if self._media is None or self._media_sid != sid:
            self._media, self._media_sid = media_builder(sid), sid
        return self._media(mulaw)

    def send_mark(self, name: str) -> str:
        """Text of a ``mark`` message; the name is outstanding until Twilio echoes it."""
        sid = self._require_streaming("send_mark")
        if not name or len(name) > MAX_MARK_NAME_CHARS:
            raise TwilioUsageError(
                TwilioErrorCode.INVALID_MARK_NAME,
                f"mark name must be 1..{MAX_MARK_NAME_CHARS} characters",
            )
        if len(self._pending) >= self._max_pending_marks:
            raise TwilioUsageError(
                TwilioErrorCode.TOO_MANY_MARKS,
                f"{len(self._pending)} marks outstanding, limit {self._max_pending_marks}",
            )
        self._pending.append((name, False))
        return build_mark(sid, name)

    def send_clear(self) -> str:
        """Text of a ``clear`` message; outstanding marks will echo with ``cleared=True``.

        "This empties all buffered audio and causes any ``mark`` messages to be sent back"
        ("Send a clear message").
        """
        sid = self._require_streaming("send_clear")
        self._pending = [(name, True) for name, _ in self._pending]
        return build_clear(sid)


#: One decoder per Twilio ``event``, the registry of "WebSocket messages from Twilio".
_DECODERS: Final[Mapping[str, Callable[[TwilioConnection, Mapping[str, Any]], TwilioEvent]]] = {
    "connected": TwilioConnection._decode_connected,
    "start": TwilioConnection._decode_start,
    "media": TwilioConnection._decode_media,
    "dtmf": TwilioConnection._decode_dtmf,
    "mark": TwilioConnection._decode_mark,
    "stop": TwilioConnection._decode_stop,
}
