"""Typed control messages between the gateway and the engine.

This module is the whole control-channel contract. Audio never travels here: it goes
through the shared-memory rings of :mod:`engine.ipc.shm`. Every message is a msgspec
``Struct`` with a tag; the channel carries one MessagePack-encoded message per frame,
each frame prefixed by its length as a 4-byte big-endian unsigned integer (see
:class:`FrameDecoder`).

Conversation (gateway = client, engine = server)::

    Hello            ->                       (first message; protocol version)
                     <-  Welcome              (shared-memory layout, voices)
    Ping             ->  Pong                 (heartbeat)
    OpenStream       ->  StreamOpened | StreamRejected
    Speak            ->  (UtteranceAudio, UtteranceEnd | UtteranceFailed)
    PrepareVoice     ->  VoicePrepared | VoicePrepareFailed
    WarmPrompt       ->  PromptState          (every segment rendered into the speech cache)
    CheckPrompt      ->  PromptState          (which cache levels hold each segment)
    ForgetVoice      ->  (nothing)            (a registered voice's cached speech is dropped)
    PurgeTenant      ->  TenantPurged         (everything cached from a tenant is dropped)
    Cancel           ->  Cancelled            (no more writes to the slot after write_pos)
    CloseStream      ->  StreamClosed         (the slot is free again)

Stream ids are chosen by the gateway and unique per connection. Utterance sequence
numbers are chosen by the gateway and increase per stream. Ring positions are the
monotonic byte positions of :class:`engine.ipc.ring.SpscRing`.
"""

from __future__ import annotations

import struct
from typing import Final

import msgspec

# 2: UtteranceWords, Speak.release, CancelUtterance; 3: speech cache; 4: its tenants
# (OpenStream.tenant/retain/voice_digest, Speak.retain, PromptRequest.tenant/shared,
# ForgetVoice.tenant, PurgeTenant)
PROTOCOL_VERSION: Final = 4
MAX_FRAME_BYTES: Final = 4 << 20  # a 30 s reference recording (PrepareVoice) is ~1 MB
MAX_INSTRUCT_CHARS: Final = 200  # ``instruct`` (start, speak): a style instruction
_LENGTH = struct.Struct(">I")


class Message(msgspec.Struct, tag=True, kw_only=True):
    """Base of every control message."""


# --- gateway -> engine -------------------------------------------------------------


class Hello(Message):
    protocol_version: int
    client: str


class Ping(Message):
    seq: int


class OpenStream(Message):
    """Ask for a slot. ``voice`` is a voice id from :class:`Welcome`."""

    stream_id: int
    voice: str
    sample_rate: int
    speed: float = 1.0
    language: str | None = None
    # Opaque, backend-specific voice profile (a later voice registry fills it).
    voice_profile: bytes | None = None
    # Duplex: the gateway writes caller audio (16-bit PCM at this rate) into the slot's
    # inbound ring and the engine runs VAD on it. None: no caller audio.
    input_sample_rate: int | None = None
    # A style instruction (dialect, emotion) for backends that follow one (CosyVoice2);
    # others refuse the stream with ``instruct_unsupported``.
    instruct: str | None = None
    # The speech cache: whose speech it is (no tenant hits, checks or evicts another's),
    # whether its utterances may be kept by default (``cache``, DESIGN.md section 8), and
    # the registered voice's digest (engine/speech_cache/key.py registered_voice_digest).
    tenant: str = ""
    retain: bool = True
    voice_digest: str = ""


class Speak(Message):
    """Text for utterance ``utterance``; ``final`` means no more text follows for it;
    ``release`` (not final): synthesize what is buffered up to its last word boundary
    now, without waiting for a clause to end (``start.max_buffer_delay_ms``)."""

    stream_id: int
    utterance: int
    text: str
    final: bool = True
    release: bool = False
    # With an utterance's first text only: its own style instruction (``instruct``) and
    # its own ``cache`` (None: the stream's).
    instruct: str | None = None
    retain: bool | None = None


class Cancel(Message):
    """Drop every queued and running utterance of the stream."""

    stream_id: int


