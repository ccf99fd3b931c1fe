"""jambonz ``listen``/``stream`` audio WebSocket, bidirectional: a sans-I/O protocol core.

jambonz's feature server runs the ``listen`` verb (``stream`` is an alias of it,
``lib/tasks/make_task.js`` [listen.js]) by having FreeSWITCH's ``mod_audio_fork`` open a
WebSocket to our URL. We are the server. This module turns frames into typed events and
intents into frames; it never touches a socket, a clock or an event loop.

Vendor references, cited below by the tag in brackets:

* [listen] jambonz documentation, "listen" verb, https://docs.jambonz.org/verbs/verbs/listen
  (parameters ``sampleRate``, ``mixType``, ``metadata``, ``passDtmf``,
  ``bidirectionalAudio.enabled|streaming|sampleRate``) and its previous edition,
  https://www.jambonz.org/docs/webhooks/listen/ (source: jambonz/next-static-site
  ``markdown/docs/webhooks/listen.md``, section "Bidirectional audio").
* [bidi] "Bidirectional (streaming) audio",
  https://www.jambonz.org/docs/supporting-articles/bidirectional-audio/ (jambonz/next-static-site
  ``markdown/docs/supporting-articles/bidirectional-audio.md``).
* [listen.js] jambonz/jambonz-feature-server ``lib/tasks/listen.js`` (0.9.8, commit 389c65e2),
  with ``lib/session/call-info.js`` (``toJSON``) [call-info] and ``lib/tasks/make_task.js``.
* [glue] jambonz/freeswitch-modules ``mod_audio_fork/lws_glue.cpp`` (commit 30f21899,
  2024-10-09): ``processIncomingMessage``, ``processIncomingBinary``, ``send_mark_event``,
  ``dub_speech_frame``; [pipe] ``mod_audio_fork/audio_pipe.cpp``; [mod]
  ``mod_audio_fork/mod_audio_fork.c``.
* [fsmrf] drachtio/drachtio-fsmrf ``lib/endpoint.js`` (``forkAudioStart``,
  ``forkAudioSendText``, ``_onDtmf``).

The wire, as confirmed there:

* Subprotocol ``audio.jambonz.org`` [listen]. (``mod_audio_fork`` defaults to
  ``audio.drachtio.org``; jambonz sets ``MOD_AUDIO_FORK_SUBPROTOCOL_NAME=audio.jambonz.org``,
  jambonz/next-static-site ``markdown/docs/open-source/self-host.md``.)
* jambonz to us: first one TEXT frame of JSON metadata, then BINARY frames of 16-bit PCM at
  ``sampleRate`` [listen]. The metadata is ``{sampleRate, mixType}``, then the call's
  attributes (``callSid``, ``direction``, ``from``, ``to``, ``callId``, ``accountSid``, ...,
  ``customerData`` when set), then the members of the verb's ``metadata`` object, all merged
  into ONE top-level object [listen.js ``_startListening``, call-info ``toJSON``]: custom
  data is not nested under a ``metadata`` key. ``mixType`` is ``mono``, ``mixed`` (one
  channel) or ``stereo`` (two channels [listen]; interleaved, FreeSWITCH's stereo
  media-bug layout, not stated by jambonz). ``sampleRate`` may be 8000, 16000,
  24000, 48000 or 64000 [listen]; this gateway speaks the first four
  (:data:`SUPPORTED_SAMPLE_RATES`).
* jambonz to us, TEXT after the metadata: ``{"event":"dtmf","dtmf":"5","duration":"2000"}``
  when ``passDtmf`` is set [listen.js ``_onDtmf``]; ``duration`` is FreeSWITCH's
  ``DTMF-Duration`` header, a decimal string [fsmrf ``_onDtmf``], which listen.js converts
  to milliseconds as ``duration / 8000 * 1000``; this core does the same (floor).
  ``{"type": "mark", "data": {"name":"<name>", "event": "playout"|"cleared"}}`` [glue
  ``send_mark_event``]. ``{"type":"playDone","data":{"id":...,...}}`` after a ``playAudio``
  file finished [listen (``{"type": "playDone"}``), listen.js ``_playAudio``]. Nothing
  else is ever written to the socket by listen.js or mod_audio_fork, so any other text
  frame raises ``unknown_message`` (the gateway logs it and closes the leg, as it does for
  every malformed vendor message). A zero-length BINARY frame is how mod_audio_fork
  flushes on a graceful shutdown [pipe ``LWS_CALLBACK_CLIENT_WRITEABLE``]; it carries no
  audio and yields no event.
* us to jambonz, streaming (``bidirectionalAudio.streaming: true``): BINARY frames of
  linear-16 PCM at ``bidirectionalAudio.sampleRate`` [bidi]. Playout only runs when
  enabled, streaming AND ``bidirectionalAudio.sampleRate`` are all set [mod
  ``SMBF_WRITE_REPLACE``]; it has no default [listen], so the verb must set it, and tell
  this core with ``output_sample_rate`` when it differs from ``sampleRate`` (the metadata
  does not carry it). BINARY frames are discarded unless streaming [pipe].
* us to jambonz, not streaming: ``{"type":"playAudio","data":{"audioContentType":"raw",
  "sampleRate":N,"audioContent":<base64>}}`` [listen], handled only when bidirectional
  audio is enabled and not streaming [glue]. ``sampleRate`` must be a JSON number: the
  module reads ``valueint``, so a string reads as 0 and the file plays as 16 kHz (the
  page's example, ``"16000"``, works by accident) [glue]. This core adds
  ``"queuePlay": true`` so that successive files play in order rather than each
  discarding the queue [listen.js ``_onPlayAudio``], and an ``id`` that comes back in
  ``playDone`` [listen.js ``_playAudio``].
* us to jambonz, both modes: ``{"type":"killAudio"}`` stops playout and, when streaming,
  drops the buffered audio [listen, glue]; ``{"type":"mark","data":{"name":...}}``
  [glue]; ``{"type":"disconnect"}`` ends the ``listen`` verb, whose task then closes the
  socket [listen, listen.js ``_onDisconnect``]. It does not by itself hang up: the call
  goes on with the application's next verb, if any.

Marks (streaming only) [glue]: a mark waits in an "inventory" until the next BINARY frame,
then is put into the playout buffer as one sample of value 0xFFFF in front of that frame's
audio; when playout reaches it, jambonz sends ``"event": "playout"``. A mark with no audio
after it is reported as soon as the playout buffer is empty. ``killAudio`` reports every
mark not yet played with ``"event": "cleared"``. So, as in the Asterisk core
(``telephony/asterisk.py``), :meth:`JambonzConnection.kill_audio` returns the pending
marks as cleared at once, and swallows the echoes jambonz then sends for them (a
``playout`` that crossed the ``killAudio`` on the wire included): ``cleared`` means "not
confirmed played before the kill was sent". Vendor hazards this core handles or documents:

* A sample of value -1 (0xFFFF) in our audio is taken for a marker while marks are in use,
  dropped, and reported as the oldest mark's playout: early. :meth:`JambonzConnection.audio`
  therefore sends -1 samples as -2 when streaming (one LSB, inaudible).
* jambonz puts at most 30 marks in use or inventory and silently drops more (``MAX_MARKS``)
  [glue]: ``max_marks`` is at most :data:`VENDOR_MAX_MARKS`.
* jambonz writes the name into its JSON unescaped [glue ``send_mark_event``]: mark names
  are limited to characters that need no escaping (:data:`MARK_NAME_PATTERN`).
* ``clearMarks`` forgets marks without reporting them and leaves stale names that swallow
  later marks' reports [glue], so this core never sends it.
* After a ``killAudio`` that cleared marks already in the playout buffer, jambonz keeps
  their names and pairs them with the next markers (FIFO), so later reports can arrive
  late (never early) [glue ``dub_speech_frame``]. Not correctable from here.
* jambonz holds audio back in a pre-buffer until a threshold has accumulated (at most
  80 ms of audio; 160 ms before the first playout) [glue ``processIncomingBinary``]: the
  last frames of an utterance wait for the next audio, and a mark after them can be
  reported before they play. The gateway should end an utterance with at least 160 ms of
  silence before its mark.
* When ``bidirectionalAudio.sampleRate`` differs from the call's codec rate, jambonz
  resamples the marker samples along with the audio [glue], which makes marks unreliable.

States (one table, :data:`TRANSITIONS`)::

    AWAITING_METADATA --metadata--> STREAMING --audio|message|send--> STREAMING
    AWAITING_METADATA | STREAMING --disconnect()--> CLOSING --metadata|audio|message--> CLOSING
    any --connection_closed()--> CLOSED;  any --remote misbehaviour--> FAILED

A frame with no entry for the current state is remote misbehaviour and raises
:class:`JambonzProtocolError`; the connection is then ``FAILED``. Calling an intent in the
wrong state is local misuse and raises :class:`JambonzUsageError`; it changes nothing.

Not confirmed: that the PCM is little-endian (mod_audio_fork writes host-order samples;
every jambonz build is x86-64 or arm64, and third-party clients such as Pipecat's
serializer read it as little-endian); the exact effect of ``killAudio`` on a ``playAudio``
queue (listen.js runs ``uuid_break`` without ``all`` and does not empty its own queue of
up to 11 files, so queued files probably still play: prefer streaming); whether the
backslash escaping listen.js applies to string values of ``metadata``/``customerData``
survives to the wire (values are passed on as received); the unit of ``duration`` (8 kHz
ticks) is taken from listen.js's own conversion, not from FreeSWITCH's documentation.
"""

