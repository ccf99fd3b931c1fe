"""The interface every TTS backend implements, and its capability record.

Two forms of synthesis:

- per segment (:class:`Backend`): ``synthesize`` is called once per text segment (a
  sentence or a clause, see :mod:`engine.text`) and streams audio out through ``emit``
  as the backend produces it. Such a backend is driven by one thread at a time, so
  backends wrapping non-thread-safe libraries (espeak-ng) need no locking.
- batched (:class:`BatchSynthesizer`): ``synthesize_batch`` takes up to ``max_batch``
  segments of many streams (one :meth:`~BatchSynthesizer.batch_key`) and emits each
  one's audio, tagged with its index, as it is produced; ``threads`` calls may run at
  once, on as many worker threads. A one-shot model (Piper) emits each segment's audio
  when the call returns; an autoregressive model implements it step by step: one decode
  step for every segment of the batch, then the chunks that step produced.

A backend whose audio may be kept in the engine's speech cache (engine/speech_cache)
says, per voice, what that audio depends on beyond the segment's text and the stream's
settings: :class:`CacheIdentity` (:class:`CacheIdentified`, read through
:func:`cache_identity_of`; a backend that says nothing is never cached).

What a backend can do beyond :class:`Backend` is declared in one typed record, its
``capabilities`` (:class:`~engine.ipc.schema.Capabilities`), read through
:func:`capabilities_of`. Which backends exist is engine/backends/table.py.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

# The table's functions, re-exported for existing callers (the table imports nothing).
from engine.backends.table import backend_names as backend_names
from engine.backends.table import create_backend as create_backend
from engine.ipc.schema import Capabilities, VoiceInfo

PcmChunk = npt.NDArray[np.int16]
# Receives int16 mono PCM at the backend's native rate; returns False to stop synthesis.
EmitFn = Callable[[PcmChunk], bool]


@dataclass(frozen=True)
class WordTiming:
    """A word of the last synthesized segment, timed against that segment's audio."""

    text: str
    start_s: float
    end_s: float


@runtime_checkable
class WordTimer(Protocol):
    """A per-segment backend that times the words it speaks (espeak-ng's word events)."""

    def last_words(self) -> Sequence[WordTiming]:
        """The words of the last :meth:`Backend.synthesize` call, in order."""
        ...


def estimate_words(text: str, duration_s: float) -> list[WordTiming]:
    """Words of ``text`` over ``duration_s`` when the backend cannot time them: the time
    shared out in proportion to each word's length (plus one for the space before it).
    An estimate: expect errors of a few hundred ms on long words and at pauses."""
    words = text.split()
    weights = [len(word) + 1 for word in words]
    total = sum(weights)
    timed: list[WordTiming] = []
    at = 0.0
    for word, weight in zip(words, weights, strict=True):
        span = duration_s * weight / total
        timed.append(WordTiming(word, at, at + span))
        at += span
    return timed


class BackendError(Exception):
    """A backend failed; ``code`` is the error code reported to the client."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class UnknownVoice(BackendError):
    def __init__(self, voice: str) -> None:
        super().__init__("unknown_voice", f"unknown voice {voice!r}")


@dataclass(frozen=True)
class VoiceSettings:
    """What a stream asked for, validated by :meth:`Backend.resolve_voice`."""

    voice_id: str
    speed: float = 1.0
    language: str | None = None
    profile: bytes | None = None
    instruct: str | None = None  # a style instruction (dialect, emotion), if any


class Backend(Protocol):
    name: str
    version: str  # changes whenever its output or its voice features change
    native_sample_rate: int  # the rate of its voices, unless voice_sample_rate says other
    max_text_chars: int

    def voices(self) -> Sequence[VoiceInfo]:
        """Built-in voices."""
        ...

    def resolve_voice(self, settings: VoiceSettings) -> object:
        """Validate ``settings`` and return an opaque handle for :meth:`synthesize`.

        Raises :class:`UnknownVoice` or :class:`BackendError`.
        """
        ...

    def synthesize(self, text: str, voice: object, emit: EmitFn) -> None:
        """Synthesize one normalized segment, calling ``emit`` with audio as it comes.

        Returns when the segment is done or ``emit`` returned False. Raises
        :class:`BackendError` on failure.
        """
        ...

    def voice_sample_rate(self, voice: object) -> int:
        """The rate of the audio ``voice`` (a :meth:`resolve_voice` handle) produces."""
        ...

    def close(self) -> None: ...


# (seconds of audio emitted, seconds the next piece is expected to take) -> go on?
Checkpoint = Callable[[float, float], bool]


@dataclass(frozen=True)
class SynthesisJob:
    """One segment of one stream in a batch: normalized text and a voice handle.
    ``leading``: the utterance's first segment, whose first audio a caller is waiting
    for (a backend may then emit a short first piece early, at some extra cost).
    ``alone``: whether the job runs while its backend runs nothing else, as the scheduler
    decided (it then starts nothing beside it: a backend that declares ``lone_calls`` may
    give the job every core); None: not said (a caller without a scheduler), the backend
    judges by what it runs. ``narrowed``: given with a lone job; the backend calls it (at
    most once) when the job goes on with one core, its first audio out, so that the
    scheduler may start another job on the cores it no longer uses. ``checkpoint``: a
    backend that decodes the job in pieces calls it before each piece after its first
    audio is out, with the seconds of audio it has emitted for the job (of that model
    call) and the seconds it expects the next piece's decode to take; the call may block
    while the job's core serves another job (its audio out plays meanwhile), and False
    means the job is no longer wanted: the backend then stops it (no further piece)."""

    text: str
    voice: object
    leading: bool = False
    alone: bool | None = None
    narrowed: Callable[[], None] | None = field(default=None, compare=False, repr=False)
    checkpoint: Checkpoint | None = field(default=None, compare=False, repr=False)


# Receives (job index, int16 PCM of that job); False: that job is no longer wanted. An
# empty chunk only asks that (an autoregressive backend asks before each step, so that a
# cancel stops its decoding at once rather than at its next chunk).
BatchEmit = Callable[[int, PcmChunk], bool]
# Receives (job index, that job's words timed against its audio); passed as
# ``synthesize_batch``'s third argument to batch backends that declare ``word_timings``.
BatchWords = Callable[[int, Sequence["WordTiming"]], None]


@runtime_checkable
class BatchSynthesizer(Protocol):
    """Backends that run several segments in one call, on several threads at once."""

    max_batch: int  # the most jobs one call takes
    threads: int  # how many calls may run at once

    def batch_key(self, voice: object) -> object:
        """Jobs batch together only when their voices' keys are equal (one model)."""
        ...

    def synthesize_batch(
        self, jobs: Sequence[SynthesisJob], emit: BatchEmit, words: BatchWords | None = None
    ) -> None:
        """Synthesize every job (all with one :meth:`batch_key`), calling ``emit`` for each
        job's audio in order, and ``words`` (given only to a backend that declares
        ``word_timings``) with each job's words. Thread-safe. Raises
        :class:`BackendError` for the whole batch."""
        ...


