"""Typed events a session emits toward its peer; each wire protocol encodes them.

The native protocol turns them into the JSON messages of the design brief (section 3);
telephony protocols map the ones they have (a mark, a clear) to their own messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.errors import ErrorCode, VendorCode


@dataclass(frozen=True, slots=True)
class Ready:
    session_id: str
    format: str
    sample_rate: int
    frame_ms: int


@dataclass(frozen=True, slots=True)
class UtteranceStarted:
    utterance_id: str


@dataclass(frozen=True, slots=True)
class Word:
    """A word as spoken, in ms from its utterance's first frame."""

    text: str
    start_ms: int
    end_ms: int


@dataclass(frozen=True, slots=True)
class Words:
    """Words whose audio has just started going out (``start.timestamps: "word"``)."""

    utterance_id: str
    words: tuple[Word, ...]


@dataclass(frozen=True, slots=True)
class Played:
    """What of an utterance went out: ``played_ms`` of its audio and the words that had
    begun by then (None: no word timing known)."""

    utterance_id: str
    played_ms: int
    played_text: str | None


@dataclass(frozen=True, slots=True)
class UtteranceDone:
    utterance_id: str
    audio_ms: int
    first_audio_ms: int | None
    #: ``cancel`` ended it: ``audio_ms`` is what was sent of it before.
    cancelled: bool = False
    #: Derived from the frames sent (not part of equality: the figures say what it is).
    played: Played | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class MarkReached:
    """A mark whose preceding audio was all sent (``cleared=False``) or dropped."""

    name: str
    cleared: bool = False


@dataclass(frozen=True, slots=True)
class Flushed:
    """Everything queued before a ``flush`` was sent (or dropped by a clear)."""

    flush_id: str | None


@dataclass(frozen=True, slots=True)
class Cleared:
    #: The utterance that was playing, if one was (not part of equality).
    played: Played | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class BargeIn:
    #: The utterance the caller interrupted, if one was (not part of equality).
    played: Played | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    code: ErrorCode | VendorCode
    message: str
    utterance_id: str | None = None
    retry_after_ms: int | None = None


@dataclass(frozen=True, slots=True)
class CallStarted:
    call_id: str
    protocol: str
    custom_parameters: dict[str, str]


@dataclass(frozen=True, slots=True)
class Dtmf:
    digit: str


@dataclass(frozen=True, slots=True)
class CallEnded:
    call_id: str
    reason: str


CallEvent = CallStarted | Dtmf | CallEnded
SessionEvent = (
    Ready
    | UtteranceStarted
    | UtteranceDone
    | Words
    | MarkReached
    | Flushed
    | Cleared
    | BargeIn
    | ErrorEvent
    | CallStarted
    | Dtmf
    | CallEnded
)
