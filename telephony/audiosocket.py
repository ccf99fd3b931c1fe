"""Asterisk AudioSocket: a sans-I/O protocol core.

AudioSocket carries one call's audio over a plain TCP connection that Asterisk opens to
us, from the ``AudioSocket(uuid,host:port)`` dialplan application, the
``AudioSocket/host:port/uuid[/c(codec)]`` channel driver, or ARI ``externalMedia``. This
module turns the bytes of that stream, cut however TCP cut them, into typed events, and
intents into the bytes to send; it never touches a socket, a clock or an event loop.

Vendor references:

* Asterisk documentation, "AudioSocket" channel driver page,
  https://docs.asterisk.org/Configuration/Channel-Drivers/AudioSocket/ (sections
  "Protocol definition", "Types", "Payload length", "Payload"); cited as [docs <section>].
* The protocol's origin, https://github.com/CyCoreSystems/audiosocket: ``README.md``
  (sections "Types", "Asterisk error codes") and the Go library (``audiosocket.go``,
  ``chunk.go``); cited as [README <section>] and [go <identifier>].
* The asterisk/asterisk repository: ``include/asterisk/res_audiosocket.h`` (enum
  ``ast_audiosocket_msg_kind``), ``res/res_audiosocket.c``, ``apps/app_audiosocket.c``,
  ``channels/chan_audiosocket.c``, ``res/res_rtp_asterisk.c``,
  ``res/res_pjsip_dtmf_info.c``; cited as [src <function>]. DTMF messages arrived with
  commit a5bc39fa32 (releases 20.14.0, 21.9.0, 22.4.0, 23.0.0); kinds 0x11-0x18 with
  commit ff0523a3d0 (releases 20.17.0, 21.12.0, 22.7.0, 23.1.0).

Wire format [docs Protocol definition, Payload length]: a stream of messages, each a
3-byte header (1 byte kind, 2 bytes payload length, unsigned big-endian) and then the
payload. The shortest message is a terminate, ``00 00 00``. Kinds (:class:`Kind`)
[docs Types] [src ast_audiosocket_msg_kind]:

* ``0x00`` terminate; no payload. Only the server sends it ("Sent only" [src enum]).
  Asterisk itself ends a call by closing the socket [src audiosocket_hangup,
  audiosocket_exec]; a terminate from the peer is still accepted as
  :class:`HangupReceived`.
* ``0x01`` UUID: 16 bytes, the binary form of the UUID the dialplan gave (``uuid_parse``
  [src ast_audiosocket_init]); Asterisk always sends it first [src audiosocket_run,
  audiosocket_call]. Reported as :class:`CallStarted` with the canonical 8-4-4-4-12
  lowercase string, which always obeys :func:`telephony.limits.call_id_problem`.
* ``0x03`` DTMF: 1 byte, the ASCII digit. Sent once per key press, when it ends
  (``AST_FRAME_DTMF`` is ``AST_FRAME_DTMF_END`` [src frame.h]). SIP INFO passes ``a``-``d``
  through in lowercase [src res_pjsip_dtmf_info get_event]; they are reported uppercase.
  A byte outside ``0-9 * # A-D a-d`` is ``bad_dtmf``: flash never arrives as a digit
  [src res_rtp_asterisk create_dtmf_frame, res_pjsip_dtmf_info].
* ``0x10`` audio, signed linear 16-bit little-endian mono at 8 kHz; ``0x11``..``0x18`` the
  same at 12, 16, 24, 32, 44.1, 48, 96 and 192 kHz, both ways [src enum]. The dialplan
  application forces the channel to 8 kHz ``slin`` [src audiosocket_exec], so only the
  channel driver with ``c(slin16)`` etc. sends the others. Caution: for any codec that is
  not ``slin*`` Asterisk still writes kind ``0x10`` [src ast_audiosocket_send_frame], so a
  ``c(ulaw)`` leg would deliver mu-law labelled as 8 kHz PCM; configure ``slin*`` codecs.
  Payloads must be whole samples and not empty (``bad_audio_length``); Asterisk rejects an
  empty audio message from us and ends the call [src
  ast_audiosocket_receive_frame_with_hangup].
* ``0xff`` error: "the (optional) application-specific error code" [docs Types]. Asterisk's
  codes are one byte, bit-packed [README Asterisk error codes]: ``0x01`` hangup of calling
  party, ``0x02`` frame forwarding error, ``0x04`` memory (allocation) error. The Go
  library reads an empty payload as "unknown" [go ErrorCode]. Asterisk's own modules
  never write this kind (nothing in ``res_audiosocket.c``, ``app_audiosocket.c`` or
  ``chan_audiosocket.c`` does, as of master in August 2026), so it is reported as a typed
  :class:`ErrorReceived` and what to do is the caller's decision.

The Go library also names ``0x02`` "silence" [go KindSilence]; neither the page nor
Asterisk knows it, so it is ``unknown_kind`` like every other undefined kind. Asterisk
treats any kind from us other than terminate and audio as an error and ends the call [src
ast_audiosocket_receive_frame_with_hangup]: this core only ever builds those two.

Sample rate: Asterisk picks the kind from each frame's format [src
ast_audiosocket_send_frame], and a leg's format is fixed (the application sets it, the
channel driver takes it from ``c()`` [src audiosocket_request]), so one leg has one rate.
The first audio message sets :attr:`AudioSocketConnection.sample_rate`; audio of another
rate later is ``sample_rate_changed``. Our audio may use any rate Asterisk knows:
``ast_write`` re-targets its translator to the frame's format [src channel.c ast_write],
but releases before the ones above do not know kinds 0x11-0x18 (depending on age they drop
such messages or end the call [src history]), so send 8 kHz unless the server is newer.

Pacing: Asterisk writes each frame it reads from the channel as one message when it reads
it [src audiosocket_run, audiosocket_write], at the channel's packetisation (normally 20 ms,
320 bytes at 8 kHz); inbound sizes are not fixed, any even non-zero length is accepted.
Nothing on the way back buffers or paces: the application writes each audio message to
the channel as soon as it is read, the channel driver hands it on as read [src
audiosocket_run, audiosocket_read]. On an RTP leg the stack stamps
packets from the wall clock once they run more than 640 timestamp units (80 ms at 8 kHz)
away from the sample count [src ast_rtp_raw_write, MAX_TIMESTAMP_SKEW], so audio sent faster
than real time leaves as a burst whose timestamps overlap what was already played, and the
far end's jitter buffer drops or garbles it (read from the source, not measured; what a
mixing bridge does with a burst was not examined). The caller
must therefore send one 20 ms message per 20 ms, as the Go library does with a ticker [go
SendSlinChunks]; :meth:`AudioSocketConnection.audio` cuts the messages and never waits.

States (one table, :data:`TRANSITIONS`)::

    AWAITING_UUID --UUID--> ACTIVE --audio|DTMF|error--> ACTIVE
    ACTIVE --hangup() | terminate received--> CLOSING --audio|DTMF|error|terminate--> CLOSING
    any --connection_closed()--> CLOSED;  any --remote misbehaviour--> FAILED

An inbound message the table does not allow (anything before the UUID, a second UUID) is
remote misbehaviour: :class:`AudioSocketProtocolError`, and the state becomes ``FAILED``.
A call in the wrong state is local misuse: :class:`AudioSocketUsageError`, no state change.
:meth:`AudioSocketConnection.hangup` needs ``ACTIVE``; before the UUID, close the socket
instead ("socket closure is also sufficient" [docs Types]).
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, NamedTuple, TypeAlias

from telephony.codecs.formats import PCM_RATES, AudioSpec, pcm
from telephony.core import CoreError
from telephony.limits import DTMF_DIGITS

__all__ = [
    "ASTERISK_ERROR_BITS",
    "AUDIO_KINDS",
    "FRAME_MS",
    "GATEWAY_FORMATS",
    "HANGUP_MESSAGE",
    "HEADER_BYTES",
    "MAX_PAYLOAD_BYTES",
    "SAMPLE_BYTES",
    "TRANSITIONS",
    "UUID_BYTES",
    "AudioReceived",
    "AudioSocketConnection",
    "AudioSocketError",
    "AudioSocketErrorCode",
    "AudioSocketEvent",
    "AudioSocketProtocolError",
    "AudioSocketState",
    "AudioSocketUsageError",
    "CallStarted",
    "DtmfReceived",
    "ErrorReceived",
    "HangupReceived",
    "Header",
    "Kind",
    "Trigger",
    "decode_header",
    "describe_error_code",
    "encode_message",
    "frame_bytes",
]

HEADER_BYTES: Final = 3  # kind, then the payload length [docs Protocol definition]
#: "a 16-bit unsigned integer (big endian)" [docs Payload length]
MAX_PAYLOAD_BYTES: Final = 65_535
UUID_BYTES: Final = 16  # "16-byte binary representation" [docs Types]
SAMPLE_BYTES: Final = 2  # "signed linear, 16-bit ... mono" [docs Types]
FRAME_MS: Final = 20  # what we send per message (the Go library's chunk [go DefaultSlinChunkSize])
HANGUP_MESSAGE: Final = b"\x00\x00\x00"  # "Hangup indication ... is 0x00 0x00 0x00" [docs]


class Kind(enum.IntEnum):
    """Message kinds [docs Types] [src ast_audiosocket_msg_kind]."""

    HANGUP = 0x00
    UUID = 0x01
    DTMF = 0x03
    AUDIO_8K = 0x10
    AUDIO_12K = 0x11
    AUDIO_16K = 0x12
    AUDIO_24K = 0x13
    AUDIO_32K = 0x14
    AUDIO_44K = 0x15  # 44.1 kHz (Asterisk's slin44)
    AUDIO_48K = 0x16
    AUDIO_96K = 0x17
    AUDIO_192K = 0x18
    ERROR = 0xFF


#: Audio kinds and their sample rates [docs Types] [src ast_audiosocket_send_frame].
AUDIO_KINDS: Final[Mapping[Kind, int]] = {
    Kind.AUDIO_8K: 8000,
    Kind.AUDIO_12K: 12000,
    Kind.AUDIO_16K: 16000,
    Kind.AUDIO_24K: 24000,
    Kind.AUDIO_32K: 32000,
    Kind.AUDIO_44K: 44100,
    Kind.AUDIO_48K: 48000,
    Kind.AUDIO_96K: 96000,
    Kind.AUDIO_192K: 192000,
}
_KIND_FOR_RATE: Final[Mapping[int, Kind]] = {rate: kind for kind, rate in AUDIO_KINDS.items()}

#: The wire names of the 16-bit PCM formats (telephony/codecs/formats.py), by rate.
GATEWAY_FORMATS: Final[Mapping[int, str]] = {rate: pcm(rate).name for rate in PCM_RATES}

#: Asterisk's bit-packed error codes [README Asterisk error codes] [go ErrAst*].
ASTERISK_ERROR_BITS: Final[Mapping[int, str]] = {
    0x01: "hangup of calling party",
    0x02: "frame forwarding error",
    0x04: "memory (allocation) error",
}


class AudioSocketErrorCode(enum.StrEnum):
    """Machine-readable codes carried by :class:`AudioSocketError` subclasses."""

    # Remote misbehaviour (AudioSocketProtocolError)
    UNKNOWN_KIND = "unknown_kind"
    FRAME_TOO_LARGE = "frame_too_large"  # announced payload over this leg's max_payload
    BAD_HANGUP = "bad_hangup"  # a terminate with a payload
    BAD_UUID = "bad_uuid"  # a UUID payload not of 16 bytes
    BAD_DTMF = "bad_dtmf"  # not one byte, or not a DTMF digit
    BAD_AUDIO_LENGTH = "bad_audio_length"  # empty, or not whole 16-bit samples
    UNEXPECTED_MESSAGE = "unexpected_message"  # the state table forbids it here
    SAMPLE_RATE_CHANGED = "sample_rate_changed"  # audio of a second rate on one leg
    TRUNCATED = "truncated"  # the stream ended inside a message
    # Local misuse (AudioSocketUsageError)
    NOT_STARTED = "not_started"  # before the UUID
    CLOSED = "closed"  # after hangup(), a terminate received, or connection_closed()
    CONNECTION_FAILED = "connection_failed"  # after a protocol error
    ODD_AUDIO_LENGTH = "odd_audio_length"  # our audio is not whole samples
    UNSUPPORTED_SAMPLE_RATE = "unsupported_sample_rate"  # no kind / gateway format for it
    INVALID_ARGUMENT = "invalid_argument"  # encode_message / decode_header arguments


class AudioSocketError(CoreError[AudioSocketErrorCode]):
    """Base of this module's errors: ``code`` for machines, ``message`` for the log."""


