"""Soft admission control: when the engine's latency degrades, new utterances queue.

Sans-I/O: the caller reports events with a timestamp and gets decisions back.

- The signal is the engine's first-audio latency: from dispatching an utterance to the
  engine to its first audio in the ring. The median over a rolling window (default 30 s)
  above ``soft_latency_s`` (default 1.5 s) means *degraded*; it recovers below half of
  that (hysteresis).
- While healthy, every utterance is dispatched at once. While degraded, utterances wait
  in one bounded FIFO per gateway worker and are dispatched only while fewer than a
  concurrency limit are in flight (dispatched, no first audio yet). The limit follows
  Little's law: the engine's recent throughput (first audios per second) times the
  target latency, so admitted work stays near the target instead of piling onto the
  engine.
- An utterance that waits longer than ``max_wait_s`` times out (``queue_timeout``); a
  full queue refuses at once (``overloaded``).

The hard threshold (memory) is enforced where memory is known, in the engine
(``StreamRejected(overloaded)`` at ``OpenStream``).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass


class QueueFull(Exception):
    """The admission queue is full: refuse the utterance with ``overloaded``."""


@dataclass(frozen=True)
class AdmissionSettings:
    soft_latency_s: float = 1.5
    window_s: float = 30.0
    max_queue: int = 256
    max_wait_s: float = 5.0
    min_samples: int = 5  # latencies needed in the window before judging


class AdmissionController:
    def __init__(self, settings: AdmissionSettings) -> None:
        self.settings = settings
        self._latencies: deque[tuple[float, float]] = deque()  # (time, seconds)
        self._sorted: list[float] = []
        self._first_audio_times: deque[float] = deque()
        self._queue: deque[tuple[Hashable, float]] = deque()  # (item, enqueued at)
        self._queued: set[Hashable] = set()
        self._in_flight: set[Hashable] = set()
        self.degraded = False

    # --- observations -------------------------------------------------------------------

    def observe_latency(self, seconds: float, now: float) -> None:
        """The engine's first-audio latency of one dispatched utterance."""
        self._latencies.append((now, seconds))
        bisect.insort(self._sorted, seconds)
        self._first_audio_times.append(now)
        self._trim(now)
        median = self.median_latency
        if median is None:
            return
        if not self.degraded and median > self.settings.soft_latency_s:
            self.degraded = True
        elif self.degraded and median < self.settings.soft_latency_s / 2:
            self.degraded = False

    def _trim(self, now: float) -> None:
        horizon = now - self.settings.window_s
        while self._latencies and self._latencies[0][0] < horizon:
            _, old = self._latencies.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, old)]
        while self._first_audio_times and self._first_audio_times[0] < horizon:
            self._first_audio_times.popleft()

    @property
    def median_latency(self) -> float | None:
        if len(self._sorted) < self.settings.min_samples:
            return None
        return self._sorted[len(self._sorted) // 2]

    @property
    def concurrency_limit(self) -> float:
        """How many utterances may be in flight now (infinite while healthy)."""
        if not self.degraded:
            return math.inf
        throughput = len(self._first_audio_times) / self.settings.window_s
        return max(1.0, math.floor(throughput * self.settings.soft_latency_s))

    @property
    def queue_length(self) -> int:
        return len(self._queue)

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    # --- decisions --------------------------------------------------------------------

    def submit(self, item: Hashable, now: float, *, at_once: bool = False) -> bool:
        """True: dispatch ``item`` now. False: it was queued (call :meth:`ready` later).

        ``at_once``: ``item`` is expected to cost the engine no synthesis (a likely
        speech-cache hit): it goes now, ahead of what waits, and counts in flight until
        its first audio like any other.

        Raises :class:`QueueFull` when it can neither go nor wait.
        """
        if at_once or (not self._queue and len(self._in_flight) < self.concurrency_limit):
            self._in_flight.add(item)
            return True
        if len(self._queue) >= self.settings.max_queue:
            raise QueueFull()
        self._queue.append((item, now))
        self._queued.add(item)
        return False

    def done(self, item: Hashable) -> None:
        """``item`` got its first audio, ended, failed or was cancelled."""
        self._in_flight.discard(item)
        if item in self._queued:
            self._queued.discard(item)
            self._queue = deque((i, t) for i, t in self._queue if i != item)

    def ready(self, now: float) -> tuple[list[Hashable], list[Hashable]]:
        """(items to dispatch now, items that waited too long: ``queue_timeout``)."""
        expired: list[Hashable] = []
        while self._queue and now - self._queue[0][1] > self.settings.max_wait_s:
            item, _ = self._queue.popleft()
            self._queued.discard(item)
            expired.append(item)
        admitted: list[Hashable] = []
        while self._queue and len(self._in_flight) < self.concurrency_limit:
            item, _ = self._queue.popleft()
            self._queued.discard(item)
            self._in_flight.add(item)
            admitted.append(item)
        return admitted, expired
