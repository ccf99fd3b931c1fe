"""Asterisk ``chan_websocket`` media WebSocket: a sans-I/O protocol core.

Asterisk 20.16+/22.6+/23.0+ (``chan_websocket``) streams a call's media over one
WebSocket: BINARY frames carry raw media in the channel's codec, TEXT frames carry control
events (Asterisk to us) and commands (us to Asterisk). Either side may have opened the
socket; the protocol on it is the same. This module turns frames into typed events and
intents into frames; it never touches a socket, a clock or an event loop.

Vendor references:

* Asterisk documentation, "WebSocket" channel driver,
  https://docs.asterisk.org/Configuration/Channel-Drivers/WebSocket (sections "Media
  Transfer", "Max Message Size and Flow Control", "Control Commands and Events",
  "Commands", "Events"); cited below as [WS <section>].
* Asterisk module configuration ``chan_websocket.conf``, option ``control_message_format``
  (``plain-text``, the default, or ``json``; since 20.18.0, 22.8.0, 23.2.0), also settable
  per call with the ``f(<format>)`` dial-string option; cited as [conf].
* ``channels/chan_websocket.c`` in the asterisk/asterisk repository, for details the page
  leaves open (exact plain-text layouts, the 128-byte command limit, what ``FLUSH_MEDIA``
  does to queued marks); cited as [src <function>].

Control message formats, as Asterisk writes them [WS Control Commands and Events] [src]:

* plain-text: one line, the name, then parameters separated by single spaces. Most
  events carry ``key:value`` parameters, e.g.
  ``MEDIA_START connection_id:<id> channel:<name> channel_id:<uniqueid> format:ulaw
  optimal_frame_size:160 ptime:20`` (``channel_id`` and ``ptime`` are absent in the first
  releases [src history]) and ``DTMF_END digit:5 channel_id:<uniqueid>``. The id of
  ``MEDIA_MARK_PROCESSED`` and ``MEDIA_BUFFERING_COMPLETED`` is the bare rest of the line
  [src _create_event_MEDIA_MARK_PROCESSED]. ``ERROR channel_id:<id> error_text:<text>``
  has spaces in its text [src _create_event_ERROR]. Commands: ``ANSWER``,
  ``MARK_MEDIA <correlation_id>``, ``STOP_MEDIA_BUFFERING <correlation_id>``...
* json: one object per TEXT frame. Events: ``{"event": "MEDIA_START", "connection_id",
  "channel", "channel_id", "format", "optimal_frame_size" (number), "ptime" (number),
  "channel_variables" (object)}``; every other event has ``event`` and ``channel_id`` plus
  its own fields. Commands: ``{"command": "MARK_MEDIA", "correlation_id": "..."}``.

States (one table, :data:`TRANSITIONS`)::

    AWAITING_MEDIA_START --MEDIA_START--> ACTIVE <--MEDIA_XON-- PAUSED
                                          ACTIVE --MEDIA_XOFF--> PAUSED
    AWAITING_MEDIA_START | ACTIVE | PAUSED --hangup() --> CLOSING
    any --connection_closed()--> CLOSED;  any --remote misbehaviour--> FAILED

``can_send`` is True only in ``ACTIVE``: after ``MEDIA_XOFF`` "the app should then pause
sending media. Any media sent after this has a high probability of being dropped"
[WS Events].

Marks: ``MARK_MEDIA`` puts a mark in the driver's frame queue and ``MEDIA_MARK_PROCESSED``
reports it when it reaches the front [WS Commands], so events come back in order.
``FLUSH_MEDIA`` frees the whole queue, marks included, and no event is ever sent for them
[src handle_command]; :meth:`AsteriskConnection.flush_media` therefore returns them as
cleared, and a ``MEDIA_MARK_PROCESSED`` that was already in flight for one of them is
swallowed (it was reported once, as cleared).

Unknown events: a TEXT frame whose event name this module does not know raises
:class:`AsteriskProtocolError` with code ``unknown_event`` (there is no "unknown" event
type); the gateway logs it and closes this leg, as it does for every malformed vendor
message. Asterisk's own ``ERROR`` notification (sent for commands it rejects) is a typed
event, :class:`DriverError`, because it is well-formed; what to do with it is the
caller's decision.

Ids: ``MEDIA_START`` ``connection_id`` and every event's ``channel_id`` (the channel's
uniqueid, ``pbx1-123456789.999`` in [WS Control Commands and Events]) must obey
:func:`telephony.limits.call_id_problem` (1..128 printable characters, no whitespace),
else ``invalid_id``; the page documents no length.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple, Protocol, TypeAlias

from telephony.codecs.formats import G711_RATE, AudioSpec, Codec
from telephony.core import CoreError
from telephony.limits import call_id_problem, excerpt

__all__ = [
    "CODECS",
    "COMMAND_MAX_BYTES",
    "DEFAULT_MAX_PENDING_MARKS",
    "DEFAULT_MAX_TEXT_CHARS",
    "MAX_MESSAGE_BYTES",
    "TRANSITIONS",
    "AsteriskCodec",
    "AsteriskConnection",
    "AsteriskError",
    "AsteriskErrorCode",
    "AsteriskEvent",
    "AsteriskProtocolError",
    "AsteriskState",
    "AsteriskUsageError",
    "Command",
    "ControlFormat",
    "DriverError",
    "DriverStatus",
    "DtmfEnd",
    "FlushMedia",
    "MediaBufferingCompleted",
    "MediaDirection",
    "MediaMarkProcessed",
    "MediaReceived",
    "MediaStart",
    "MediaXoff",
    "MediaXon",
    "QueueDrained",
    "Trigger",
    "encode_command",
    "format_for_codec",
]

#: "The maximum websocket message size the underlying websocket code can handle is 65500
#: bytes. Attempting to send a message greater than that length will result in the
#: websocket being closed and the call hungup!" [WS Max Message Size and Flow Control]
MAX_MESSAGE_BYTES: Final = 65_500
#: Asterisk ignores (logs and drops) TEXT frames longer than 128 bytes
#: [src MAX_TEXT_MESSAGE_LEN, process_text_message], so every command must fit.
COMMAND_MAX_BYTES: Final = 128
DEFAULT_MAX_TEXT_CHARS: Final = 65_536  # inbound TEXT frame limit (ours)
DEFAULT_MAX_PENDING_MARKS: Final = 1_000  # the driver queues ~1000 frames [WS Max Message Size]
_MAX_INTEGER_DIGITS: Final = 20  # plain-text integers: 20 digits hold any 64-bit value

# Correlation ids: printable, no whitespace (plain-text is space-separated and Asterisk
# strips whitespace [src process_text_message]), no JSON escapes. The whole command must
# still fit COMMAND_MAX_BYTES, which leaves 74..117 characters depending on the command
# and format; ids of up to 64 characters fit every command in both formats.
_CORRELATION_ID: Final = re.compile(r"[A-Za-z0-9._:@/+=~-]{1,128}")


class ControlFormat(enum.StrEnum):
    """``control_message_format`` values [conf]."""

    PLAIN_TEXT = "plain-text"
    JSON = "json"


class MediaDirection(enum.StrEnum):
    """``SET_MEDIA_DIRECTION`` ``direction``, from the application's view [WS Commands]."""

    BOTH = "both"
    IN = "in"
    OUT = "out"