class CancelUtterance(Message):
    """Stop synthesizing ``utterance``: its segments not yet begun are dropped and the
    segment in progress is its last; it then ends as usual (``UtteranceEnd``), so the
    gateway knows where its audio stops. Later text for it is ignored. No reply."""

    stream_id: int
    utterance: int


class CloseStream(Message):
    stream_id: int


class PrepareVoice(Message):
    """Extract a voice's features from reference audio (16-bit mono PCM at 16 kHz,
    normalized, silence trimmed). Answered by VoicePrepared or VoicePrepareFailed."""

    request_id: int
    pcm16k: bytes
    language: str | None = None
    transcript: str | None = None


class PromptRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A prompt as a stream would speak it: what the speech cache's keys are made of on
    the gateway's side (the engine adds the backend, the model digest and the segments)."""

    voice: str
    text: str
    sample_rate: int
    speed: float = 1.0
    language: str | None = None
    voice_profile: bytes | None = None  # a registered voice's features
    instruct: str | None = None
    # Whose prompt it is: a tenant's (its calls alone hear it from the cache), or
    # ``shared``, declared by the operator (the prompts file, the SIP flows): every
    # tenant's calls of its text hear it. ``voice_digest`` as in OpenStream.
    tenant: str = ""
    shared: bool = False
    voice_digest: str = ""


class WarmPrompt(Message):
    """Render ``prompt`` into the speech cache, behind the calls' work (it never delays a
    call). Answered by PromptState once every segment is cached (or with ``code``)."""

    request_id: int
    prompt: PromptRequest


class CheckPrompt(Message):
    """Which cache levels hold each segment of ``prompt``; synthesizes nothing.
    Answered by PromptState."""

    request_id: int
    prompt: PromptRequest


class ForgetVoice(Message):
    """Drop every cached segment spoken in the registered voice of ``tenant`` with this
    digest (OpenStream.voice_digest), in every level. No answer."""

    voice_digest: str
    tenant: str = ""


class PurgeTenant(Message):
    """Drop everything cached from ``tenant``'s calls and prompts, in every level (the
    tenant's erasure). Answered by TenantPurged."""

    request_id: int
    tenant: str


# --- engine -> gateway -------------------------------------------------------------


class VoiceInfo(msgspec.Struct, kw_only=True):
    id: str
    language: str
    name: str
    backend: str
    gender: str | None = None


class Capabilities(msgspec.Struct, frozen=True, kw_only=True):
    """What a backend can do: declared by the backend (its ``capabilities``), read by the
    engine's scheduler (its lane) and routing, and by the gateway (``Welcome``)."""

    # A call costs the same whatever runs beside it (one call per core): its lane admits
    # new utterances by measured capacity (engine/capacity.py).
    independent_calls: bool = False
    batch: bool = False  # runs segments of many streams per call, on worker threads
    word_timings: bool = False  # times the words it speaks (else they are estimated)
    # A call that runs alone may take every core (SynthesisJob.alone): the scheduler then
    # gives it every worker of the lane, so that nothing decodes beside it.
    lone_calls: bool = False
    # A job marked ``leading`` is decoded in pieces whose first audio goes out only once
    # the rest of its segment can follow at the pace the backend measures: from its first
    # frame on, the scheduler counts all of that segment's audio as playing without a gap.
    paced_leading: bool = False
    cloning: bool = False  # prepares registered voices from a reference recording
    instruct: bool = False  # takes a free-text style instruction
    device: str = "cpu"  # where it runs: "cpu" or "cuda"


class Welcome(Message):
    protocol_version: int
    engine_pid: int
    backend: str
    shm_name: str
    shm_directory: str
    slots: int
    out_ring_bytes: int
    in_ring_bytes: int
    native_sample_rate: int
    max_text_chars: int
    voices: tuple[VoiceInfo, ...]
    vad: bool = False  # caller-audio VAD available
    backend_version: str = ""  # changes when the backend's voice features change
    voice_cloning: bool = False  # a backend implements PrepareVoice
    # The backend that prepares registered voices and speaks them ("" when none): their
    # base voice is one of its voices (each VoiceInfo names its backend).
    cloning_backend: str = ""
    # Each backend's name -> what it can do.
    capabilities: dict[str, Capabilities] = msgspec.field(default_factory=dict)


