"""FreeSWITCH ``mod_audio_stream`` (audio over a WebSocket): a sans-I/O protocol core.

FreeSWITCH is the WebSocket *client*; we are the server it dials. BINARY frames from
FreeSWITCH carry the caller's audio as raw L16; TEXT frames carry whatever text the
dialplan or an ESL controller chose to send. This module turns frames into typed events
and our audio into frames; it never touches a socket, a clock or an event loop.

Vendor references (cited below in brackets):

* ``amigniter/mod_audio_stream`` on GitHub, the community edition, at commit ec2a781
  (2026-01-28): ``README.md`` sections "API/Commands", "Channel variables", "Events" and
  "play" [README <section>]; ``mod_audio_stream.c``, ``mod_audio_stream.h`` and
  ``audio_streamer_glue.cpp`` [src <function>].
* ``amigniter/libwsc`` v1.1.0 (commit 09d18e5, the submodule ec2a781 pins), the
  WebSocket client the module uses: ``src/WebSocketContext.cpp`` and ``.h``
  [wsc <function or constant>].
* ``voxcom-us/mod_audio_stream`` commit 7d9fe1d, a fork that plays ``streamAudio`` raw
  audio in real time [fork <function>].
* Issue amigniter/mod_audio_stream#72, "Notes on two-way-audio streamer", the author's
  notes on the closed-source commercial v1.0.3 [issue 72].

What FreeSWITCH does (confirmed in the sources above unless marked otherwise):

* Start: ``uuid_audio_stream <uuid> start <ws-url> <mono|mixed|stereo> [<rate>]
  [<metadata>]`` [README API/Commands]. ``<rate>`` is ``8k``, ``16k`` or a number of hertz
  that is a multiple of 8000, and defaults to 8000 when omitted [src stream_function];
  audio is resampled from the channel's codec rate when they differ [src stream_data_init].
  The URL must be ``ws://`` or ``wss://``, a host of letters, digits, ``-`` and ``.``, an
  optional numeric port, and a ``/`` before any query (``ws://gw:8080/fs?call=...``;
  ``ws://gw:8080?call=...`` is refused) [src validate_ws_uri]. The module sends nothing
  that names the call, its rate or its channel count, so the gateway must learn them from
  that URL (the constructor's ``call_id``/``sample_rate``) or from metadata that the
  dialplan writes (``metadata=FreeSwitchMetadata.JSON`` below).
* Metadata is "a valid utf-8 text", "sent the first before audio streaming starts"
  [README API/Commands]; any text, not necessarily JSON. It is copied into an 8,192-byte
  buffer, so at most :data:`MAX_METADATA_BYTES` bytes arrive [src stream_data_init,
  ``MAX_METADATA_LEN``], and never when empty [src send_initial_metadata]. It is *not*
  always first: libwsc reports itself connected while still connecting, so audio captured
  during the handshake is queued, the queue is flushed when the upgrade completes, and
  only then does the open callback send the metadata [src stream_frame, writeBinary]
  [wsc isConnected, sendData, handleRead, flushSendQueue]. With a handshake
  longer than one 20 ms frame (TLS, a WAN) audio comes first.
* Audio, FreeSWITCH to us: BINARY frames of signed 16-bit linear PCM in host byte order
  (little-endian on x86-64 and aarch64, which this core assumes), mono for ``mono`` (what
  the caller says) and ``mixed`` (caller and what is played to the caller, so our own
  playback would come back), two interleaved channels for ``stereo``. Frame sizes are
  *not* fixed: each frame is one media-bug read (``ptime`` worth, 320 bytes for 20 ms at
  8 kHz), a resampler's output (which can vary by a sample), or, with
  ``STREAM_BUFFER_SIZE``, a buffer of that many milliseconds [src stream_frame]
  [README Channel variables]. Only whole samples and a size bound are therefore checked.
  Stereo cannot be told from mono at twice the rate and is not supported: start the
  stream ``mono``.
* Other TEXT frames: ``uuid_audio_stream <uuid> send_text <text>`` at any time, and
  ``uuid_audio_stream <uuid> stop [<text>]``, which sends the text, then closes
  [README API/Commands] [src stream_session_cleanup]. Both arrive as
  :class:`TextReceived`.
* ``pause``/``resume`` stop and restart the audio with nothing sent to us
  [src stream_session_pauseresume]: a gap in the audio is normal.
* DTMF: not forwarded. The media bug has no DTMF hook and nothing else writes to the
  socket [src capture_callback, stream_frame]. An adapter that needs digits gets them from
  ESL (``DTMF`` events) or from a dialplan that forwards them with ``send_text``; that
  convention is the adapter's, so this core has no DTMF event.
* End: on hangup and on ``stop`` the module closes with code 1000 "Normal closure"
  [src capture_callback, stream_session_cleanup] [wsc stop, stopNow, close]; the socket may also
  just drop. There is no reconnection [README Channel variables]. If *we* close the
  socket the call goes on: FreeSWITCH fires ``mod_audio_stream::disconnect`` and stops
  sending [src eventCallback]; hanging up needs ESL or the dialplan.
* Which side sees what: the events ``mod_audio_stream::connect``, ``::disconnect``,
  ``::error``, ``::json`` and ``::play`` are FreeSWITCH custom events for ESL listeners
  [README Events]; the WebSocket server never sees them. We see the HTTP upgrade (with
  any ``STREAM_EXTRA_HEADERS``), pings if ``STREAM_HEART_BEAT`` is set, the TEXT and
  BINARY frames above, and the close.

What we may send (this differs by build):

* Community edition (the repository): a TEXT frame that is JSON
  ``{"type": "streamAudio", "data": {"audioDataType": "raw", "sampleRate": 8000,
  "audioData": "<base64>"}}`` is decoded and written to a file (``raw`` at 8000, 16000,
  24000, 32000, 48000 or 64000 Hz; also ``wav``, ``mp3``, ``ogg``, ``pcmu``, ``pcma``),
  and the module fires ``mod_audio_stream::play`` carrying the file's path. It does
  *not* play it: an ESL controller must (``uuid_broadcast``...) [README play]
  [src processMessage, eventCallback]. Every other TEXT frame becomes a
  ``mod_audio_stream::json`` event; BINARY frames from us are ignored (no binary callback
  is set) [src bindCallbacks]. So each message is one file, one event and one playback
  command: send few, large messages (whole prompts, or :data:`MAX_CHUNK_MS` chunks). Each
  file starts only when the controller hears the event and the previous file ends;
  whether FreeSWITCH leaves a gap between files is not confirmed here.
* The voxcom-us fork plays ``raw`` ``streamAudio`` in real time: it resamples the audio
  into a write buffer of ``STREAM_BUFFER_SIZE`` (default 20 ms) and, while that buffer
  is full, blocks the socket's event thread [fork injectRawAudio, write_frame_thread],
  which also holds back the caller's audio. Send chunks of about 100 ms
  (``chunk_ms=100``) paced at real time, as its example server does [fork
  docker/echo/echo.py].
* The commercial v1.0.3 (closed source) plays ``streamAudio`` and raw BINARY audio in
  real time, "ensure the sample rate matches" [issue 72]
  [README Update (22/2/2025)]. Its frame sizes and its pause, resume and tracking
  messages are unpublished; ``FreeSwitchPlayback.BINARY`` follows the one thing stated
  (L16 at the stream's rate) and is unverified.
* Stopping playback: no build publishes a message for it, so :meth:`stop_audio` returns
  None. With the community edition, stop the file playback out of band (ESL
  ``uuid_break <uuid> all``); with the fork, stop sending (what is queued keeps playing).

Our choices where the module leaves things open:

* ``metadata=FreeSwitchMetadata.RAW`` (default): the stream starts with the first frame.
  A first TEXT frame is the metadata, kept as text and not interpreted; a first BINARY
  frame starts the stream without metadata, and a later TEXT frame is a
  :class:`TextReceived` (which may be late metadata: use JSON mode to rely on it).
* ``metadata=FreeSwitchMetadata.JSON``: the dialplan sends a JSON object as metadata,
  e.g. ``{"callId":"${uuid}","sampleRate":8000,"caller":"${caller_id_number}"}``. Audio
  before it is held (at most :data:`MAX_HELD_AUDIO_FRAMES` frames and
  :data:`MAX_HELD_AUDIO_BYTES` bytes, else ``metadata_missing``) and delivered after
  :class:`StreamStarted`. Every member must be a string except ``sampleRate``, an
  integer; ``callId`` obeys :func:`telephony.limits.call_id_problem`. A value that
  contradicts the constructor's ``call_id`` or ``sample_rate`` is a mismatch error. Not
  confirmed: how FreeSWITCH's argument splitter treats spaces, quotes and backslashes in
  the metadata argument; write it without spaces or single quotes.
* The rate is the constructor's, else the metadata's, else 8000 (the module's default).
* Limits: TEXT frames up to ``max_text_bytes`` UTF-8 bytes; BINARY frames up to
  :data:`MAX_AUDIO_FRAME_BYTES`; empty frames are refused (the module never sends one
  [src stream_frame, send_initial_metadata, stream_function]).

States (one table, :data:`TRANSITIONS`)::

    AWAITING_START --TEXT (metadata) | AUDIO (RAW mode)--> STREAMING
    AWAITING_START --HELD_AUDIO (JSON mode)--> AWAITING_START
    STREAMING --TEXT | AUDIO | PLAY--> STREAMING
    AWAITING_START | STREAMING --CLOSE--> CLOSING --TEXT | AUDIO--> CLOSING
    any --CONNECTION_CLOSED--> CLOSED;  any --remote misbehaviour--> FAILED

Remote misbehaviour raises :class:`FreeSwitchProtocolError` and leaves the connection
``FAILED``; the caller closes the leg. Local misuse raises :class:`FreeSwitchUsageError`
and changes nothing. Frames received in ``CLOSING`` are checked and dropped.
"""