class Command(enum.StrEnum):
    """Commands the application may send; all are case-sensitive [WS Commands]."""

    ANSWER = "ANSWER"
    HANGUP = "HANGUP"
    START_MEDIA_BUFFERING = "START_MEDIA_BUFFERING"
    STOP_MEDIA_BUFFERING = "STOP_MEDIA_BUFFERING"
    FLUSH_MEDIA = "FLUSH_MEDIA"
    PAUSE_MEDIA = "PAUSE_MEDIA"
    CONTINUE_MEDIA = "CONTINUE_MEDIA"
    MARK_MEDIA = "MARK_MEDIA"
    GET_STATUS = "GET_STATUS"
    REPORT_QUEUE_DRAINED = "REPORT_QUEUE_DRAINED"
    SET_MEDIA_DIRECTION = "SET_MEDIA_DIRECTION"  # JSON format only [src handle_command]


_TAKES_CORRELATION_ID: Final = frozenset({Command.MARK_MEDIA, Command.STOP_MEDIA_BUFFERING})


@dataclass(frozen=True, slots=True)
class AsteriskCodec:
    """An Asterisk format name (``MEDIA_START`` ``format``) and what it means to us."""

    name: str  # Asterisk's format name: ulaw, alaw, slin, slin16
    audio: AudioSpec  # what it is: codec and rate (telephony/codecs/formats.py)
    sample_bytes: int
    silence: bytes  # one sample of digital silence in this codec

    @property
    def sample_rate(self) -> int:
        return self.audio.sample_rate

    @property
    def format(self) -> str:
        """The wire name of :attr:`audio` (``mulaw_8000``), from the formats table."""
        return self.audio.name


#: Supported codecs. Asterisk's ``slin*`` frames are host-endian signed 16-bit; the
#: gateway's ``pcm_*`` formats are little-endian, which assumes a little-endian Asterisk
#: host (x86-64, aarch64).
CODECS: Final[Mapping[str, AsteriskCodec]] = {
    "ulaw": AsteriskCodec("ulaw", AudioSpec(Codec.MULAW, G711_RATE), 1, b"\xff"),  # mu-law +0
    "alaw": AsteriskCodec("alaw", AudioSpec(Codec.ALAW, G711_RATE), 1, b"\xd5"),  # A-law +0
    "slin": AsteriskCodec("slin", AudioSpec(Codec.PCM, 8000), 2, b"\x00\x00"),
    "slin16": AsteriskCodec("slin16", AudioSpec(Codec.PCM, 16000), 2, b"\x00\x00"),
}


class AsteriskErrorCode(enum.StrEnum):
    """Machine-readable codes carried by :class:`AsteriskError` subclasses."""

    # Remote misbehaviour (AsteriskProtocolError)
    INVALID_JSON = "invalid_json"  # json format: not JSON, or not an object
    MALFORMED_MESSAGE = "malformed_message"  # plain-text: empty, several lines, bad token
    WRONG_CONTROL_FORMAT = "wrong_control_format"  # JSON on a plain-text leg or vice versa
    MESSAGE_TOO_LARGE = "message_too_large"
    UNKNOWN_EVENT = "unknown_event"
    UNEXPECTED_EVENT = "unexpected_event"  # a known event the state table does not allow
    MEDIA_BEFORE_START = "media_before_start"  # a BINARY frame before MEDIA_START
    MISSING_FIELD = "missing_field"
    INVALID_FIELD = "invalid_field"
    INVALID_ID = "invalid_id"  # connection_id/channel_id empty, over 128 chars, not printable
    UNSUPPORTED_CODEC = "unsupported_codec"
    INVALID_FRAME_SIZE = "invalid_frame_size"  # optimal_frame_size unusable
    INVALID_MEDIA = "invalid_media"  # empty, or not whole samples
    UNKNOWN_MARK = "unknown_mark"  # MEDIA_MARK_PROCESSED for an id we did not send
    # Local misuse (AsteriskUsageError)
    NOT_STARTED = "not_started"  # before MEDIA_START
    FLOW_PAUSED = "flow_paused"  # media while paused by MEDIA_XOFF
    CLOSED = "closed"  # after hangup() or connection_closed()
    CONNECTION_FAILED = "connection_failed"  # after a protocol error
    FORMAT_UNKNOWN = "format_unknown"  # a command before the control format is known
    INVALID_CORRELATION_ID = "invalid_correlation_id"
    INVALID_ARGUMENT = "invalid_argument"
    COMMAND_TOO_LONG = "command_too_long"
    JSON_ONLY = "json_only"
    DUPLICATE_MARK = "duplicate_mark"
    TOO_MANY_MARKS = "too_many_marks"


class AsteriskError(CoreError[AsteriskErrorCode]):
    """Base of this module's errors: ``code`` for machines, ``message`` for the log."""