from __future__ import annotations

import base64
import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

from telephony.codecs.formats import AudioSpec, pcm
from telephony.core import CoreError, JsonFields
from telephony.limits import call_id_problem, excerpt

__all__ = [
    "CALL_ATTRIBUTES",
    "DEFAULT_MAX_MARKS",
    "DEFAULT_MAX_TEXT_BYTES",
    "FRAME_MS",
    "MARK_NAME_PATTERN",
    "MAX_ADDRESS_CHARS",
    "MAX_AUDIO_FRAME_SECONDS",
    "MAX_METADATA_ENTRIES",
    "MAX_METADATA_KEY_CHARS",
    "MAX_METADATA_VALUE_CHARS",
    "MIX_TYPES",
    "PLAY_AUDIO_MAX_TEXT_BYTES",
    "SUBPROTOCOL",
    "SUPPORTED_SAMPLE_RATES",
    "TRANSITIONS",
    "VENDOR_MAX_MARKS",
    "AudioReceived",
    "DtmfReceived",
    "JambonzConnection",
    "JambonzError",
    "JambonzErrorCode",
    "JambonzEvent",
    "JambonzProtocolError",
    "JambonzState",
    "JambonzUsageError",
    "MarkReported",
    "PlayDone",
    "StreamStarted",
    "Trigger",
]