from __future__ import annotations

import base64
import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, TypeAlias

import msgspec

from telephony.codecs.formats import AudioSpec, pcm
from telephony.core import CoreError
from telephony.limits import call_id_problem, excerpt

__all__ = [
    "DEFAULT_BINARY_CHUNK_MS",
    "DEFAULT_MAX_TEXT_BYTES",
    "DEFAULT_SAMPLE_RATE",
    "DEFAULT_STREAM_AUDIO_CHUNK_MS",
    "MAX_AUDIO_FRAME_BYTES",
    "MAX_CHUNK_MS",
    "MAX_HELD_AUDIO_BYTES",
    "MAX_HELD_AUDIO_FRAMES",
    "MAX_METADATA_BYTES",
    "MIN_CHUNK_MS",
    "SAMPLE_BYTES",
    "SAMPLE_RATES",
    "TRANSITIONS",
    "AudioReceived",
    "FreeSwitchConnection",
    "FreeSwitchError",
    "FreeSwitchErrorCode",
    "FreeSwitchEvent",
    "FreeSwitchMetadata",
    "FreeSwitchPlayback",
    "FreeSwitchProtocolError",
    "FreeSwitchState",
    "FreeSwitchTrigger",
    "FreeSwitchUsageError",
    "StreamStarted",
    "TextReceived",
]