class AsteriskProtocolError(AsteriskError):
    """Asterisk sent something the protocol does not allow (remote misbehaviour)."""


class AsteriskUsageError(AsteriskError):
    """This process called the core in a way its contract forbids (local misuse)."""


def _fail(code: AsteriskErrorCode, message: str) -> AsteriskProtocolError:
    return AsteriskProtocolError(code, message)


def format_for_codec(codec: str) -> str:
    """The gateway format name for an Asterisk format name (``ulaw`` -> ``mulaw_8000``).

    Raises :class:`AsteriskProtocolError` ``unsupported_codec`` for any other codec.
    """
    found = CODECS.get(codec)
    if found is None:
        raise _fail(AsteriskErrorCode.UNSUPPORTED_CODEC, f"codec {codec[:32]!r} is not supported")
    return found.format


# --------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class MediaStart:
    """``MEDIA_START`` [WS Events]: sent once, when the media WebSocket connects."""

    connection_id: str
    channel: str
    channel_id: str | None  # absent from plain-text before channel_id was added
    codec: str  # Asterisk format name, e.g. "ulaw"
    format: str  # the wire name of its codec's AudioSpec, e.g. mulaw_8000 (formats table)
    sample_rate: int
    optimal_frame_size: int  # bytes of one ptime frame; send whole multiples of it
    ptime: int  # milliseconds; 20 when a plain-text MEDIA_START omits it
    #: JSON format only [WS Events footnote 2]; values may be sensitive, so no repr.
    channel_variables: Mapping[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True, slots=True)
class DtmfEnd:
    """``DTMF_END`` [WS Events]: the caller released a key."""

    digit: str
    channel_id: str | None


@dataclass(frozen=True, slots=True)
class MediaXoff:
    """``MEDIA_XOFF`` [WS Events]: the driver's queue reached the XOFF level; stop sending."""

    channel_id: str | None


@dataclass(frozen=True, slots=True)
class MediaXon:
    """``MEDIA_XON`` [WS Events]: the queue fell below the XON level; sending may resume."""

    channel_id: str | None


@dataclass(frozen=True, slots=True)
class MediaMarkProcessed:
    """``MEDIA_MARK_PROCESSED`` [WS Events]: a ``MARK_MEDIA`` mark reached the queue front,
    so all media sent before it has gone to the Asterisk core."""

    correlation_id: str
    channel_id: str | None


@dataclass(frozen=True, slots=True)
class MediaBufferingCompleted:
    """``MEDIA_BUFFERING_COMPLETED`` [WS Events]: bulk media sent after
    ``START_MEDIA_BUFFERING`` has been framed and passed to the core."""

    correlation_id: str | None
    channel_id: str | None


@dataclass(frozen=True, slots=True)
class QueueDrained:
    """``QUEUE_DRAINED`` [WS Events]: answer to ``REPORT_QUEUE_DRAINED``."""

    channel_id: str | None


@dataclass(frozen=True, slots=True)
class DriverStatus:
    """``STATUS`` [WS Events]: answer to ``GET_STATUS``."""

    channel_id: str | None
    queue_length: int
    xon_level: int
    xoff_level: int
    queue_full: bool
    bulk_media: bool
    media_paused: bool


@dataclass(frozen=True, slots=True)
class DriverError:
    """``ERROR`` [src _create_event_ERROR]: Asterisk rejected a command (not on the page)."""

    error_text: str
    channel_id: str | None


@dataclass(frozen=True, slots=True)
class MediaReceived:
    """One BINARY frame: raw media in the codec of :class:`MediaStart` [WS Media Transfer]."""

    payload: bytes = field(repr=False)


AsteriskEvent: TypeAlias = (
    MediaStart
    | DtmfEnd
    | MediaXoff
    | MediaXon
    | MediaMarkProcessed
    | MediaBufferingCompleted
    | QueueDrained
    | DriverStatus
    | DriverError
    | MediaReceived
)


class FlushMedia(NamedTuple):
    """What :meth:`AsteriskConnection.flush_media` returns.

    ``FLUSH_MEDIA`` frees every queued frame, the mark frames included [src handle_command],
    so Asterisk never reports the marks in ``cleared_marks``; the caller reports them as
    cleared.
    """

    text: str
    cleared_marks: tuple[str, ...]


# --------------------------------------------------------------------------- states


class AsteriskState(enum.Enum):
    AWAITING_MEDIA_START = "awaiting_media_start"
    ACTIVE = "active"  # MEDIA_XON: media may be sent
    PAUSED = "paused"  # MEDIA_XOFF: media would probably be dropped
    CLOSING = "closing"  # we sent HANGUP; events may still arrive
    CLOSED = "closed"  # the socket is gone
    FAILED = "failed"  # Asterisk misbehaved; close the leg


class Trigger(enum.Enum):
    """What moves the state machine: an inbound frame, or a local action."""

    MEDIA_START = "MEDIA_START"
    MEDIA_XOFF = "MEDIA_XOFF"
    MEDIA_XON = "MEDIA_XON"
    NOTIFICATION = "notification"  # any other event: DTMF_END, MEDIA_MARK_PROCESSED, ...
    MEDIA = "media"  # a BINARY frame from Asterisk
    HANGUP = "hangup"  # we built a HANGUP command
    CONNECTION_CLOSED = "connection_closed"  # the socket closed, either side


_S = AsteriskState
_T = Trigger