#: The WebSocket subprotocol jambonz asks for [listen].
SUBPROTOCOL: Final = "audio.jambonz.org"

#: ``sampleRate`` values this gateway speaks (``pcm_<rate>`` formats); jambonz also allows
#: 64000 for ``listen`` [listen] and 32000 for ``playAudio`` [glue].
SUPPORTED_SAMPLE_RATES: Final = (8000, 16000, 24000, 48000)
#: ``mixType`` values and their channel counts [listen].
MIX_TYPES: Final[Mapping[str, int]] = {"mono": 1, "mixed": 1, "stereo": 2}
FRAME_MS: Final = 20  # outbound BINARY frames, streaming

#: Members of the metadata frame that are jambonz's, not the customer's: ``sampleRate`` and
#: ``mixType`` [listen.js], and what ``CallInfo.toJSON`` writes [call-info].
CALL_ATTRIBUTES: Final = frozenset(
    {
        "sampleRate",
        "mixType",
        "callSid",
        "direction",
        "from",
        "to",
        "callId",
        "sbcCallid",
        "sipStatus",
        "sipReason",
        "callStatus",
        "callerId",
        "accountSid",
        "traceId",
        "applicationSid",
        "fsSipAddress",
        "parentCallSid",
        "originatingSipIp",
        "originatingSipTrunkName",
        "callTerminationBy",
        "duration",
        "customerData",
        "headers",
        "apiBaseUrl",
        "fsPublicIp",
    }
)

DEFAULT_MAX_TEXT_BYTES: Final = 64 * 1024  # inbound TEXT frame limit (ours), UTF-8 bytes
#: mod_audio_fork's buffer holds at most MOD_AUDIO_FORK_BUFFER_SECS (1..5) seconds [glue],
#: so no inbound BINARY frame is longer; this bounds ours at 5 s of the stream's audio.
MAX_AUDIO_FRAME_SECONDS: Final = 5
#: Custom metadata kept in :attr:`StreamStarted.metadata` (ours; jambonz sets no bound).
MAX_METADATA_ENTRIES: Final = 32
MAX_METADATA_KEY_CHARS: Final = 64
MAX_METADATA_VALUE_CHARS: Final = 4096  # room for a bearer token
MAX_ADDRESS_CHARS: Final = 256  # ``from``/``to``/``direction`` (ours)
_MAX_INTEGER_DIGITS: Final = 20  # ``duration``: 20 digits hold any 64-bit counter

#: ``MAX_MARKS`` in mod_audio_fork: marks beyond it are dropped without a report [glue].
VENDOR_MAX_MARKS: Final = 30
DEFAULT_MAX_MARKS: Final = VENDOR_MAX_MARKS
#: jambonz writes mark names into JSON unescaped [glue send_mark_event].
MARK_NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9._:@/+=~-]{1,64}")

#: mod_audio_fork drops a TEXT message it must reassemble past 665,600 bytes
#: [pipe MAX_RECV_BUF_SIZE]; each ``playAudio`` frame stays well under that.
PLAY_AUDIO_MAX_TEXT_BYTES: Final = 512 * 1024
_PLAY_AUDIO_ENVELOPE_BYTES: Final = 256  # JSON around audioContent, generously
# PCM per playAudio frame: base64 of it plus the envelope fits; a multiple of 6 bytes
# (whole samples and whole base64 quanta, so no padding mid-stream).
_PLAY_AUDIO_MAX_PCM: Final = (PLAY_AUDIO_MAX_TEXT_BYTES - _PLAY_AUDIO_ENVELOPE_BYTES) // 8 * 6

_MARKER: Final = b"\xff\xff"  # mod_audio_fork's AUDIO_MARKER sample, 0xFFFF [glue]
_NOT_MARKER: Final = b"\xfe\xff"  # -2, little-endian


