"""What reaches the coordinator thread: the server's commands (put by the public methods
of :class:`~engine.scheduler.coordinator.Scheduler` on the event loop's thread) and the
speech cache's answers to shared-level lookups (put by the cache's I/O thread on the
results channel, beside the workers' results)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.scheduler.lanes import Result
from engine.scheduler.state import Stream
from engine.scheduler.warm import WarmJob, WarmRequest
from engine.speech_cache import CachedSegment, SegmentKey


@dataclass(frozen=True)
class Open:
    stream: Stream


@dataclass(frozen=True)
class Speak:
    slot: int
    utterance: int
    text: str
    final: bool
    release: bool = False
    instruct: str | None = None
    retain: bool | None = None  # the utterance's own ``cache``; None: the stream's


@dataclass(frozen=True)
class Cancel:
    slot: int
    close: bool


@dataclass(frozen=True)
class CancelUtterance:
    slot: int
    utterance: int


@dataclass(frozen=True)
class Prepare:
    request_id: int
    owner: object
    pcm16k: bytes
    language: str | None
    transcript: str | None = None


@dataclass(frozen=True)
class Warm:
    request: WarmRequest


@dataclass(frozen=True)
class Fetched:
    """The answer of a shared-level lookup for the streams waiting on ``token``."""

    token: int
    key: SegmentKey
    segment: CachedSegment | None


@dataclass(frozen=True)
class WarmFetched:
    """The answer of a shared-level lookup for a warm job's segment."""

    job: WarmJob
    token: int
    segment: CachedSegment | None


Command = Open | Speak | Cancel | CancelUtterance | Prepare | Warm
Incoming = Result | Fetched | WarmFetched
