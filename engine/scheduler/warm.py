"""Warm-up jobs: a prompt's segments rendered into the speech cache with no stream and no
ring, behind every call (engine/scheduler/__init__.py, "Warm-up").

A job's segments are done in order: each is looked up (memory, then the shared level),
and one that neither holds is synthesized when its lane has nothing else to do. The job
ends when every segment is cached, or with an error code; its ``done`` callback is then
called once, on the coordinator thread (it must not block).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.backends.routing import RoutedVoice
from engine.scheduler.state import Lane
from engine.speech_cache import SegmentKey

MAX_WARM_JOBS = 256  # warm jobs queued at once in one engine; more are "overloaded"
WARM_TIMEOUT_S = 120.0  # a job not done by then ends with "queue_timeout"


@dataclass(frozen=True)
class WarmOutcome:
    """How a warm job ended: ``error`` None when every segment is cached."""

    request_id: int
    owner: object
    texts: tuple[str, ...]
    keys: tuple[SegmentKey, ...]
    error: tuple[str, str] | None = None


@dataclass(frozen=True)
class WarmRequest:
    """A prompt to render into the cache: its voice, its segments and their keys (made
    by the server with the stream's splitter and key maker, so they match a stream's)."""

    request_id: int
    owner: object
    voice: RoutedVoice
    texts: tuple[str, ...]
    keys: tuple[SegmentKey, ...]
    done: Callable[[WarmOutcome], None]
    #: The speech cache's epoch when it was asked for (SpeechCache.epoch): a voice
    #: forgotten since is not stored. None: not checked.
    epoch: int | None = None


@dataclass(eq=False)
class WarmJob:
    """A warm request as the coordinator works through it (coordinator thread only)."""

    request: WarmRequest
    lane: Lane
    deadline: float
    index: int = 0  # its next segment
    checked: bool = False  # that segment was looked up and missed: synthesize it
    fetching: int = 0  # the token of its shared-level lookup (0: none)
    busy: bool = False  # that segment is in flight (engine/scheduler/flights.py)
    error: tuple[str, str] | None = None

    @classmethod
    def start(cls, request: WarmRequest, lane: Lane, timeout_s: float) -> WarmJob:
        return cls(request, lane, time.monotonic() + timeout_s)

    @property
    def finished(self) -> bool:
        return self.error is not None or self.index >= len(self.request.keys)

    @property
    def waiting(self) -> bool:
        """A lookup or a synthesis of it is out."""
        return self.busy or bool(self.fetching)

    @property
    def to_synthesize(self) -> bool:
        """Its current segment was looked up, missed, and waits for a lane."""
        return self.checked and not self.waiting and not self.finished

    def next_segment(self) -> None:
        """Its current segment is cached: on to the next."""
        self.index += 1
        self.checked = False

    def outcome(self) -> WarmOutcome:
        request = self.request
        return WarmOutcome(request.request_id, request.owner, request.texts, request.keys,
                           self.error)  # fmt: skip