class JambonzErrorCode(enum.StrEnum):
    """Machine-readable codes carried by :class:`JambonzError` subclasses."""

    # Remote misbehaviour (JambonzProtocolError)
    INVALID_JSON = "invalid_json"  # not JSON, or not a JSON object
    MESSAGE_TOO_LARGE = "message_too_large"
    UNKNOWN_MESSAGE = "unknown_message"  # a type/event jambonz never sends
    UNEXPECTED_MESSAGE = "unexpected_message"  # a known frame the state table does not allow
    AUDIO_BEFORE_METADATA = "audio_before_metadata"
    MISSING_FIELD = "missing_field"
    INVALID_FIELD = "invalid_field"
    INVALID_ID = "invalid_id"  # callSid empty, over 128 characters, or not printable
    UNSUPPORTED_SAMPLE_RATE = "unsupported_sample_rate"
    INVALID_METADATA = "invalid_metadata"  # custom metadata over this core's bounds
    INVALID_AUDIO = "invalid_audio"  # not whole samples (of every channel)
    INVALID_DTMF = "invalid_dtmf"  # dtmf not one character, or a bad duration
    UNKNOWN_MARK = "unknown_mark"  # a mark report for a name we did not send
    # Local misuse (JambonzUsageError)
    NOT_STARTED = "not_started"  # before the metadata
    CLOSED = "closed"  # after disconnect() or connection_closed()
    CONNECTION_FAILED = "connection_failed"  # after a protocol error
    EMPTY_AUDIO = "empty_audio"
    INVALID_PCM = "invalid_pcm"  # our audio is an odd number of bytes
    INVALID_MARK_NAME = "invalid_mark_name"
    DUPLICATE_MARK = "duplicate_mark"
    TOO_MANY_MARKS = "too_many_marks"
    MARKS_NEED_STREAMING = "marks_need_streaming"  # marks only work on streamed audio
    UNSUPPORTED_FORMAT = "unsupported_format"  # format_name() for a rate we do not speak


class JambonzError(CoreError[JambonzErrorCode]):
    """Base of this module's errors: ``code`` for machines, ``message`` for the log."""


class JambonzProtocolError(JambonzError):
    """jambonz sent something the protocol does not allow (remote misbehaviour)."""


class JambonzUsageError(JambonzError):
    """This process called the core in a way its contract forbids (local misuse)."""


def _fail(code: JambonzErrorCode, message: str) -> JambonzProtocolError:
    return JambonzProtocolError(code, message)


# --------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class StreamStarted:
    """The metadata TEXT frame, sent once when the socket opens [listen]."""

    call_id: str  # callSid
    sample_rate: int  # of the audio jambonz sends
    mix_type: str  # mono, mixed or stereo
    channels: int  # 2 for stereo, else 1
    from_: str | None
    to: str | None
    direction: str | None  # inbound or outbound [call-info]
    #: String-valued members that are not :data:`CALL_ATTRIBUTES`: the verb's ``metadata``
    #: (non-string values are left out). May hold a token, so it is kept out of ``repr``.
    metadata: Mapping[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True, slots=True)
class AudioReceived:
    """One BINARY frame: L16 little-endian at ``sample_rate``, channels interleaved."""

    payload: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class DtmfReceived:
    """``{"event":"dtmf"}`` (``passDtmf``) [listen.js]; ``duration_ms`` when jambonz sent one."""

    digit: str
    duration_ms: int | None


@dataclass(frozen=True, slots=True)
class MarkReported:
    """``{"type":"mark"}`` [glue]: the mark's audio played, or was ``cleared`` by a kill."""

    name: str
    cleared: bool


@dataclass(frozen=True, slots=True)
class PlayDone:
    """``{"type":"playDone"}`` [listen, listen.js]: a ``playAudio`` file finished playing
    (or was cut short by ``killAudio``). ``play_id`` is the ``id`` this core gave it."""

    play_id: str | None


# jambonz sends no error message to the application, so there is no ErrorReported event.
JambonzEvent: TypeAlias = StreamStarted | AudioReceived | DtmfReceived | MarkReported | PlayDone


# --------------------------------------------------------------------------- states


class JambonzState(enum.Enum):
    AWAITING_METADATA = "awaiting_metadata"
    STREAMING = "streaming"
    CLOSING = "closing"  # we sent disconnect; frames may still arrive
    CLOSED = "closed"  # the socket is gone
    FAILED = "failed"  # jambonz misbehaved; close the leg


class Trigger(enum.Enum):
    """What moves the state machine: an inbound frame, or a local action."""

    METADATA = "metadata"  # the first TEXT frame
    AUDIO = "audio"  # a BINARY frame
    MESSAGE = "message"  # any later TEXT frame: dtmf, mark, playDone
    SEND = "send"  # we built audio, mark or killAudio frames
    DISCONNECT = "disconnect"  # we built a disconnect frame
    CONNECTION_CLOSED = "connection_closed"  # the socket closed, either side


_S = JambonzState
_T = Trigger

#: Every legal transition. ``METADATA`` is legal in ``CLOSING`` because we may disconnect
#: before it arrives; it is always the first TEXT frame [listen].
TRANSITIONS: Final[Mapping[tuple[JambonzState, Trigger], JambonzState]] = {
    (_S.AWAITING_METADATA, _T.METADATA): _S.STREAMING,
    (_S.AWAITING_METADATA, _T.DISCONNECT): _S.CLOSING,
    (_S.AWAITING_METADATA, _T.CONNECTION_CLOSED): _S.CLOSED,
    (_S.STREAMING, _T.AUDIO): _S.STREAMING,
    (_S.STREAMING, _T.MESSAGE): _S.STREAMING,
    (_S.STREAMING, _T.SEND): _S.STREAMING,
    (_S.STREAMING, _T.DISCONNECT): _S.CLOSING,
    (_S.STREAMING, _T.CONNECTION_CLOSED): _S.CLOSED,
    (_S.CLOSING, _T.METADATA): _S.CLOSING,
    (_S.CLOSING, _T.AUDIO): _S.CLOSING,
    (_S.CLOSING, _T.MESSAGE): _S.CLOSING,
    (_S.CLOSING, _T.CONNECTION_CLOSED): _S.CLOSED,
    (_S.CLOSED, _T.CONNECTION_CLOSED): _S.CLOSED,
    (_S.FAILED, _T.CONNECTION_CLOSED): _S.CLOSED,
}