class CacheLevelStats(msgspec.Struct, kw_only=True):
    """One level of the speech cache, as counted since the engine started."""

    level: str  # "memory" (this engine) or "shared" (the host, or every instance)
    store: str  # "memory", "directory" or "redis"
    hits: dict[str, int] = msgspec.field(default_factory=dict)  # backend -> lookups found
    misses: dict[str, int] = msgspec.field(default_factory=dict)  # backend -> not found
    entries: int = 0
    bytes: int = 0
    evictions: int = 0  # entries dropped for the byte budgets (the level's, a tenant's)
    errors: int = 0  # lookups or writes that failed or timed out (counted as misses)
    rejected: int = 0  # shared entries that failed authentication (deleted, missed)


class SpeechCacheStats(msgspec.Struct, kw_only=True):
    enabled: bool
    levels: tuple[CacheLevelStats, ...] = ()
    # Syntheses heard by more than one stream (engine/scheduler/flights.py): segments a
    # stream heard from another's synthesis in flight, and their audio.
    joined_segments: int = 0
    joined_audio_seconds: float = 0.0
    # Hits on the words before a personal item (cut apart to be reused), and their audio.
    prefix_hits: int = 0
    prefix_audio_seconds: float = 0.0
    # Every stream's audio, and what of it came from the cache: with the joined audio,
    # what synthesis spared (synthesized = played - cached - joined).
    played_audio_seconds: float = 0.0
    cached_audio_seconds: float = 0.0


class Pong(Message):
    seq: int
    active_streams: int
    queued_utterances: int
    rss_bytes: int
    gpu_used_bytes: int = 0
    gpu_total_bytes: int = 0
    memory_used_bytes: int = 0  # what the admission threshold counts (GPU, else RSS)
    memory_budget_bytes: int = 0
    vad_ready: bool = False  # the caller-audio VAD model is loaded
    speech_cache: SpeechCacheStats | None = None


class StreamOpened(Message):
    stream_id: int
    slot: int


class StreamRejected(Message):
    stream_id: int
    code: str
    message: str


class UtteranceAudio(Message):
    """The first bytes of ``utterance`` are in the outbound ring from ``start_pos``."""

    stream_id: int
    utterance: int
    start_pos: int
    # Where the first segment's audio came from: "hit" (the speech cache), "join" (another
    # stream's synthesis of it, in flight), "miss" (synthesized), "" (the cache is off).
    cache: str = ""


class WordTime(msgspec.Struct, array_like=True):
    """One word as spoken (normalized text: "$12" is "twelve dollars"), in ms from the
    utterance's first sample."""

    text: str
    start_ms: int
    end_ms: int


class UtteranceWords(Message):
    """The words of one segment of ``utterance``, sent once that segment's audio is
    out. ``source``: ``engine`` (the backend timed them: espeak-ng's word events) or
    ``estimate`` (the segment's duration shared out by word length)."""

    stream_id: int
    utterance: int
    words: tuple[WordTime, ...]
    source: str = "engine"


class UtteranceEnd(Message):
    """Every byte of ``utterance`` is in the ring; it ends at ``end_pos`` (exclusive).

    ``start_pos == end_pos`` is an utterance that produced no audio.
    """

    stream_id: int
    utterance: int
    start_pos: int
    end_pos: int
    samples: int


class UtteranceFailed(Message):
    """``utterance`` was dropped. If some of its audio reached the ring, that audio
    spans ``start_pos`` to ``end_pos``; otherwise both are None."""

    stream_id: int
    utterance: int
    code: str
    message: str
    start_pos: int | None = None
    end_pos: int | None = None


class Cancelled(Message):
    """The engine will write nothing more for work queued before the Cancel.

    Bytes before ``write_pos`` belong to cancelled work and should be discarded.
    """

    stream_id: int
    write_pos: int


class VoicePrepared(Message):
    """``features`` is the backend's versioned profile blob (``OpenStream.voice_profile``)."""

    request_id: int
    features: bytes
    backend: str
    version: str
    seconds: float  # extraction time