class AudioSocketProtocolError(AudioSocketError):
    """Asterisk sent something the protocol does not allow (remote misbehaviour).

    ``events`` holds what the failing :meth:`AudioSocketConnection.receive` call decoded
    before the bad message, so no event is lost however TCP cut the stream.
    """

    def __init__(
        self,
        code: AudioSocketErrorCode,
        message: str,
        events: tuple[AudioSocketEvent, ...] = (),
    ) -> None:
        super().__init__(code, message)
        self.events = events


class AudioSocketUsageError(AudioSocketError):
    """This process called the core in a way its contract forbids (local misuse)."""


def _fail(code: AudioSocketErrorCode, message: str) -> AudioSocketProtocolError:
    return AudioSocketProtocolError(code, message)


# --------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class CallStarted:
    """The UUID message: the call's id, canonical 8-4-4-4-12 lowercase."""

    call_id: str


@dataclass(frozen=True, slots=True)
class AudioReceived:
    """One audio message: signed 16-bit little-endian mono PCM at ``sample_rate``."""

    payload: bytes = field(repr=False)
    sample_rate: int


@dataclass(frozen=True, slots=True)
class DtmfReceived:
    """A DTMF message: the caller released a key (one of ``0-9 * # A-D``)."""

    digit: str


@dataclass(frozen=True, slots=True)
class HangupReceived:
    """A terminate message from the peer; the socket closes next."""