#: Rates this gateway takes (``pcm_8000``, ``pcm_16000``). The module also accepts 24000,
#: 32000, 48000... [src stream_function]; adding one here is all a new rate needs.
SAMPLE_RATES: Final = (8000, 16000)
#: ``int sampling = 8000`` when the start command gives no rate [src stream_function].
DEFAULT_SAMPLE_RATE: Final = 8000
SAMPLE_BYTES: Final = 2  # one sample of mono L16
#: ``char initialMetadata[8192]`` filled by ``strncpy`` [src stream_data_init]: 8,191
#: bytes and the terminating NUL.
MAX_METADATA_BYTES: Final = 8191
#: One second at 16 kHz (two at 8 kHz): ``STREAM_BUFFER_SIZE`` up to 1000 ms fits.
MAX_AUDIO_FRAME_BYTES: Final = 32_000
#: Audio held while waiting for JSON metadata: libwsc queues at most 1,024 messages
#: while connecting [wsc MAX_QUEUE_SIZE], and we hold at most 5 s at 16 kHz.
MAX_HELD_AUDIO_FRAMES: Final = 1024
MAX_HELD_AUDIO_BYTES: Final = 160_000
DEFAULT_MAX_TEXT_BYTES: Final = 64 * 1024  # inbound TEXT frame limit (ours)
MIN_CHUNK_MS: Final = 20  # one FreeSWITCH frame
MAX_CHUNK_MS: Final = 1000  # a 16 kHz streamAudio message is then about 42.7 kB
DEFAULT_STREAM_AUDIO_CHUNK_MS: Final = 1000  # few files for the community edition
DEFAULT_BINARY_CHUNK_MS: Final = 20  # the module's own frame for real-time playback


class FreeSwitchPlayback(enum.StrEnum):
    """How :meth:`FreeSwitchConnection.audio` sends our audio."""

    STREAM_AUDIO = "stream_audio"  # TEXT ``streamAudio`` JSON, raw L16 in base64 [README play]
    BINARY = "binary"  # BINARY raw L16 (commercial v1.0.3 only, unverified) [issue 72]