#: Every legal transition. A duplicate XON/XOFF is accepted as a no-op (the driver pairs
#: them [src dequeue_frame, queue_frame_from_buffer], but a repeat is harmless).
TRANSITIONS: Final[Mapping[tuple[AsteriskState, Trigger], AsteriskState]] = {
    (_S.AWAITING_MEDIA_START, _T.MEDIA_START): _S.ACTIVE,
    (_S.AWAITING_MEDIA_START, _T.HANGUP): _S.CLOSING,
    (_S.AWAITING_MEDIA_START, _T.CONNECTION_CLOSED): _S.CLOSED,
    (_S.ACTIVE, _T.MEDIA_XOFF): _S.PAUSED,
    (_S.ACTIVE, _T.MEDIA_XON): _S.ACTIVE,
    (_S.ACTIVE, _T.NOTIFICATION): _S.ACTIVE,
    (_S.ACTIVE, _T.MEDIA): _S.ACTIVE,
    (_S.ACTIVE, _T.HANGUP): _S.CLOSING,
    (_S.ACTIVE, _T.CONNECTION_CLOSED): _S.CLOSED,
    (_S.PAUSED, _T.MEDIA_XON): _S.ACTIVE,
    (_S.PAUSED, _T.MEDIA_XOFF): _S.PAUSED,
    (_S.PAUSED, _T.NOTIFICATION): _S.PAUSED,
    (_S.PAUSED, _T.MEDIA): _S.PAUSED,
    (_S.PAUSED, _T.HANGUP): _S.CLOSING,
    (_S.PAUSED, _T.CONNECTION_CLOSED): _S.CLOSED,
    (_S.CLOSING, _T.MEDIA_XOFF): _S.CLOSING,
    (_S.CLOSING, _T.MEDIA_XON): _S.CLOSING,
    (_S.CLOSING, _T.NOTIFICATION): _S.CLOSING,
    (_S.CLOSING, _T.MEDIA): _S.CLOSING,
    (_S.CLOSING, _T.CONNECTION_CLOSED): _S.CLOSED,
    (_S.CLOSED, _T.CONNECTION_CLOSED): _S.CLOSED,
    (_S.FAILED, _T.CONNECTION_CLOSED): _S.CLOSED,
}

_STARTED: Final = frozenset({_S.ACTIVE, _S.PAUSED})


# --------------------------------------------------------------------------- commands


def encode_command(
    command: Command,
    control_format: ControlFormat,
    *,
    correlation_id: str | None = None,
    direction: MediaDirection | None = None,
) -> str:
    """The TEXT frame for ``command`` in ``control_format`` [WS Commands].

    plain-text: ``NAME`` or ``NAME <correlation_id>`` (``MARK_MEDIA``,
    ``STOP_MEDIA_BUFFERING``). json: compact ``{"command":"NAME"}``, plus
    ``"correlation_id"`` or ``"direction"`` (``SET_MEDIA_DIRECTION``, JSON only).
    Raises :class:`AsteriskUsageError` for a bad argument or a frame over 128 bytes.
    """
    if correlation_id is not None:
        if command not in _TAKES_CORRELATION_ID:
            raise AsteriskUsageError(
                AsteriskErrorCode.INVALID_ARGUMENT, f"{command} takes no correlation_id"
            )
        if not _CORRELATION_ID.fullmatch(correlation_id):
            raise AsteriskUsageError(
                AsteriskErrorCode.INVALID_CORRELATION_ID,
                "correlation_id must be 1..128 of A-Z a-z 0-9 . _ : @ / + = ~ -",
            )
    if (direction is not None) != (command is Command.SET_MEDIA_DIRECTION):
        raise AsteriskUsageError(
            AsteriskErrorCode.INVALID_ARGUMENT, "direction goes with SET_MEDIA_DIRECTION only"
        )
    if control_format is ControlFormat.PLAIN_TEXT:
        if command is Command.SET_MEDIA_DIRECTION:
            raise AsteriskUsageError(
                AsteriskErrorCode.JSON_ONLY, "SET_MEDIA_DIRECTION needs the json format"
            )
        text = command.value if correlation_id is None else f"{command} {correlation_id}"
    else:
        obj: dict[str, str] = {"command": command.value}
        if correlation_id is not None:
            obj["correlation_id"] = correlation_id
        if direction is not None:
            obj["direction"] = direction.value
        text = json.dumps(obj, separators=(",", ":"))
    if len(text.encode()) > COMMAND_MAX_BYTES:
        raise AsteriskUsageError(
            AsteriskErrorCode.COMMAND_TOO_LONG, f"command is over {COMMAND_MAX_BYTES} bytes"
        )
    return text


# --------------------------------------------------------------------------- event decoding


class _Fields(Protocol):
    """Typed access to one event's parameters, whatever the control format."""

    def text(self, key: str) -> str: ...
    def optional_text(self, key: str) -> str | None: ...
    def integer(self, key: str) -> int: ...
    def optional_integer(self, key: str) -> int | None: ...
    def flag(self, key: str) -> bool: ...
    def variables(self, key: str) -> Mapping[str, str]: ...
    def call_id(self, key: str) -> str: ...
    def optional_call_id(self, key: str) -> str | None: ...


def _checked_call_id(event: str, key: str, value: str) -> str:
    """``value`` if it obeys :func:`telephony.limits.call_id_problem`."""
    problem = call_id_problem(value)
    if problem is not None:
        raise _fail(AsteriskErrorCode.INVALID_ID, f"{event} {key} {excerpt(value)} {problem}")
    return value


class _PlainFields:
    """``key:value`` parameters of a plain-text event (all values are strings)."""

    def __init__(self, event: str, values: Mapping[str, str]) -> None:
        self._event = event
        self._values = values

    def optional_text(self, key: str) -> str | None:
        return self._values.get(key)

    def text(self, key: str) -> str:
        value = self._values.get(key)
        if value is None:
            raise _fail(AsteriskErrorCode.MISSING_FIELD, f"{self._event} has no {key}")
        return value

    def optional_integer(self, key: str) -> int | None:
        value = self._values.get(key)
        if value is None:
            return None
        # int() raises ValueError past 4,300 digits; Asterisk writes these with %d/%u [src]
        if len(value) > _MAX_INTEGER_DIGITS or not (value.isascii() and value.isdigit()):
            raise _fail(AsteriskErrorCode.INVALID_FIELD, f"{self._event} {key} is not an integer")
        return int(value)

    def integer(self, key: str) -> int:
        value = self.optional_integer(key)
        if value is None:
            raise _fail(AsteriskErrorCode.MISSING_FIELD, f"{self._event} has no {key}")
        return value

    def flag(self, key: str) -> bool:
        value = self.text(key)
        if value not in ("true", "false"):  # [src _create_event_STATUS]
            raise _fail(AsteriskErrorCode.INVALID_FIELD, f"{self._event} {key} is not a bool")
        return value == "true"

    def variables(self, key: str) -> Mapping[str, str]:
        return {}  # channel variables exist only in JSON [WS Events footnote 2]

    def call_id(self, key: str) -> str:
        return _checked_call_id(self._event, key, self.text(key))

    def optional_call_id(self, key: str) -> str | None:
        value = self.optional_text(key)
        return None if value is None else _checked_call_id(self._event, key, value)