@dataclass(frozen=True, slots=True)
class ErrorReceived:
    """An error message. ``code`` is the payload's first byte, None when it is empty
    ("optional" [docs Types]); ``payload`` is all of it (application-specific codes may be
    longer); ``description`` reads ``code`` as Asterisk's bit-packed codes."""

    code: int | None
    description: str
    payload: bytes = b""


AudioSocketEvent: TypeAlias = (
    CallStarted | AudioReceived | DtmfReceived | HangupReceived | ErrorReceived
)


def describe_error_code(code: int | None) -> str:
    """Asterisk's bit-packed error byte in words [README Asterisk error codes]."""
    if code is None:
        return "no error code"
    if code == 0:
        return "no error bits set"
    names = [name for bit, name in ASTERISK_ERROR_BITS.items() if code & bit]
    unknown = code & ~sum(ASTERISK_ERROR_BITS)
    if unknown:
        names.append(f"unknown error bits 0x{unknown:02x}")
    return "; ".join(names)


# --------------------------------------------------------------------------- states


class AudioSocketState(enum.Enum):
    AWAITING_UUID = "awaiting_uuid"  # connected; Asterisk's UUID comes first
    ACTIVE = "active"  # audio flows both ways
    CLOSING = "closing"  # a terminate went out or came in; the socket closes next
    CLOSED = "closed"  # the socket is gone
    FAILED = "failed"  # the peer misbehaved; close the socket