class FreeSwitchMetadata(enum.StrEnum):
    """What the start command's metadata is (our convention; the module sends any text)."""

    RAW = "raw"  # optional, any text, not interpreted
    JSON = "json"  # required before the stream starts: a JSON object (module docstring)


class FreeSwitchErrorCode(enum.StrEnum):
    """Machine-readable codes carried by :class:`FreeSwitchError` subclasses."""

    # Remote misbehaviour (FreeSwitchProtocolError)
    TEXT_TOO_LARGE = "text_too_large"  # a TEXT frame over max_text_bytes
    INVALID_TEXT = "invalid_text"  # an empty TEXT frame, or one that is not UTF-8
    METADATA_TOO_LARGE = "metadata_too_large"  # over MAX_METADATA_BYTES
    INVALID_JSON = "invalid_json"  # JSON metadata that is not JSON, or not an object
    INVALID_METADATA = "invalid_metadata"  # a JSON metadata member of the wrong type
    INVALID_ID = "invalid_id"  # metadata callId empty, over 128 chars, or not printable
    UNSUPPORTED_SAMPLE_RATE = "unsupported_sample_rate"  # metadata sampleRate not in SAMPLE_RATES
    CALL_ID_MISMATCH = "call_id_mismatch"  # metadata callId is not the configured call id
    SAMPLE_RATE_MISMATCH = "sample_rate_mismatch"  # metadata sampleRate is not the configured one
    METADATA_MISSING = "metadata_missing"  # JSON mode: too much audio before the metadata
    INVALID_AUDIO = "invalid_audio"  # an empty BINARY frame, or not whole samples
    AUDIO_TOO_LARGE = "audio_too_large"  # a BINARY frame over MAX_AUDIO_FRAME_BYTES
    # Local misuse (FreeSwitchUsageError)
    INVALID_ARGUMENT = "invalid_argument"  # a constructor argument out of its range
    INVALID_SAMPLE_RATE = "invalid_sample_rate"  # a rate the gateway has no format for
    NOT_STREAMING = "not_streaming"  # sending before the stream started
    CLOSED = "closed"  # after close() or connection_closed()
    CONNECTION_FAILED = "connection_failed"  # after a protocol error
    INVALID_PCM = "invalid_pcm"  # our audio is empty or not whole samples
    ILLEGAL_TRANSITION = "illegal_transition"  # a trigger the table does not allow here


class FreeSwitchError(CoreError[FreeSwitchErrorCode]):
    """Base of this module's errors: ``code`` for machines, ``message`` for the log."""


class FreeSwitchProtocolError(FreeSwitchError):
    """FreeSWITCH sent something this protocol does not allow (remote misbehaviour)."""


class FreeSwitchUsageError(FreeSwitchError):
    """This process called the core in a way its contract forbids (local misuse)."""


def _fail(code: FreeSwitchErrorCode, message: str) -> FreeSwitchProtocolError:
    return FreeSwitchProtocolError(code, message)


def _audio(sample_rate: int) -> AudioSpec:
    """mod_audio_stream's audio at ``sample_rate``: L16 (16-bit PCM)."""
    if sample_rate not in SAMPLE_RATES:
        raise FreeSwitchUsageError(
            FreeSwitchErrorCode.INVALID_SAMPLE_RATE,
            f"sample rate {sample_rate!r} is not one of {SAMPLE_RATES}",
        )
    return pcm(sample_rate)


# --------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class StreamStarted:
    """The stream began: with the metadata, or with the first audio when there is none."""

    call_id: str | None  # the constructor's, else JSON metadata ``callId``, else None
    sample_rate: int  # of the L16 audio both ways
    #: The metadata text as FreeSWITCH sent it, or None. It may hold a token: no repr.
    metadata: str | None = field(default=None, repr=False)
    #: JSON mode: the metadata's string members (``callId`` included). No repr either.
    parameters: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def audio(self) -> AudioSpec:
        """The stream's audio: codec and rate."""
        return _audio(self.sample_rate)

    @property
    def format(self) -> str:
        """The wire name of :attr:`audio` (``pcm_8000``), from the formats table."""
        return self.audio.name


@dataclass(frozen=True, slots=True)
class AudioReceived:
    """One BINARY frame: the caller's audio, L16 little-endian mono, whole samples."""

    payload: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class TextReceived:
    """A TEXT frame after the start: ``send_text`` or ``stop`` text [README API/Commands]."""

    text: str