class VoicePrepareFailed(Message):
    request_id: int
    code: str
    message: str


class SpeechStarted(Message):
    """Caller speech began (VAD), ``audio_ms`` into the stream's caller audio."""

    stream_id: int
    audio_ms: int


class SegmentState(msgspec.Struct, array_like=True):
    """One segment of a prompt: its normalized text and the levels holding it."""

    text: str
    levels: tuple[str, ...]  # "memory", "shared": those that hold it now


class PromptState(Message):
    """Answer to WarmPrompt and CheckPrompt. ``code`` is "" on success, else an error
    code (``unknown_voice``, ``text_too_long``, ``speech_cache_off``, ``synthesis_failed``,
    ``queue_timeout``) with ``message``."""

    request_id: int
    segments: tuple[SegmentState, ...] = ()
    code: str = ""
    message: str = ""


class TenantPurged(Message):
    """Answer to PurgeTenant: ``entries`` the memory level dropped (the shared level's
    are gone too unless ``code`` says otherwise: ``speech_cache_off``, ``engine_error``)."""

    request_id: int
    entries: int = 0
    code: str = ""
    message: str = ""


class StreamClosed(Message):
    """The engine no longer touches the stream's slot."""

    stream_id: int
    slot: int | None = None


class ProtocolError(Message):
    """The peer sent something the engine could not decode; the connection closes."""

    message: str


ToEngine = (
    Hello
    | Ping
    | OpenStream
    | Speak
    | Cancel
    | CancelUtterance
    | CloseStream
    | PrepareVoice
    | WarmPrompt
    | CheckPrompt
    | ForgetVoice
    | PurgeTenant
)
FromEngine = (
    Welcome
    | Pong
    | StreamOpened
    | StreamRejected
    | UtteranceAudio
    | UtteranceWords
    | UtteranceEnd
    | UtteranceFailed
    | Cancelled
    | StreamClosed
    | SpeechStarted
    | VoicePrepared
    | VoicePrepareFailed
    | PromptState
    | TenantPurged
    | ProtocolError
)

_encoder = msgspec.msgpack.Encoder()
_to_engine_decoder = msgspec.msgpack.Decoder(ToEngine)
_from_engine_decoder = msgspec.msgpack.Decoder(FromEngine)


class FramingError(ValueError):
    """The byte stream is not a valid sequence of frames (remote misbehaviour)."""


def encode(message: Message) -> bytes:
    """One length-prefixed frame holding ``message``."""
    body = _encoder.encode(message)
    if len(body) > MAX_FRAME_BYTES:
        raise ValueError(f"control message of {len(body)} bytes exceeds {MAX_FRAME_BYTES}")
    return _LENGTH.pack(len(body)) + body


class FrameDecoder:
    """Sans-I/O decoder: feed bytes, get typed messages back.

    ``direction`` picks which union is accepted: ``"to_engine"`` on the engine side,
    ``"from_engine"`` on the gateway side. Raises :class:`FramingError` on an oversized
    frame or an undecodable/unknown message; the caller must then drop the connection.
    """

    def __init__(self, direction: str) -> None:
        if direction == "to_engine":
            self._decoder: (
                msgspec.msgpack.Decoder[ToEngine] | msgspec.msgpack.Decoder[FromEngine]
            ) = _to_engine_decoder
        elif direction == "from_engine":
            self._decoder = _from_engine_decoder
        else:
            raise ValueError(f"unknown direction {direction!r}")
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Message]:
        self._buffer += data
        out: list[Message] = []
        buffer = self._buffer
        offset = 0
        while len(buffer) - offset >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(buffer, offset)
            if length > MAX_FRAME_BYTES:
                raise FramingError(f"frame of {length} bytes exceeds {MAX_FRAME_BYTES}")
            end = offset + _LENGTH.size + length
            if len(buffer) < end:
                break
            try:
                message = self._decoder.decode(memoryview(buffer)[offset + _LENGTH.size : end])
            except msgspec.DecodeError as exc:
                raise FramingError(f"undecodable control message: {exc}") from exc
            out.append(message)
            offset = end
        if offset:
            del buffer[:offset]
        return out