class Trigger(enum.Enum):
    """What moves the state machine: an inbound message, or a local action."""

    UUID = "uuid"
    AUDIO = "audio"
    DTMF = "dtmf"
    ERROR = "error"
    REMOTE_HANGUP = "remote_hangup"  # a terminate message from the peer
    SEND_AUDIO = "send_audio"  # audio(): builds messages, no state change
    HANGUP = "hangup"  # hangup(): we built a terminate message
    CONNECTION_CLOSED = "connection_closed"  # the socket closed, either side


_S = AudioSocketState
_T = Trigger

#: Every legal transition; anything else raises. After a terminate (ours or theirs)
#: messages already in flight are still accepted, a crossing terminate included.
TRANSITIONS: Final[Mapping[tuple[AudioSocketState, Trigger], AudioSocketState]] = {
    (_S.AWAITING_UUID, _T.UUID): _S.ACTIVE,
    (_S.AWAITING_UUID, _T.CONNECTION_CLOSED): _S.CLOSED,
    (_S.ACTIVE, _T.AUDIO): _S.ACTIVE,
    (_S.ACTIVE, _T.DTMF): _S.ACTIVE,
    (_S.ACTIVE, _T.ERROR): _S.ACTIVE,
    (_S.ACTIVE, _T.REMOTE_HANGUP): _S.CLOSING,
    (_S.ACTIVE, _T.SEND_AUDIO): _S.ACTIVE,
    (_S.ACTIVE, _T.HANGUP): _S.CLOSING,
    (_S.ACTIVE, _T.CONNECTION_CLOSED): _S.CLOSED,
    (_S.CLOSING, _T.AUDIO): _S.CLOSING,
    (_S.CLOSING, _T.DTMF): _S.CLOSING,
    (_S.CLOSING, _T.ERROR): _S.CLOSING,
    (_S.CLOSING, _T.REMOTE_HANGUP): _S.CLOSING,
    (_S.CLOSING, _T.CONNECTION_CLOSED): _S.CLOSED,
    (_S.CLOSED, _T.CONNECTION_CLOSED): _S.CLOSED,
    (_S.FAILED, _T.CONNECTION_CLOSED): _S.CLOSED,
}