FreeSwitchEvent: TypeAlias = StreamStarted | AudioReceived | TextReceived


# --------------------------------------------------------------------------- states


class FreeSwitchState(enum.Enum):
    AWAITING_START = "awaiting_start"  # nothing received yet (or, JSON mode, only audio)
    STREAMING = "streaming"
    CLOSING = "closing"  # we are closing the socket; frames in flight are dropped
    CLOSED = "closed"  # the socket is gone
    FAILED = "failed"  # FreeSWITCH misbehaved; close the leg


class FreeSwitchTrigger(enum.Enum):
    """What moves the state machine: an inbound frame, or a local action."""

    TEXT = "text"  # a TEXT frame (the metadata when it starts the stream)
    AUDIO = "audio"  # a BINARY frame that is delivered
    HELD_AUDIO = "held_audio"  # a BINARY frame held for the JSON metadata
    PLAY = "play"  # audio() or stop_audio()
    CLOSE = "close"  # close(): we are closing the socket
    CONNECTION_CLOSED = "connection_closed"  # the socket closed, either side


_S = FreeSwitchState
_T = FreeSwitchTrigger

#: Every legal transition (the module docstring draws it).
TRANSITIONS: Final[Mapping[tuple[FreeSwitchState, FreeSwitchTrigger], FreeSwitchState]] = {
    (_S.AWAITING_START, _T.TEXT): _S.STREAMING,
    (_S.AWAITING_START, _T.AUDIO): _S.STREAMING,
    (_S.AWAITING_START, _T.HELD_AUDIO): _S.AWAITING_START,
    (_S.AWAITING_START, _T.CLOSE): _S.CLOSING,
    (_S.STREAMING, _T.TEXT): _S.STREAMING,
    (_S.STREAMING, _T.AUDIO): _S.STREAMING,
    (_S.STREAMING, _T.PLAY): _S.STREAMING,
    (_S.STREAMING, _T.CLOSE): _S.CLOSING,
    (_S.CLOSING, _T.TEXT): _S.CLOSING,
    (_S.CLOSING, _T.AUDIO): _S.CLOSING,
    **{(state, _T.CONNECTION_CLOSED): _S.CLOSED for state in FreeSwitchState},
}


# --------------------------------------------------------------------------- metadata

_json_decode = msgspec.json.Decoder().decode


@dataclass(frozen=True, slots=True)
class _JsonMetadata:
    call_id: str | None
    sample_rate: int | None
    parameters: dict[str, str]