_REMOTE: Final = frozenset({_T.METADATA, _T.AUDIO, _T.MESSAGE})


# --------------------------------------------------------------------------- helpers


def _dumps(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"))


_KILL_AUDIO: Final = _dumps({"type": "killAudio"})
_DISCONNECT: Final = _dumps({"type": "disconnect"})


def _utf8_length(text: str, limit: int) -> int:
    """``text``'s UTF-8 length, computed only when its character count cannot settle the
    comparison with ``limit`` (a character is 1..4 bytes)."""
    if len(text) > limit or len(text) * 4 <= limit:
        return len(text)
    return len(text.encode("utf-8", "surrogatepass"))


def _without_marker_samples(pcm: bytes) -> bytes:
    """``pcm`` with every sample of value -1 (0xFFFF, mod_audio_fork's marker) made -2."""
    index = pcm.find(_MARKER)
    if index < 0:
        return pcm
    out = bytearray(pcm)
    while index >= 0:
        if index % 2:  # the tail of one sample and the head of the next
            index = out.find(_MARKER, index + 1)
            continue
        out[index : index + 2] = _NOT_MARKER
        index = out.find(_MARKER, index + 2)
    return bytes(out)


_FIELDS: Final = JsonFields(
    JambonzProtocolError, JambonzErrorCode.MISSING_FIELD, JambonzErrorCode.INVALID_FIELD
)
_get = _FIELDS.get
_str = _FIELDS.string
_object = _FIELDS.object


def _optional_address(obj: Mapping[str, Any], key: str) -> str | None:
    """``from``/``to``/``direction``: absent (JSON.stringify drops undefined) or a string."""
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _fail(JambonzErrorCode.INVALID_FIELD, f"{key} must be a string")
    if len(value) > MAX_ADDRESS_CHARS:
        raise _fail(JambonzErrorCode.INVALID_FIELD, f"{key} is over {MAX_ADDRESS_CHARS} characters")
    return value


def _custom_metadata(msg: Mapping[str, Any]) -> dict[str, str]:
    custom = {
        key: value
        for key, value in msg.items()
        if key not in CALL_ATTRIBUTES and isinstance(value, str)
    }
    if len(custom) > MAX_METADATA_ENTRIES:
        raise _fail(
            JambonzErrorCode.INVALID_METADATA,
            f"{len(custom)} metadata entries, limit {MAX_METADATA_ENTRIES}",
        )
    for key, value in custom.items():
        if not key or len(key) > MAX_METADATA_KEY_CHARS:
            raise _fail(
                JambonzErrorCode.INVALID_METADATA,
                f"metadata key {excerpt(key)} is not 1..{MAX_METADATA_KEY_CHARS} characters",
            )
        if len(value) > MAX_METADATA_VALUE_CHARS:
            raise _fail(
                JambonzErrorCode.INVALID_METADATA,
                f"metadata {excerpt(key)} is over {MAX_METADATA_VALUE_CHARS} characters",
            )
    return custom


def _decode_metadata(msg: Mapping[str, Any]) -> StreamStarted:
    # [listen.js _startListening]: {sampleRate, mixType, ...CallInfo.toJSON(), ...metadata}
    call_id = _str(msg, "callSid", "callSid")
    problem = call_id_problem(call_id)
    if problem is not None:
        raise _fail(JambonzErrorCode.INVALID_ID, f"callSid {excerpt(call_id)} {problem}")
    rate = _get(msg, "sampleRate", "sampleRate")
    if isinstance(rate, bool) or not isinstance(rate, int):
        raise _fail(JambonzErrorCode.INVALID_FIELD, "sampleRate must be an integer")
    if rate not in SUPPORTED_SAMPLE_RATES:
        raise _fail(
            JambonzErrorCode.UNSUPPORTED_SAMPLE_RATE,
            f"sampleRate {rate} is not one of {SUPPORTED_SAMPLE_RATES}",
        )
    mix_type = _str(msg, "mixType", "mixType")
    channels = MIX_TYPES.get(mix_type)
    if channels is None:
        raise _fail(
            JambonzErrorCode.INVALID_FIELD,
            f"mixType {excerpt(mix_type)} is not one of {list(MIX_TYPES)}",
        )
    return StreamStarted(
        call_id=call_id,
        sample_rate=rate,
        mix_type=mix_type,
        channels=channels,
        from_=_optional_address(msg, "from"),
        to=_optional_address(msg, "to"),
        direction=_optional_address(msg, "direction"),
        metadata=_custom_metadata(msg),
    )


def _decode_dtmf(msg: Mapping[str, Any]) -> DtmfReceived:
    # [listen.js _onDtmf]: {event: 'dtmf', dtmf, duration}; duration is FreeSWITCH's
    # DTMF-Duration header, a string [fsmrf _onDtmf], absent when FreeSWITCH sent none.
    digit = msg.get("dtmf")
    if not isinstance(digit, str) or len(digit) != 1:
        shown = excerpt(digit) if isinstance(digit, str) else type(digit).__name__
        raise _fail(JambonzErrorCode.INVALID_DTMF, f"dtmf {shown} is not one character")
    duration = msg.get("duration")
    if duration is None:
        return DtmfReceived(digit, None)
    if (
        isinstance(duration, str)
        and 0 < len(duration) <= _MAX_INTEGER_DIGITS  # int() raises past 4,300 digits
        and duration.isascii()
        and duration.isdigit()
    ):
        ticks = int(duration)
    elif isinstance(duration, int) and not isinstance(duration, bool) and duration >= 0:
        ticks = duration
    else:
        raise _fail(JambonzErrorCode.INVALID_DTMF, "dtmf duration is not a non-negative integer")
    # listen.js: msDuration = Math.floor((duration / 8000) * 1000)
    return DtmfReceived(digit, ticks * 1000 // 8000)


# --------------------------------------------------------------------------- connection


class JambonzConnection:
    """One ``listen``/``stream`` audio WebSocket, seen from our server.

    Accept the socket with subprotocol :data:`SUBPROTOCOL`. Feed TEXT frames to
    :meth:`receive_text` and BINARY frames to :meth:`receive_binary`; put what the intents
    return on the socket in order, ``bytes`` as BINARY frames and ``str`` as TEXT frames.
    Call :meth:`connection_closed` when the socket closes.

    ``bidirectional_streaming`` must match the verb's ``bidirectionalAudio.streaming``;
    ``output_sample_rate`` its ``bidirectionalAudio.sampleRate`` (None: the same as the
    metadata's ``sampleRate``). ``max_text_bytes`` bounds inbound TEXT frames;
    ``max_marks`` the marks sent and not yet reported (at most :data:`VENDOR_MAX_MARKS`).
    """

    def __init__(
        self,
        *,
        bidirectional_streaming: bool = True,
        output_sample_rate: int | None = None,
        max_text_bytes: int = DEFAULT_MAX_TEXT_BYTES,
        max_marks: int = DEFAULT_MAX_MARKS,
    ) -> None:
        if max_text_bytes <= 0:
            raise ValueError("max_text_bytes must be positive")
        if not 0 < max_marks <= VENDOR_MAX_MARKS:
            raise ValueError(f"max_marks must be in 1..{VENDOR_MAX_MARKS}")
        if output_sample_rate is not None and output_sample_rate not in SUPPORTED_SAMPLE_RATES:
            raise ValueError(f"output_sample_rate must be one of {SUPPORTED_SAMPLE_RATES}")
        self._streaming = bidirectional_streaming
        self._output_rate = output_sample_rate
        self._max_text_bytes = max_text_bytes
        self._max_marks = max_marks
        self._state = JambonzState.AWAITING_METADATA
        self._started: StreamStarted | None = None
        self._pending: list[str] = []  # marks sent, not yet reported, oldest first
        self._flushed: set[str] = set()  # marks reported cleared by kill_audio, echo pending
        self._plays = 0  # playAudio frames built, for their ids

    # ----------------------------------------------------------------- properties

    @property
    def state(self) -> JambonzState:
        return self._state

    @property
    def stream_started(self) -> StreamStarted | None:
        """The metadata event, once received."""
        return self._started

    @property
    def call_id(self) -> str | None:
        return self._started.call_id if self._started is not None else None

    @property
    def sample_rate(self) -> int | None:
        """The rate of the audio jambonz sends, once the metadata is in."""
        return self._started.sample_rate if self._started is not None else None

    @property
    def output_sample_rate(self) -> int | None:
        """The rate of the audio we send: ``output_sample_rate``, else :attr:`sample_rate`."""
        return self._output_rate if self._output_rate is not None else self.sample_rate

    @property
    def pending_marks(self) -> tuple[str, ...]:
        """Marks sent and not yet reported, oldest first (kept after the socket closes)."""
        return tuple(self._pending)

    @staticmethod
    def audio_spec(sample_rate: int) -> AudioSpec:
        """What the stream carries at ``sample_rate``: L16 (16-bit PCM) at that rate."""
        if sample_rate not in SUPPORTED_SAMPLE_RATES:
            raise JambonzUsageError(
                JambonzErrorCode.UNSUPPORTED_FORMAT,
                f"no gateway format for {sample_rate} Hz; one of {SUPPORTED_SAMPLE_RATES}",
            )
        return pcm(sample_rate)

    @staticmethod
    def format_name(sample_rate: int) -> str:
        """The wire name of :meth:`audio` (``16000`` -> ``pcm_16000``), from the formats
        table."""
        return JambonzConnection.audio_spec(sample_rate).name

    # ----------------------------------------------------------------- state table

    def _next(self, trigger: Trigger) -> JambonzState:
        """The state ``trigger`` leads to; raises if the table has no entry for it."""
        next_state = TRANSITIONS.get((self._state, trigger))
        if next_state is not None:
            return next_state
        if self._state is JambonzState.FAILED:
            raise JambonzUsageError(
                JambonzErrorCode.CONNECTION_FAILED, f"{trigger.value} after a protocol error"
            )
        if self._state is JambonzState.CLOSED:
            raise JambonzUsageError(JambonzErrorCode.CLOSED, f"{trigger.value} after close")
        if trigger in _REMOTE:
            if trigger is Trigger.AUDIO:
                raise _fail(JambonzErrorCode.AUDIO_BEFORE_METADATA, "BINARY frame before metadata")
            raise _fail(
                JambonzErrorCode.UNEXPECTED_MESSAGE,
                f"{trigger.value} in state {self._state.value}",
            )
        code = (
            JambonzErrorCode.NOT_STARTED
            if self._state is JambonzState.AWAITING_METADATA
            else JambonzErrorCode.CLOSED
        )
        raise JambonzUsageError(code, f"{trigger.value} in state {self._state.value}")

    def _step(self, trigger: Trigger) -> None:
        """Take the transition for ``trigger``; raise (state unchanged) if it is illegal."""
        self._state = self._next(trigger)

    # ----------------------------------------------------------------- inbound

    def receive_text(self, text: str) -> list[JambonzEvent]:
        """Parse one TEXT frame: the metadata first, then dtmf, mark and playDone messages.

        Returns its events (none for the echo of a mark already reported cleared). Raises
        :class:`JambonzProtocolError` on remote misbehaviour (the state becomes ``FAILED``)
        and :class:`JambonzUsageError` after close or failure.
        """
        trigger = Trigger.METADATA if self._started is None else Trigger.MESSAGE
        try:
            next_state = self._next(trigger)
            events = self._receive_text(text)
        except JambonzProtocolError:
            self._state = JambonzState.FAILED
            raise
        self._state = next_state
        return events

    def _receive_text(self, text: str) -> list[JambonzEvent]:
        size = _utf8_length(text, self._max_text_bytes)
        if size > self._max_text_bytes:
            raise _fail(
                JambonzErrorCode.MESSAGE_TOO_LARGE,
                f"over {self._max_text_bytes} bytes ({len(text)} characters)",
            )
        try:
            msg = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise _fail(JambonzErrorCode.INVALID_JSON, f"not JSON: {exc}") from None
        if not isinstance(msg, dict):
            raise _fail(JambonzErrorCode.INVALID_JSON, "not a JSON object")
        if self._started is None:
            self._started = _decode_metadata(msg)
            return [self._started]
        if "type" in msg:
            kind = msg["type"]
            if kind == "mark":
                return self._decode_mark(msg)
            if kind == "playDone":
                return [self._decode_play_done(msg)]
            name = excerpt(kind) if isinstance(kind, str) else type(kind).__name__
            raise _fail(JambonzErrorCode.UNKNOWN_MESSAGE, f"unknown type {name}")
        if "event" in msg:
            kind = msg["event"]
            if kind == "dtmf":
                return [_decode_dtmf(msg)]
            name = excerpt(kind) if isinstance(kind, str) else type(kind).__name__
            raise _fail(JambonzErrorCode.UNKNOWN_MESSAGE, f"unknown event {name}")
        raise _fail(JambonzErrorCode.MISSING_FIELD, "message has neither type nor event")

    def _decode_mark(self, msg: Mapping[str, Any]) -> list[JambonzEvent]:
        # [glue send_mark_event]: {"type": "mark", "data": {"name":..., "event": ...}}
        data = _object(msg, "data", "data")
        name = _str(data, "name", "data.name")
        event = _str(data, "event", "data.event")
        if event not in ("playout", "cleared"):
            raise _fail(
                JambonzErrorCode.INVALID_FIELD,
                f"data.event {excerpt(event)} is not playout|cleared",
            )
        if name in self._pending:
            self._pending.remove(name)
            # jambonz reports in the order marks were sent, and the kill's "cleared" batch
            # before any later mark: no echo for a flushed mark can still be on its way.
            self._flushed.clear()
            return [MarkReported(name, event == "cleared")]
        if name in self._flushed:
            self._flushed.discard(name)  # already reported cleared by kill_audio
            return []
        raise _fail(
            JambonzErrorCode.UNKNOWN_MARK, f"report of mark {excerpt(name)} we did not send"
        )

    def _decode_play_done(self, msg: Mapping[str, Any]) -> PlayDone:
        # [listen] {"type": "playDone"}; [listen.js _playAudio] data: {id, ...play results}
        data = msg.get("data")
        if data is None:
            return PlayDone(None)
        if not isinstance(data, dict):
            raise _fail(JambonzErrorCode.INVALID_FIELD, "data must be an object")
        play_id = data.get("id")
        return PlayDone(play_id if isinstance(play_id, str) else None)

    def receive_binary(self, data: bytes) -> list[JambonzEvent]:
        """One BINARY frame: L16 at the metadata's ``sampleRate`` [listen].

        A zero-length frame (mod_audio_fork's graceful-shutdown flush [pipe]) yields no
        event. Audio before the metadata, or not whole samples of every channel, raises
        :class:`JambonzProtocolError`.
        """
        try:
            next_state = self._next(Trigger.AUDIO)
            started = self._started
            if started is None:  # CLOSING by a disconnect() before the metadata
                raise _fail(JambonzErrorCode.AUDIO_BEFORE_METADATA, "BINARY frame before metadata")
            frame_bytes = 2 * started.channels
            limit = started.sample_rate * frame_bytes * MAX_AUDIO_FRAME_SECONDS
            if len(data) > limit:
                raise _fail(JambonzErrorCode.MESSAGE_TOO_LARGE, f"{len(data)} bytes, limit {limit}")
            if len(data) % frame_bytes:
                raise _fail(
                    JambonzErrorCode.INVALID_AUDIO,
                    f"{len(data)} bytes is not whole {started.mix_type} L16 samples",
                )
        except JambonzProtocolError:
            self._state = JambonzState.FAILED
            raise
        self._state = next_state
        return [AudioReceived(bytes(data))] if data else []

    def connection_closed(self) -> None:
        """The socket closed. :attr:`pending_marks` keeps the marks never reported."""
        self._step(Trigger.CONNECTION_CLOSED)
        self._flushed.clear()

    # ----------------------------------------------------------------- outbound

    def audio(self, pcm: bytes) -> list[bytes | str]:
        """Frames that play ``pcm`` (mono L16 little-endian at :attr:`output_sample_rate`).

        Streaming: BINARY frames of :data:`FRAME_MS` each (the last may be shorter), with
        any -1 sample sent as -2 (see the module docstring). Otherwise ``playAudio`` TEXT
        frames, each at most :data:`PLAY_AUDIO_MAX_TEXT_BYTES`.
        """
        self._next(Trigger.SEND)  # the state's refusal comes first
        if not pcm:
            raise JambonzUsageError(JambonzErrorCode.EMPTY_AUDIO, "no audio to send")
        if len(pcm) % 2:
            raise JambonzUsageError(
                JambonzErrorCode.INVALID_PCM, f"{len(pcm)} bytes is not whole L16 samples"
            )
        rate = self.output_sample_rate
        assert rate is not None  # SEND is legal only once the metadata is in
        frames: list[bytes | str]
        if self._streaming:
            data = _without_marker_samples(bytes(pcm))
            step = rate * FRAME_MS // 1000 * 2
            frames = [data[offset : offset + step] for offset in range(0, len(data), step)]
        else:
            frames = [
                self._play_audio(pcm[offset : offset + _PLAY_AUDIO_MAX_PCM], rate)
                for offset in range(0, len(pcm), _PLAY_AUDIO_MAX_PCM)
            ]
        self._step(Trigger.SEND)
        return frames

    def _play_audio(self, pcm: bytes, rate: int) -> str:
        self._plays += 1
        text = _dumps(
            {
                "type": "playAudio",
                "data": {
                    "audioContentType": "raw",
                    "sampleRate": rate,
                    "audioContent": base64.b64encode(pcm).decode("ascii"),
                    "queuePlay": True,
                    "id": str(self._plays),
                },
            }
        )
        assert len(text) <= PLAY_AUDIO_MAX_TEXT_BYTES  # ASCII: characters are bytes
        return text

    def kill_audio(self) -> tuple[str, list[str]]:
        """The ``killAudio`` frame, and the marks it clears (every pending mark).

        jambonz will report those marks (``cleared``, or ``playout`` if they played while
        the kill was on its way); :meth:`receive_text` swallows those reports.
        """
        self._step(Trigger.SEND)
        cleared = list(self._pending)
        self._flushed.update(self._pending)
        self._pending.clear()
        return _KILL_AUDIO, cleared

    def mark(self, name: str) -> str:
        """The ``mark`` frame for ``name``: reported once all audio sent before it played.

        Streaming only: jambonz never reports marks on ``playAudio`` files [glue].
        """
        self._next(Trigger.SEND)
        if not self._streaming:
            raise JambonzUsageError(
                JambonzErrorCode.MARKS_NEED_STREAMING, "marks need bidirectionalAudio.streaming"
            )
        if not MARK_NAME_PATTERN.fullmatch(name):
            raise JambonzUsageError(
                JambonzErrorCode.INVALID_MARK_NAME,
                "mark name must be 1..64 of A-Z a-z 0-9 . _ : @ / + = ~ -",
            )
        if name in self._pending or name in self._flushed:
            raise JambonzUsageError(
                JambonzErrorCode.DUPLICATE_MARK, f"mark {excerpt(name)} is outstanding"
            )
        if len(self._pending) >= self._max_marks:
            raise JambonzUsageError(
                JambonzErrorCode.TOO_MANY_MARKS,
                f"{len(self._pending)} marks outstanding, limit {self._max_marks}",
            )
        self._step(Trigger.SEND)
        self._pending.append(name)
        return _dumps({"type": "mark", "data": {"name": name}})

    def disconnect(self) -> str:
        """The ``disconnect`` frame: jambonz ends the ``listen`` verb and closes the socket
        [listen, listen.js]; the call itself goes on to the application's next verb."""
        self._step(Trigger.DISCONNECT)
        return _DISCONNECT