_LOCAL: Final = frozenset({_T.SEND_AUDIO, _T.HANGUP, _T.CONNECTION_CLOSED})

_TRIGGERS: Final[Mapping[Kind, Trigger]] = {
    Kind.HANGUP: _T.REMOTE_HANGUP,
    Kind.UUID: _T.UUID,
    Kind.DTMF: _T.DTMF,
    Kind.ERROR: _T.ERROR,
    **dict.fromkeys(AUDIO_KINDS, _T.AUDIO),
}


# --------------------------------------------------------------------------- framing


class Header(NamedTuple):
    """A decoded message header. ``kind`` is the raw byte: it may be no :class:`Kind`."""

    kind: int
    length: int


def encode_message(kind: Kind | int, payload: bytes = b"") -> bytes:
    """One message: ``kind``, the payload length big-endian, ``payload`` [docs Protocol
    definition]. Any kind byte is framed (tests build bad streams with it); raises
    :class:`AudioSocketUsageError` ``invalid_argument`` for a kind outside 0..255 or a
    payload over 65,535 bytes."""
    if not 0 <= kind <= 0xFF:
        raise AudioSocketUsageError(
            AudioSocketErrorCode.INVALID_ARGUMENT, f"kind {kind} is not one byte"
        )
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise AudioSocketUsageError(
            AudioSocketErrorCode.INVALID_ARGUMENT,
            f"payload of {len(payload)} bytes, limit {MAX_PAYLOAD_BYTES}",
        )
    return bytes((kind,)) + len(payload).to_bytes(2, "big") + bytes(payload)


def decode_header(data: bytes | bytearray | memoryview) -> Header:
    """The header at the start of ``data`` (at least :data:`HEADER_BYTES` long, else
    :class:`AudioSocketUsageError` ``invalid_argument``)."""
    if len(data) < HEADER_BYTES:
        raise AudioSocketUsageError(
            AudioSocketErrorCode.INVALID_ARGUMENT,
            f"a header is {HEADER_BYTES} bytes, got {len(data)}",
        )
    return Header(data[0], (data[1] << 8) | data[2])


def frame_bytes(sample_rate: int) -> int:
    """Bytes of one 20 ms message of 16-bit mono PCM at ``sample_rate`` (320 at 8 kHz)."""
    return sample_rate * FRAME_MS // 1000 * SAMPLE_BYTES


def _kind(byte: int) -> Kind:
    try:
        return Kind(byte)
    except ValueError:
        raise _fail(
            AudioSocketErrorCode.UNKNOWN_KIND, f"unknown message kind 0x{byte:02x}"
        ) from None


# --------------------------------------------------------------------------- connection