def _parse_json_metadata(raw: bytes) -> _JsonMetadata:
    """The JSON metadata convention (module docstring): an object of strings, except
    ``sampleRate``, an integer in :data:`SAMPLE_RATES`."""
    try:
        obj = _json_decode(raw)  # rejects NaN and lone-surrogate escapes, unlike json
    except (msgspec.DecodeError, RecursionError) as exc:
        raise _fail(FreeSwitchErrorCode.INVALID_JSON, f"metadata is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise _fail(FreeSwitchErrorCode.INVALID_JSON, "metadata is not a JSON object")
    sample_rate: int | None = None
    parameters: dict[str, str] = {}
    for key, value in obj.items():
        if key == "sampleRate":
            if isinstance(value, bool) or not isinstance(value, int):
                raise _fail(
                    FreeSwitchErrorCode.INVALID_METADATA, "metadata sampleRate is not an integer"
                )
            if value not in SAMPLE_RATES:
                raise _fail(
                    FreeSwitchErrorCode.UNSUPPORTED_SAMPLE_RATE,
                    f"metadata sampleRate {value} is not one of {SAMPLE_RATES}",
                )
            sample_rate = value
        elif isinstance(value, str):
            parameters[key] = value
        else:
            raise _fail(
                FreeSwitchErrorCode.INVALID_METADATA,
                f"metadata member {excerpt(key)} is not a string",
            )
    call_id = parameters.get("callId")
    if call_id is not None:
        problem = call_id_problem(call_id)
        if problem is not None:
            raise _fail(
                FreeSwitchErrorCode.INVALID_ID, f"metadata callId {excerpt(call_id)} {problem}"
            )
    return _JsonMetadata(call_id, sample_rate, parameters)


# --------------------------------------------------------------------------- connection


class FreeSwitchConnection:
    """One ``mod_audio_stream`` WebSocket, seen from our server.

    Feed TEXT frames to :meth:`receive_text` and BINARY frames to :meth:`receive_binary`;
    send what :meth:`audio` returns (``str`` as TEXT, ``bytes`` as BINARY) in order. Call
    :meth:`close` before closing the socket ourselves and :meth:`connection_closed` once
    it is closed, whoever closed it.

    ``call_id`` and ``sample_rate`` are what the gateway learnt from the URL FreeSWITCH
    dialled (None: not given). ``chunk_ms`` bounds the audio in one outbound message;
    None picks :data:`DEFAULT_STREAM_AUDIO_CHUNK_MS` or :data:`DEFAULT_BINARY_CHUNK_MS`.
    """

    def __init__(
        self,
        *,
        sample_rate: int | None = None,
        call_id: str | None = None,
        playback: FreeSwitchPlayback = FreeSwitchPlayback.STREAM_AUDIO,
        metadata: FreeSwitchMetadata = FreeSwitchMetadata.RAW,
        chunk_ms: int | None = None,
        max_text_bytes: int = DEFAULT_MAX_TEXT_BYTES,
    ) -> None:
        if sample_rate is not None:
            _audio(sample_rate)  # raises invalid_sample_rate
        if call_id is not None:
            problem = call_id_problem(call_id)
            if problem is not None:
                raise FreeSwitchUsageError(
                    FreeSwitchErrorCode.INVALID_ARGUMENT, f"call_id {excerpt(call_id)} {problem}"
                )
        if chunk_ms is None:
            chunk_ms = (
                DEFAULT_BINARY_CHUNK_MS
                if playback is FreeSwitchPlayback.BINARY
                else DEFAULT_STREAM_AUDIO_CHUNK_MS
            )
        if not MIN_CHUNK_MS <= chunk_ms <= MAX_CHUNK_MS:
            raise FreeSwitchUsageError(
                FreeSwitchErrorCode.INVALID_ARGUMENT,
                f"chunk_ms must be in {MIN_CHUNK_MS}..{MAX_CHUNK_MS}",
            )
        if max_text_bytes <= 0:
            raise FreeSwitchUsageError(
                FreeSwitchErrorCode.INVALID_ARGUMENT, "max_text_bytes must be positive"
            )
        self._configured_rate = sample_rate
        self._configured_call_id = call_id
        self._playback = FreeSwitchPlayback(playback)
        self._metadata_mode = FreeSwitchMetadata(metadata)
        self._chunk_ms = chunk_ms
        self._max_text_bytes = max_text_bytes
        self._state = FreeSwitchState.AWAITING_START
        self._start: StreamStarted | None = None
        self._held: list[bytes] = []  # JSON mode: audio before the metadata, oldest first
        self._held_bytes = 0
        self._stream_audio_head = ""  # streamAudio JSON up to the base64, per sample rate

    # ----------------------------------------------------------------- properties

    @property
    def state(self) -> FreeSwitchState:
        return self._state

    @property
    def start(self) -> StreamStarted | None:
        """The :class:`StreamStarted` event, once the stream has started."""
        return self._start

    @property
    def call_id(self) -> str | None:
        if self._start is not None:
            return self._start.call_id
        return self._configured_call_id

    @property
    def sample_rate(self) -> int:
        """The stream's rate; before the start, the configured one (or the default)."""
        if self._start is not None:
            return self._start.sample_rate
        return self._configured_rate or DEFAULT_SAMPLE_RATE

    @property
    def chunk_bytes(self) -> int:
        """The most PCM bytes :meth:`audio` puts in one message."""
        return self.sample_rate * self._chunk_ms // 1000 * SAMPLE_BYTES

    @staticmethod
    def format_name(sample_rate: int) -> str:
        """The wire name (from the formats table) of L16 at ``sample_rate``: ``pcm_8000``
        or ``pcm_16000``.

        Raises :class:`FreeSwitchUsageError` ``invalid_sample_rate`` for any other rate.
        """
        return _audio(sample_rate).name

    # ----------------------------------------------------------------- state table

    def _next(self, trigger: FreeSwitchTrigger) -> FreeSwitchState:
        """The state ``trigger`` leads to; raises :class:`FreeSwitchUsageError` if illegal."""
        next_state = TRANSITIONS.get((self._state, trigger))
        if next_state is not None:
            return next_state
        if self._state is FreeSwitchState.FAILED:
            code = FreeSwitchErrorCode.CONNECTION_FAILED
        elif self._state in (FreeSwitchState.CLOSING, FreeSwitchState.CLOSED):
            code = FreeSwitchErrorCode.CLOSED
        elif self._state is FreeSwitchState.AWAITING_START and trigger is _T.PLAY:
            code = FreeSwitchErrorCode.NOT_STREAMING
        else:  # only a trigger the receivers never produce in this state
            code = FreeSwitchErrorCode.ILLEGAL_TRANSITION
        raise FreeSwitchUsageError(code, f"{trigger.value} in state {self._state.value}")

    def _step(self, trigger: FreeSwitchTrigger) -> None:
        """Take the transition for ``trigger``; raises if the table has none."""
        self._state = self._next(trigger)

    # ----------------------------------------------------------------- inbound

    def receive_text(self, text: str) -> list[FreeSwitchEvent]:
        """One TEXT frame: the metadata (starting the stream), or later text.

        Returns ``[StreamStarted, AudioReceived...]`` (held audio, JSON mode) for the
        metadata, ``[TextReceived]`` while streaming, ``[]`` while closing. Raises
        :class:`FreeSwitchProtocolError` on remote misbehaviour (the state becomes
        ``FAILED``) and :class:`FreeSwitchUsageError` after a failure or close.
        """
        next_state = self._next(_T.TEXT)
        try:
            raw = self._check_text(text)
            if self._state is FreeSwitchState.AWAITING_START:
                events = self._started_by_metadata(text, raw)
            elif self._state is FreeSwitchState.STREAMING:
                events = [TextReceived(text)]
            else:
                events = []
        except FreeSwitchProtocolError:
            self._failed()
            raise
        self._state = next_state
        return events

    def _failed(self) -> None:
        """Remote misbehaviour: the leg is over; held audio goes."""
        self._state = FreeSwitchState.FAILED
        self._drop_held()

    def _drop_held(self) -> None:
        self._held.clear()
        self._held_bytes = 0

    def _check_text(self, text: str) -> bytes:
        if len(text) > self._max_text_bytes:  # every character is at least one byte
            raise _fail(
                FreeSwitchErrorCode.TEXT_TOO_LARGE,
                f"over {self._max_text_bytes} bytes ({len(text)} characters)",
            )
        try:
            raw = text.encode("utf-8")
        except UnicodeEncodeError:
            # A lone surrogate cannot have come off the wire (RFC 6455 5.6: UTF-8).
            raise _fail(FreeSwitchErrorCode.INVALID_TEXT, "TEXT frame is not UTF-8") from None
        if len(raw) > self._max_text_bytes:
            raise _fail(
                FreeSwitchErrorCode.TEXT_TOO_LARGE,
                f"{len(raw)} bytes, limit {self._max_text_bytes}",
            )
        if not raw:
            raise _fail(FreeSwitchErrorCode.INVALID_TEXT, "empty TEXT frame")
        return raw

    def _started_by_metadata(self, text: str, raw: bytes) -> list[FreeSwitchEvent]:
        if len(raw) > MAX_METADATA_BYTES:
            raise _fail(
                FreeSwitchErrorCode.METADATA_TOO_LARGE,
                f"metadata of {len(raw)} bytes, the module sends at most {MAX_METADATA_BYTES}",
            )
        call_id = self._configured_call_id
        rate = self._configured_rate
        parameters: dict[str, str] = {}
        if self._metadata_mode is FreeSwitchMetadata.JSON:
            parsed = _parse_json_metadata(raw)
            if parsed.call_id is not None:
                if call_id is not None and parsed.call_id != call_id:
                    raise _fail(
                        FreeSwitchErrorCode.CALL_ID_MISMATCH,
                        f"metadata callId {excerpt(parsed.call_id)} is not {call_id!r}",
                    )
                call_id = parsed.call_id
            if parsed.sample_rate is not None:
                if rate is not None and parsed.sample_rate != rate:
                    raise _fail(
                        FreeSwitchErrorCode.SAMPLE_RATE_MISMATCH,
                        f"metadata sampleRate {parsed.sample_rate} is not {rate}",
                    )
                rate = parsed.sample_rate
            parameters = parsed.parameters
        started = StreamStarted(call_id, rate or DEFAULT_SAMPLE_RATE, text, parameters)
        events: list[FreeSwitchEvent] = [started]
        events.extend(AudioReceived(frame) for frame in self._held)
        self._drop_held()
        self._start = started
        return events

    def receive_binary(self, data: bytes) -> list[FreeSwitchEvent]:
        """One BINARY frame: the caller's L16 audio.

        Returns ``[AudioReceived]`` while streaming, ``[StreamStarted, AudioReceived]``
        when it starts the stream (RAW mode), ``[]`` when held for the JSON metadata or
        while closing. Raises as :meth:`receive_text` does.
        """
        held = (
            self._state is FreeSwitchState.AWAITING_START
            and self._metadata_mode is FreeSwitchMetadata.JSON
        )
        next_state = self._next(_T.HELD_AUDIO if held else _T.AUDIO)
        payload = bytes(data)
        try:
            if not payload or len(payload) % SAMPLE_BYTES:
                raise _fail(
                    FreeSwitchErrorCode.INVALID_AUDIO,
                    f"{len(payload)} bytes is not whole 16-bit samples",
                )
            if len(payload) > MAX_AUDIO_FRAME_BYTES:
                raise _fail(
                    FreeSwitchErrorCode.AUDIO_TOO_LARGE,
                    f"{len(payload)} bytes, limit {MAX_AUDIO_FRAME_BYTES}",
                )
            if held and (
                len(self._held) >= MAX_HELD_AUDIO_FRAMES
                or self._held_bytes + len(payload) > MAX_HELD_AUDIO_BYTES
            ):
                raise _fail(
                    FreeSwitchErrorCode.METADATA_MISSING,
                    f"no metadata after {len(self._held)} audio frames "
                    f"({self._held_bytes} bytes); limits {MAX_HELD_AUDIO_FRAMES} frames, "
                    f"{MAX_HELD_AUDIO_BYTES} bytes",
                )
        except FreeSwitchProtocolError:
            self._failed()
            raise
        events: list[FreeSwitchEvent] = []
        if held:
            self._held.append(payload)
            self._held_bytes += len(payload)
        elif self._state is FreeSwitchState.AWAITING_START:  # RAW mode: audio came first
            self._start = StreamStarted(
                self._configured_call_id, self._configured_rate or DEFAULT_SAMPLE_RATE
            )
            events = [self._start, AudioReceived(payload)]
        elif self._state is FreeSwitchState.STREAMING:
            events = [AudioReceived(payload)]
        self._state = next_state
        return events

    def close(self) -> None:
        """We are about to close the socket (code 1000). This does not hang up the call:
        FreeSWITCH only fires ``mod_audio_stream::disconnect`` [src eventCallback]."""
        self._step(_T.CLOSE)
        self._drop_held()

    def connection_closed(self) -> None:
        """The socket closed, whoever closed it; legal in every state."""
        self._step(_T.CONNECTION_CLOSED)
        self._drop_held()

    # ----------------------------------------------------------------- outbound

    def audio(self, pcm: bytes) -> list[bytes | str]:
        """Messages that play ``pcm`` (L16 little-endian mono at :attr:`sample_rate`).

        ``pcm`` is cut at sample boundaries into chunks of at most :attr:`chunk_bytes`;
        nothing is held back between calls. ``STREAM_AUDIO``: one TEXT message per chunk,
        ``{"type":"streamAudio","data":{"audioDataType":"raw","sampleRate":<rate>,
        "audioData":"<base64>"}}`` [README play]. ``BINARY``: one BINARY message per
        chunk. Raises :class:`FreeSwitchUsageError` unless streaming, or for ``pcm``
        that is empty or not whole samples.
        """
        self._step(_T.PLAY)
        if not pcm or len(pcm) % SAMPLE_BYTES:
            raise FreeSwitchUsageError(
                FreeSwitchErrorCode.INVALID_PCM, f"{len(pcm)} bytes is not whole 16-bit samples"
            )
        step = self.chunk_bytes
        data = bytes(pcm)
        chunks = [data[offset : offset + step] for offset in range(0, len(data), step)]
        if self._playback is FreeSwitchPlayback.BINARY:
            return list(chunks)
        head = self._stream_audio_head
        if not head:
            # Compact JSON in the documented key order [README play]; base64 needs no
            # JSON escaping, so the text is built once, not serialised per chunk.
            head = '{"type":"streamAudio","data":{"audioDataType":"raw","sampleRate":'
            head += json.dumps(self.sample_rate) + ',"audioData":"'
            self._stream_audio_head = head
        b64encode = base64.b64encode
        return [head + b64encode(chunk).decode("ascii") + '"}}' for chunk in chunks]

    def stop_audio(self) -> str | None:
        """The message that stops our playback: None, as no build has one (module
        docstring: ESL ``uuid_break`` with the community edition). Raises
        :class:`FreeSwitchUsageError` unless streaming."""
        self._step(_T.PLAY)
        return None