class _JsonFields:
    """Members of a JSON event object, type-checked."""

    def __init__(self, event: str, obj: Mapping[str, Any]) -> None:
        self._event = event
        self._obj = obj

    def _get(self, key: str) -> Any:
        if key not in self._obj:
            raise _fail(AsteriskErrorCode.MISSING_FIELD, f"{self._event} has no {key}")
        return self._obj[key]

    def _bad(self, key: str, kind: str) -> AsteriskProtocolError:
        return _fail(AsteriskErrorCode.INVALID_FIELD, f"{self._event} {key} is not {kind}")

    def text(self, key: str) -> str:
        value = self._get(key)
        if not isinstance(value, str):
            raise self._bad(key, "a string")
        return value

    def optional_text(self, key: str) -> str | None:
        return self.text(key) if key in self._obj else None

    def integer(self, key: str) -> int:
        value = self._get(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._bad(key, "an integer")
        return value

    def optional_integer(self, key: str) -> int | None:
        return self.integer(key) if key in self._obj else None

    def flag(self, key: str) -> bool:
        value = self._get(key)
        if not isinstance(value, bool):
            raise self._bad(key, "a boolean")
        return value

    def variables(self, key: str) -> Mapping[str, str]:
        if key not in self._obj:
            return {}
        value = self._obj[key]
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise self._bad(key, "an object of strings")
        return dict(value)

    def call_id(self, key: str) -> str:
        return _checked_call_id(self._event, key, self.text(key))

    def optional_call_id(self, key: str) -> str | None:
        value = self.optional_text(key)
        return None if value is None else _checked_call_id(self._event, key, value)


def _decode_media_start(f: _Fields) -> MediaStart:
    codec_name = f.text("format")
    codec = CODECS.get(codec_name)
    if codec is None:
        raise _fail(
            AsteriskErrorCode.UNSUPPORTED_CODEC, f"codec {codec_name[:32]!r} is not supported"
        )
    frame = f.integer("optimal_frame_size")
    if frame <= 0 or frame > MAX_MESSAGE_BYTES or frame % codec.sample_bytes:
        raise _fail(
            AsteriskErrorCode.INVALID_FRAME_SIZE,
            f"optimal_frame_size {frame} is unusable for {codec.name}",
        )
    ptime = f.optional_integer("ptime")
    if ptime is not None and ptime <= 0:
        raise _fail(AsteriskErrorCode.INVALID_FIELD, "MEDIA_START ptime must be positive")
    return MediaStart(
        connection_id=f.call_id("connection_id"),
        channel=f.text("channel"),
        channel_id=f.optional_call_id("channel_id"),
        codec=codec.name,
        format=codec.format,
        sample_rate=codec.sample_rate,
        optimal_frame_size=frame,
        ptime=20 if ptime is None else ptime,
        channel_variables=f.variables("channel_variables"),
    )


def _decode_dtmf_end(f: _Fields) -> DtmfEnd:
    digit = f.text("digit")
    if len(digit) != 1:
        raise _fail(AsteriskErrorCode.INVALID_FIELD, "DTMF_END digit is not one character")
    return DtmfEnd(digit=digit, channel_id=f.optional_call_id("channel_id"))


def _decode_mark_processed(f: _Fields) -> MediaMarkProcessed:
    return MediaMarkProcessed(
        correlation_id=f.optional_text("correlation_id") or "",
        channel_id=f.optional_call_id("channel_id"),
    )


def _decode_buffering_completed(f: _Fields) -> MediaBufferingCompleted:
    # JSON sends "" when STOP_MEDIA_BUFFERING had no id [src S_OR(id, "")].
    return MediaBufferingCompleted(
        correlation_id=f.optional_text("correlation_id") or None,
        channel_id=f.optional_call_id("channel_id"),
    )


def _decode_status(f: _Fields) -> DriverStatus:
    return DriverStatus(
        channel_id=f.optional_call_id("channel_id"),
        queue_length=f.integer("queue_length"),
        xon_level=f.integer("xon_level"),
        xoff_level=f.integer("xoff_level"),
        queue_full=f.flag("queue_full"),
        bulk_media=f.flag("bulk_media"),
        media_paused=f.flag("media_paused"),
    )


def _decode_error(f: _Fields) -> DriverError:
    # Some error texts end in "\n" [src handle_command, SET_MEDIA_DIRECTION].
    return DriverError(
        error_text=f.text("error_text").strip(), channel_id=f.optional_call_id("channel_id")
    )


class _PlainShape(enum.Enum):
    """How a plain-text event lays out its parameters after the name."""

    KEY_VALUE = "key_value"  # key:value key:value ...
    KEY_VALUE_TEXT_LAST = "key_value_text_last"  # ... error_text:<rest of the line>
    CORRELATION_ID = "correlation_id"  # the bare rest of the line, optional
    NONE = "none"  # nothing


@dataclass(frozen=True, slots=True)
class _EventSpec:
    trigger: Trigger
    plain: _PlainShape
    decode: Callable[[_Fields], AsteriskEvent]


#: The event registry [WS Events] [src _create_event_*].
_EVENTS: Final[Mapping[str, _EventSpec]] = {
    "MEDIA_START": _EventSpec(_T.MEDIA_START, _PlainShape.KEY_VALUE, _decode_media_start),
    "DTMF_END": _EventSpec(_T.NOTIFICATION, _PlainShape.KEY_VALUE, _decode_dtmf_end),
    "MEDIA_XOFF": _EventSpec(
        _T.MEDIA_XOFF, _PlainShape.NONE, lambda f: MediaXoff(f.optional_call_id("channel_id"))
    ),
    "MEDIA_XON": _EventSpec(
        _T.MEDIA_XON, _PlainShape.NONE, lambda f: MediaXon(f.optional_call_id("channel_id"))
    ),
    "MEDIA_MARK_PROCESSED": _EventSpec(
        _T.NOTIFICATION, _PlainShape.CORRELATION_ID, _decode_mark_processed
    ),
    "MEDIA_BUFFERING_COMPLETED": _EventSpec(
        _T.NOTIFICATION, _PlainShape.CORRELATION_ID, _decode_buffering_completed
    ),
    "QUEUE_DRAINED": _EventSpec(
        _T.NOTIFICATION, _PlainShape.NONE, lambda f: QueueDrained(f.optional_call_id("channel_id"))
    ),
    "STATUS": _EventSpec(_T.NOTIFICATION, _PlainShape.KEY_VALUE, _decode_status),
    "ERROR": _EventSpec(_T.NOTIFICATION, _PlainShape.KEY_VALUE_TEXT_LAST, _decode_error),
}


def _plain_key_values(event: str, rest: str, *, text_last: str | None) -> dict[str, str]:
    """Split ``key:value key:value`` (single spaces; a value runs to the next space).

    ``text_last`` names a key whose value is the rest of the line, spaces included.
    """
    values: dict[str, str] = {}
    remaining = rest
    while remaining:
        token, _, after = remaining.partition(" ")
        key, colon, value = token.partition(":")
        if not colon or not key:
            raise _fail(
                AsteriskErrorCode.MALFORMED_MESSAGE,
                f"{event} parameter {token[:32]!r} is not key:value",
            )
        if key == text_last:
            values[key] = remaining[len(key) + 1 :]
            break
        values[key] = value
        remaining = after.lstrip(" ")
    return values


def _parse_plain(text: str) -> tuple[str, _Fields]:
    line = text.strip()
    if not line:
        raise _fail(AsteriskErrorCode.MALFORMED_MESSAGE, "empty control message")
    if "\n" in line or "\r" in line:
        raise _fail(AsteriskErrorCode.MALFORMED_MESSAGE, "plain-text message has several lines")
    name, _, rest = line.partition(" ")
    rest = rest.strip(" ")
    spec = _EVENTS.get(name)
    if spec is None:
        raise _fail(AsteriskErrorCode.UNKNOWN_EVENT, f"unknown event {name[:64]!r}")
    values: dict[str, str]
    if spec.plain is _PlainShape.CORRELATION_ID:
        values = {"correlation_id": rest} if rest else {}
    elif spec.plain is _PlainShape.NONE:
        values = {}
    else:
        text_last = "error_text" if spec.plain is _PlainShape.KEY_VALUE_TEXT_LAST else None
        values = _plain_key_values(name, rest, text_last=text_last)
    return name, _PlainFields(name, values)


def _parse_json(text: str) -> tuple[str, _Fields]:
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise _fail(AsteriskErrorCode.INVALID_JSON, f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise _fail(AsteriskErrorCode.INVALID_JSON, "not a JSON object")
    if "event" not in obj:
        raise _fail(AsteriskErrorCode.MISSING_FIELD, "no event member")
    name = obj["event"]
    if not isinstance(name, str):
        raise _fail(AsteriskErrorCode.INVALID_FIELD, "event is not a string")
    if name not in _EVENTS:
        raise _fail(AsteriskErrorCode.UNKNOWN_EVENT, f"unknown event {name[:64]!r}")
    return name, _JsonFields(name, obj)


# --------------------------------------------------------------------------- connection


class AsteriskConnection:
    """One ``chan_websocket`` media leg.

    Feed TEXT frames to :meth:`receive_text` and BINARY frames to :meth:`receive_bytes`;
    send the strings the command methods return as TEXT frames and the byte strings from
    :meth:`media_frames` as BINARY frames, in the order returned. Call
    :meth:`connection_closed` when the socket closes.

    ``control_format`` None detects the format from ``MEDIA_START``, the first message
    Asterisk sends [src websocket_handoff_to_channel]; a later frame in the other format is
    remote misbehaviour.
    """

    def __init__(
        self,
        *,
        control_format: ControlFormat | None = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        max_text_chars: int = DEFAULT_MAX_TEXT_CHARS,
        max_pending_marks: int = DEFAULT_MAX_PENDING_MARKS,
    ) -> None:
        if not 0 < max_message_bytes <= MAX_MESSAGE_BYTES:
            raise ValueError(f"max_message_bytes must be in 1..{MAX_MESSAGE_BYTES}")
        if max_text_chars <= 0 or max_pending_marks <= 0:
            raise ValueError("limits must be positive")
        self._format = control_format
        self._max_message_bytes = max_message_bytes
        self._max_text_chars = max_text_chars
        self._max_pending_marks = max_pending_marks
        self._state = AsteriskState.AWAITING_MEDIA_START
        self._start: MediaStart | None = None
        self._codec: AsteriskCodec | None = None
        self._tail = b""  # outbound audio short of a whole frame
        self._pending: list[str] = []  # MARK_MEDIA ids not yet processed, oldest first
        self._flushed: set[str] = set()  # ids dropped by FLUSH_MEDIA, maybe still in flight

    # ----------------------------------------------------------------- properties

    @property
    def state(self) -> AsteriskState:
        return self._state

    @property
    def can_send(self) -> bool:
        """True when media may be sent: after ``MEDIA_START`` and not paused by XOFF."""
        return self._state is AsteriskState.ACTIVE

    @property
    def control_format(self) -> ControlFormat | None:
        return self._format

    @property
    def media_start(self) -> MediaStart | None:
        return self._start

    @property
    def pending_marks(self) -> tuple[str, ...]:
        return tuple(self._pending)

    @property
    def buffered_bytes(self) -> int:
        """Outbound audio held back because it does not fill a frame."""
        return len(self._tail)

    # ----------------------------------------------------------------- state table

    def _move(self, trigger: Trigger, *, remote: bool) -> None:
        next_state = TRANSITIONS.get((self._state, trigger))
        if next_state is not None:
            self._state = next_state
            return
        if self._state is AsteriskState.FAILED:
            raise AsteriskUsageError(
                AsteriskErrorCode.CONNECTION_FAILED, f"{trigger.value} after a protocol error"
            )
        if self._state is AsteriskState.CLOSED or not remote:
            code = (
                AsteriskErrorCode.NOT_STARTED
                if self._state is AsteriskState.AWAITING_MEDIA_START
                else AsteriskErrorCode.CLOSED
            )
            raise AsteriskUsageError(code, f"{trigger.value} in state {self._state.value}")
        if trigger is Trigger.MEDIA:
            raise _fail(AsteriskErrorCode.MEDIA_BEFORE_START, "BINARY frame before MEDIA_START")
        raise _fail(
            AsteriskErrorCode.UNEXPECTED_EVENT, f"{trigger.value} in state {self._state.value}"
        )

    def _guard_remote(self) -> None:
        """Inbound frames after close or failure are the caller's mistake, not Asterisk's."""
        if self._state is AsteriskState.FAILED:
            raise AsteriskUsageError(
                AsteriskErrorCode.CONNECTION_FAILED, "frame received after a protocol error"
            )
        if self._state is AsteriskState.CLOSED:
            raise AsteriskUsageError(AsteriskErrorCode.CLOSED, "frame received after close")

    # ----------------------------------------------------------------- inbound

    def receive_text(self, text: str) -> list[AsteriskEvent]:
        """Parse one TEXT frame; return its events (one, or none for a late flushed mark).

        Raises :class:`AsteriskProtocolError` on remote misbehaviour (the state becomes
        ``FAILED``).
        """
        self._guard_remote()
        try:
            return self._receive_text(text)
        except AsteriskProtocolError:
            self._state = AsteriskState.FAILED
            raise

    def _receive_text(self, text: str) -> list[AsteriskEvent]:
        if len(text) > self._max_text_chars:
            raise _fail(
                AsteriskErrorCode.MESSAGE_TOO_LARGE,
                f"{len(text)} characters, limit {self._max_text_chars}",
            )
        looks_json = text.lstrip().startswith("{")
        if self._format is None:
            self._format = ControlFormat.JSON if looks_json else ControlFormat.PLAIN_TEXT
        if looks_json != (self._format is ControlFormat.JSON):
            raise _fail(
                AsteriskErrorCode.WRONG_CONTROL_FORMAT,
                f"a {'json' if looks_json else 'plain-text'} frame on a {self._format} leg",
            )
        name, fields = (
            _parse_json(text) if self._format is ControlFormat.JSON else _parse_plain(text)
        )
        spec = _EVENTS[name]
        if TRANSITIONS.get((self._state, spec.trigger)) is None:
            self._move(spec.trigger, remote=True)  # raises the right error
        event = spec.decode(fields)
        events: list[AsteriskEvent] = [event]
        if isinstance(event, MediaStart):
            if event.optimal_frame_size > self._max_message_bytes:
                raise _fail(
                    AsteriskErrorCode.INVALID_FRAME_SIZE,
                    f"optimal_frame_size {event.optimal_frame_size} is over this leg's "
                    f"max_message_bytes {self._max_message_bytes}",
                )
            self._start = event
            self._codec = CODECS[event.codec]
        elif isinstance(event, MediaMarkProcessed):
            events = self._mark_processed(event)
        self._move(spec.trigger, remote=True)
        return events

    def _mark_processed(self, event: MediaMarkProcessed) -> list[AsteriskEvent]:
        mark = event.correlation_id
        if mark in self._pending:
            self._pending.remove(mark)
            # Events arrive in order, so a mark sent after the last flush being processed
            # means no event for a flushed mark can still be in flight.
            self._flushed.clear()
            return [event]
        if mark in self._flushed:
            # Processed just before FLUSH_MEDIA reached Asterisk; already reported cleared.
            self._flushed.discard(mark)
            return []
        raise _fail(AsteriskErrorCode.UNKNOWN_MARK, f"MEDIA_MARK_PROCESSED for {mark[:64]!r}")

    def receive_bytes(self, data: bytes) -> list[AsteriskEvent]:
        """One BINARY frame: media in the ``MEDIA_START`` codec [WS Media Transfer]."""
        self._guard_remote()
        try:
            if TRANSITIONS.get((self._state, Trigger.MEDIA)) is None:
                self._move(Trigger.MEDIA, remote=True)
            if self._codec is None:  # CLOSING by a hangup() before MEDIA_START
                raise _fail(AsteriskErrorCode.MEDIA_BEFORE_START, "BINARY frame before MEDIA_START")
            if len(data) > MAX_MESSAGE_BYTES:
                raise _fail(
                    AsteriskErrorCode.MESSAGE_TOO_LARGE,
                    f"{len(data)} bytes, limit {MAX_MESSAGE_BYTES}",
                )
            if not data or len(data) % self._codec.sample_bytes:
                raise _fail(
                    AsteriskErrorCode.INVALID_MEDIA,
                    f"{len(data)} bytes is not whole {self._codec.name} samples",
                )
        except AsteriskProtocolError:
            self._state = AsteriskState.FAILED
            raise
        self._move(Trigger.MEDIA, remote=True)
        return [MediaReceived(bytes(data))]

    def connection_closed(self) -> tuple[str, ...]:
        """The socket closed. Returns the marks Asterisk never reported (now cleared)."""
        self._move(Trigger.CONNECTION_CLOSED, remote=False)
        unreported = tuple(self._pending)
        self._pending.clear()
        self._flushed.clear()
        self._tail = b""
        return unreported

    # ----------------------------------------------------------------- outbound media

    def _require_can_send(self, what: str) -> AsteriskCodec:
        if self._state is AsteriskState.PAUSED:
            raise AsteriskUsageError(
                AsteriskErrorCode.FLOW_PAUSED, f"{what} while paused by MEDIA_XOFF"
            )
        self._require_started(what)
        assert self._codec is not None
        return self._codec

    def media_frames(self, audio: bytes) -> list[bytes]:
        """Split ``audio`` into BINARY messages for Asterisk.

        Each message is a whole number of ``optimal_frame_size`` frames and at most
        ``max_message_bytes`` (never over 65,500) long. Outside bulk buffering, "if you
        send an oddly sized message though, the extra data that won't fill a frame will be
        dropped" [WS Media Transfer], so a tail shorter than one frame is kept and goes in
        front of the next call's audio; :meth:`flush_tail` pads it out with silence.
        Raises :class:`AsteriskUsageError` unless :attr:`can_send`.
        """
        self._require_can_send("media_frames")
        assert self._start is not None
        frame = self._start.optimal_frame_size
        data = self._tail + audio if self._tail else bytes(audio)
        whole = len(data) - len(data) % frame
        self._tail = data[whole:]
        step = self._max_message_bytes // frame * frame
        return [data[offset : min(offset + step, whole)] for offset in range(0, whole, step)]

    def flush_tail(self) -> list[bytes]:
        """The held-back tail padded with codec silence to one frame (``[]`` if none)."""
        codec = self._require_can_send("flush_tail")
        assert self._start is not None
        if not self._tail:
            return []
        missing = self._start.optimal_frame_size - len(self._tail)
        # Exactly one frame even when the tail ends in part of a sample (audio handed to
        # media_frames in odd-sized chunks): a short frame would be dropped [WS Media
        # Transfer]. Silence is the same byte repeated in every codec here.
        padding = codec.silence * -(-missing // codec.sample_bytes)
        frame = self._tail + padding[:missing]
        self._tail = b""
        return [frame]

    # ----------------------------------------------------------------- outbound commands

    def _require_started(self, what: str) -> ControlFormat:
        if self._state not in _STARTED:
            if self._state is AsteriskState.FAILED:
                code = AsteriskErrorCode.CONNECTION_FAILED
            elif self._state is AsteriskState.AWAITING_MEDIA_START:
                code = AsteriskErrorCode.NOT_STARTED
            else:
                code = AsteriskErrorCode.CLOSED
            raise AsteriskUsageError(code, f"{what} in state {self._state.value}")
        assert self._format is not None
        return self._format

    def _command(self, command: Command, *, correlation_id: str | None = None) -> str:
        fmt = self._require_started(command.value)
        return encode_command(command, fmt, correlation_id=correlation_id)

    def answer(self) -> str:
        """``ANSWER``: answer the channel (needed with the ``n`` dial option) [WS Commands]."""
        return self._command(Command.ANSWER)

    def hangup(self) -> str:
        """``HANGUP``: hang up the channel; Asterisk then closes the socket [WS Commands]."""
        if self._state is AsteriskState.FAILED:  # even when it failed before the format
            raise AsteriskUsageError(
                AsteriskErrorCode.CONNECTION_FAILED, "hangup after a protocol error"
            )
        if self._format is None:
            raise AsteriskUsageError(
                AsteriskErrorCode.FORMAT_UNKNOWN, "HANGUP before the control format is known"
            )
        text = encode_command(Command.HANGUP, self._format)
        self._move(Trigger.HANGUP, remote=False)
        return text

    def mark_media(self, correlation_id: str) -> str:
        """``MARK_MEDIA``: Asterisk answers ``MEDIA_MARK_PROCESSED`` with this id once all
        media sent before it has gone to the core [WS Commands]."""
        self._require_started(Command.MARK_MEDIA.value)  # the state's refusal comes first
        if correlation_id in self._pending or correlation_id in self._flushed:
            raise AsteriskUsageError(
                AsteriskErrorCode.DUPLICATE_MARK, f"mark {excerpt(correlation_id)} is outstanding"
            )
        if len(self._pending) >= self._max_pending_marks:
            raise AsteriskUsageError(
                AsteriskErrorCode.TOO_MANY_MARKS,
                f"{len(self._pending)} marks outstanding, limit {self._max_pending_marks}",
            )
        text = self._command(Command.MARK_MEDIA, correlation_id=correlation_id)
        self._pending.append(correlation_id)
        return text

    def flush_media(self) -> FlushMedia:
        """``FLUSH_MEDIA`` (barge-in): Asterisk discards everything queued [WS Commands].

        Outstanding marks are returned as cleared; the held-back tail is dropped too.
        The page says a flush also ends a ``PAUSE_MEDIA``; the source leaves the pause
        flag alone [src handle_command], so send ``CONTINUE_MEDIA`` if you paused.
        """
        text = self._command(Command.FLUSH_MEDIA)
        cleared = tuple(self._pending)
        self._flushed.update(self._pending)
        self._pending.clear()
        self._tail = b""
        return FlushMedia(text, cleared)

    def start_media_buffering(self) -> str:
        """``START_MEDIA_BUFFERING`` [WS Commands]."""
        return self._command(Command.START_MEDIA_BUFFERING)

    def stop_media_buffering(self, correlation_id: str | None = None) -> str:
        """``STOP_MEDIA_BUFFERING [<correlation_id>]``; answered by
        ``MEDIA_BUFFERING_COMPLETED`` [WS Commands]."""
        return self._command(Command.STOP_MEDIA_BUFFERING, correlation_id=correlation_id)

    def pause_media(self) -> str:
        """``PAUSE_MEDIA``: play silence, keep the queue [WS Commands]."""
        return self._command(Command.PAUSE_MEDIA)

    def continue_media(self) -> str:
        """``CONTINUE_MEDIA`` [WS Commands]."""
        return self._command(Command.CONTINUE_MEDIA)

    def get_status(self) -> str:
        """``GET_STATUS``; answered by ``STATUS`` [WS Commands]."""
        return self._command(Command.GET_STATUS)

    def report_queue_drained(self) -> str:
        """``REPORT_QUEUE_DRAINED``; answered once by ``QUEUE_DRAINED`` [WS Commands]."""
        return self._command(Command.REPORT_QUEUE_DRAINED)