@runtime_checkable
class VoicePreparer(Protocol):
    """Backends that register custom voices implement this (called on the thread that
    owns the backend, like ``synthesize``). Found with ``isinstance``; the feature
    format's version is the backend's ``version``."""

    def prepare_voice(
        self, pcm16k: bytes, language: str | None, transcript: str | None = None
    ) -> bytes:
        """Features of the reference (16-bit mono PCM at 16 kHz) and, where the backend
        uses it, its transcript: a versioned blob that ``resolve_voice`` accepts as
        ``VoiceSettings.profile``. Raises BackendError."""
        ...


@runtime_checkable
class GpuMemoryReporter(Protocol):
    """Backends that may run on a GPU also report device memory (torch.cuda.mem_get_info)
    while ``on_gpu``; then the engine's hard admission threshold counts that memory."""

    on_gpu: bool

    def gpu_memory(self) -> tuple[int, int]:
        """(used bytes, total bytes) of the device the backend runs on."""
        ...


@dataclass(frozen=True, slots=True)
class CacheIdentity:
    """What a voice's audio depends on, beyond the segment's text and the stream's voice
    id, voice features, speed, instruction, language and rate (the speech cache's key,
    engine/speech_cache): ``model_digest``, a digest of the model files (a model change
    makes old entries unreachable); ``extra``, every other setting that changes the audio
    (inference scales, a voice pack's hash), as sorted (name, value) pairs;
    ``stochastic``: the backend samples, so a cached segment is one valid rendering
    among many (docs/speech-cache.md)."""

    model_digest: str
    extra: tuple[tuple[str, str], ...] = ()
    stochastic: bool = False


@runtime_checkable
class CacheIdentified(Protocol):
    """A backend whose audio may be cached (engine/speech_cache)."""

    def cache_identity(self, voice: object) -> CacheIdentity | None:
        """The identity of ``voice``'s audio (a :meth:`Backend.resolve_voice` handle), or
        None: its audio must never be cached. Cheap (digests are computed at load) and
        safe on any thread."""
        ...


def cache_identity_of(backend: Backend, voice: object) -> CacheIdentity | None:
    """``backend``'s identity for ``voice``; None when it declares none (never cached)."""
    if isinstance(backend, CacheIdentified):
        return backend.cache_identity(voice)
    return None


DIGEST_CHUNK = 1 << 20


def file_sha256(path: Path) -> str:
    """sha256 hex of a file's contents (model files of tens of MB: well under a second)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(DIGEST_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def text_sha256(*parts: str) -> str:
    """sha256 hex of ``parts`` joined by NUL (a digest of a few identifying strings)."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


@runtime_checkable
class Declares(Protocol):
    """A backend that declares what it can do (every backend of the table does)."""

    @property
    def capabilities(self) -> Capabilities: ...


def capabilities_of(backend: Backend) -> Capabilities:
    """What ``backend`` can do: its declared record. An object that declares none (a test
    double written to the protocols above) gets what its protocols show: batch, word
    timings, cloning; never independent calls, instructions or a GPU."""
    if isinstance(backend, Declares):
        return backend.capabilities
    return Capabilities(
        batch=isinstance(backend, BatchSynthesizer),
        word_timings=isinstance(backend, WordTimer),
        cloning=isinstance(backend, VoicePreparer),
    )