class AudioSocketConnection:
    """One AudioSocket TCP connection, from Asterisk's connect to the socket's close.

    Feed every chunk read from the socket to :meth:`receive`, in order, however small or
    large; send the bytes :meth:`audio` and :meth:`hangup` return, in order; call
    :meth:`connection_closed` when the socket closes.

    ``max_payload`` bounds one inbound message's payload (16..65,535; the length field's
    own maximum by default). A header announcing more is ``frame_too_large`` at once, so
    the bytes held between calls never reach ``HEADER_BYTES + max_payload``.
    """

    def __init__(self, *, max_payload: int = MAX_PAYLOAD_BYTES) -> None:
        if not UUID_BYTES <= max_payload <= MAX_PAYLOAD_BYTES:
            raise ValueError(f"max_payload must be in {UUID_BYTES}..{MAX_PAYLOAD_BYTES}")
        self._max_payload = max_payload
        self._state = AudioSocketState.AWAITING_UUID
        self._buffer = bytearray()  # the start of a message not yet complete
        self._call_id: str | None = None
        self._sample_rate: int | None = None

    # ----------------------------------------------------------------- properties

    @property
    def state(self) -> AudioSocketState:
        return self._state

    @property
    def call_id(self) -> str | None:
        """The UUID, canonical lowercase, once it has arrived."""
        return self._call_id

    @property
    def sample_rate(self) -> int | None:
        """The rate of Asterisk's audio, from the first audio message."""
        return self._sample_rate

    @property
    def buffered_bytes(self) -> int:
        """Inbound bytes held: the start of a message not yet complete."""
        return len(self._buffer)

    @staticmethod
    def audio_spec(sample_rate: int) -> AudioSpec:
        """AudioSocket's audio at ``sample_rate``: 16-bit PCM at that rate.

        Raises :class:`AudioSocketUsageError` ``unsupported_sample_rate`` for a rate the
        gateway has no format for (12, 32, 44.1, 96 and 192 kHz, or none of AudioSocket's).
        """
        if sample_rate not in PCM_RATES:
            raise AudioSocketUsageError(
                AudioSocketErrorCode.UNSUPPORTED_SAMPLE_RATE,
                f"no gateway format for {sample_rate} Hz audio",
            )
        return pcm(sample_rate)

    @staticmethod
    def format_name(sample_rate: int) -> str:
        """The wire name of :meth:`audio` (``8000`` -> ``pcm_8000``), from the formats
        table."""
        return AudioSocketConnection.audio_spec(sample_rate).name

    # ----------------------------------------------------------------- state table

    def _step(self, trigger: Trigger) -> None:
        """Take the transition for ``trigger``, or raise: a local trigger or a closed or
        failed connection is local misuse, any other remote trigger remote misbehaviour."""
        next_state = TRANSITIONS.get((self._state, trigger))
        if next_state is not None:
            self._state = next_state
            return
        what = f"{trigger.value} in state {self._state.value}"
        if self._state is AudioSocketState.FAILED:
            raise AudioSocketUsageError(AudioSocketErrorCode.CONNECTION_FAILED, what)
        if self._state is AudioSocketState.CLOSED or trigger in _LOCAL:
            code = (
                AudioSocketErrorCode.NOT_STARTED
                if self._state is AudioSocketState.AWAITING_UUID
                else AudioSocketErrorCode.CLOSED
            )
            raise AudioSocketUsageError(code, what)
        raise _fail(AudioSocketErrorCode.UNEXPECTED_MESSAGE, what)

    # ----------------------------------------------------------------- inbound

    def receive(self, data: bytes) -> list[AudioSocketEvent]:
        """The events of every message completed by ``data``, in order.

        ``data`` is whatever one socket read returned: part of a message, many messages,
        or both; an incomplete message is held until the rest arrives. Raises
        :class:`AudioSocketProtocolError` on remote misbehaviour (the state becomes
        ``FAILED``; the events decoded before it are on the exception), and
        :class:`AudioSocketUsageError` when called after close or failure.
        """
        if self._state is AudioSocketState.FAILED:
            raise AudioSocketUsageError(
                AudioSocketErrorCode.CONNECTION_FAILED, "data received after a protocol error"
            )
        if self._state is AudioSocketState.CLOSED:
            raise AudioSocketUsageError(AudioSocketErrorCode.CLOSED, "data received after close")
        events: list[AudioSocketEvent] = []
        buffer = self._buffer
        buffer += data
        offset = 0
        try:
            while offset < len(buffer):
                kind = _kind(buffer[offset])  # refused on its first byte when unknown
                if len(buffer) - offset < HEADER_BYTES:
                    break
                header = decode_header(buffer[offset : offset + HEADER_BYTES])
                trigger = self._check_header(kind, header.length)
                end = offset + HEADER_BYTES + header.length
                if len(buffer) < end:
                    break
                payload = bytes(buffer[offset + HEADER_BYTES : end])
                offset = end
                events.append(self._decode(kind, trigger, payload))
        except AudioSocketProtocolError as exc:
            self._state = AudioSocketState.FAILED
            buffer.clear()
            exc.events = tuple(events)
            raise
        del buffer[:offset]
        return events

    def _check_header(self, kind: Kind, length: int) -> Trigger:
        """Everything a header alone decides: size and state. Raises at the header, so a
        bad message is refused before its payload is buffered."""
        if length > self._max_payload:
            raise _fail(
                AudioSocketErrorCode.FRAME_TOO_LARGE,
                f"{kind.name} payload of {length} bytes, limit {self._max_payload}",
            )
        trigger = _TRIGGERS[kind]
        if TRANSITIONS.get((self._state, trigger)) is None:
            self._step(trigger)  # raises the right error
        if kind is Kind.HANGUP and length:
            raise _fail(AudioSocketErrorCode.BAD_HANGUP, f"terminate with {length} payload bytes")
        if kind is Kind.UUID and length != UUID_BYTES:
            raise _fail(AudioSocketErrorCode.BAD_UUID, f"UUID of {length} bytes, not 16")
        if kind is Kind.DTMF and length != 1:
            raise _fail(AudioSocketErrorCode.BAD_DTMF, f"DTMF of {length} bytes, not 1")
        rate = AUDIO_KINDS.get(kind)
        if rate is not None:
            if not length or length % SAMPLE_BYTES:
                raise _fail(
                    AudioSocketErrorCode.BAD_AUDIO_LENGTH,
                    f"{kind.name} payload of {length} bytes is not whole 16-bit samples",
                )
            if self._sample_rate is not None and rate != self._sample_rate:
                raise _fail(
                    AudioSocketErrorCode.SAMPLE_RATE_CHANGED,
                    f"{rate} Hz audio on a {self._sample_rate} Hz leg",
                )
        return trigger

    def _decode(self, kind: Kind, trigger: Trigger, payload: bytes) -> AudioSocketEvent:
        event: AudioSocketEvent
        if kind is Kind.UUID:
            self._call_id = str(uuid.UUID(bytes=payload))
            event = CallStarted(self._call_id)
        elif kind is Kind.DTMF:
            digit = chr(payload[0])
            if digit in "abcd":
                digit = digit.upper()
            if digit not in DTMF_DIGITS:
                raise _fail(
                    AudioSocketErrorCode.BAD_DTMF, f"DTMF byte 0x{payload[0]:02x} is no digit"
                )
            event = DtmfReceived(digit)
        elif kind is Kind.HANGUP:
            event = HangupReceived()
        elif kind is Kind.ERROR:
            code = payload[0] if payload else None
            event = ErrorReceived(code, describe_error_code(code), payload)
        else:
            rate = AUDIO_KINDS[kind]
            self._sample_rate = rate
            event = AudioReceived(payload, rate)
        self._step(trigger)
        return event

    def connection_closed(self) -> None:
        """The socket closed (either side); the state becomes ``CLOSED``.

        If it closed inside a message, the state is still ``CLOSED`` and then
        :class:`AudioSocketProtocolError` ``truncated`` reports the lost bytes.
        """
        held = len(self._buffer)
        self._buffer.clear()
        self._step(Trigger.CONNECTION_CLOSED)
        if held:
            raise _fail(
                AudioSocketErrorCode.TRUNCATED, f"the stream ended {held} bytes into a message"
            )

    # ----------------------------------------------------------------- outbound

    def audio(self, pcm: bytes, sample_rate: int = 8000) -> list[bytes]:
        """``pcm`` (signed 16-bit little-endian mono at ``sample_rate``) as audio messages
        of 20 ms each (320 bytes at 8 kHz), the last one shorter if ``pcm`` ends mid-frame;
        their payloads joined are ``pcm``. Empty ``pcm`` gives no message (Asterisk hangs
        up on an empty one). Send them one per 20 ms: Asterisk plays them as they arrive.

        Raises :class:`AudioSocketUsageError`: ``unsupported_sample_rate`` for a rate with
        no AudioSocket kind, ``odd_audio_length`` for a partial sample, and the state's
        code outside ``ACTIVE``.
        """
        kind = _KIND_FOR_RATE.get(sample_rate)
        if kind is None:
            raise AudioSocketUsageError(
                AudioSocketErrorCode.UNSUPPORTED_SAMPLE_RATE,
                f"AudioSocket has no kind for {sample_rate} Hz audio",
            )
        if len(pcm) % SAMPLE_BYTES:
            raise AudioSocketUsageError(
                AudioSocketErrorCode.ODD_AUDIO_LENGTH,
                f"{len(pcm)} bytes is not whole 16-bit samples",
            )
        self._step(Trigger.SEND_AUDIO)
        step = frame_bytes(sample_rate)
        return [encode_message(kind, pcm[i : i + step]) for i in range(0, len(pcm), step)]

    def hangup(self) -> bytes:
        """The terminate message, ``00 00 00``; the state becomes ``CLOSING``. Asterisk
        then ends the application or hangs up the channel and closes the socket [src
        audiosocket_run, audiosocket_read]."""
        self._step(Trigger.HANGUP)
        return HANGUP_MESSAGE
