"""Warm-up jobs as the coordinator runs them (engine/scheduler/warm.py holds the jobs):
a prompt's segments are looked up (memory, a synthesis of them in flight, the shared
level) and, where missing, synthesized on idle capacity only. Coordinator thread only.

- An inline lane's (espeak) warm segment is synthesized by the coordinator itself and
  given up the moment anything arrives for it (a command, a result): a call never waits
  behind a warm-up; the segment is done again later.
- A worker lane takes one warm segment at a time, only while no call has segments for
  it, leaving a worker free when it has several. It runs as a flight
  (engine/scheduler/flights.py): a call that asks for that segment meanwhile joins it,
  and a warm job whose segment is already in flight for a call waits for that one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from engine.backends.base import BackendError, PcmChunk, WordTimer, estimate_words
from engine.scheduler.channels import Wakeup
from engine.scheduler.commands import WarmFetched
from engine.scheduler.flights import Flight, FlightTable
from engine.scheduler.lanes import Batch, Job, Segment, WorkerPool
from engine.scheduler.output import RelativeWords, relative_words
from engine.scheduler.state import Lane, StatsCounter
from engine.scheduler.warm import WarmJob, WarmRequest
from engine.speech_cache import CachedSegment, SegmentKey, SpeechCache
from telephony.codecs.resample import StreamingResampler

log = logging.getLogger(__name__)


class Host(Protocol):
    """What the warm-ups need of the coordinator."""

    def call_work(self, lane: Lane) -> bool:
        """Whether a call has segments for ``lane`` that no worker holds."""
        ...

    def interrupting(self, lane: Lane) -> bool:
        """Take what has arrived for the coordinator and serve the calls it brings;
        True if a call was served or now has work for ``lane`` (an inline warm-up must
        give way)."""
        ...


class WarmUps:
    def __init__(
        self,
        cache: SpeechCache,
        flights: FlightTable,
        counters: StatsCounter,
        put: Callable[[WarmFetched], None],
        wakeup: Wakeup,
        stopping: threading.Event,
        *,
        max_jobs: int,
        timeout_s: float,
        cost_factor: float,
    ) -> None:
        self._cache = cache
        self._flights = flights
        self._counters = counters
        self._put = put
        self._wakeup = wakeup
        self._stopping = stopping
        self._slots = threading.BoundedSemaphore(max_jobs)
        self._timeout_s = timeout_s
        self._cost_factor = cost_factor
        self._jobs: deque[WarmJob] = deque()
        self._tokens = 0

    def __bool__(self) -> bool:
        return bool(self._jobs)

    def reserve(self) -> bool:
        """A place for one more job (False: ``max_jobs`` are queued); any thread."""
        return self._slots.acquire(blocking=False)

    def start(self, request: WarmRequest, lane: Lane) -> None:
        self._jobs.append(WarmJob.start(request, lane, self._timeout_s))

    def _finish(self, job: WarmJob) -> None:
        self._jobs.remove(job)
        self._slots.release()
        job.request.done(job.outcome())

    def expire(self, now: float) -> None:
        for job in list(self._jobs):
            if now > job.deadline and not job.busy:
                job.error = ("queue_timeout", "not rendered in time: the engine is busy")
                self._finish(job)

    def to_synthesize(self, lane: Lane) -> bool:
        return any(job.lane is lane and job.to_synthesize for job in self._jobs)

    def advance(self, host: Host) -> bool:
        """Move the jobs on: look their segments up (memory, a flight, the shared level),
        and synthesize one segment of an inline lane's job if no call has work for that
        lane. True if it did something that may let more be done at once."""
        progressed = False
        for job in list(self._jobs):
            while not job.waiting and not job.finished and not job.checked:
                key = job.request.keys[job.index]
                flight = self._flights.joinable(key)
                if self._cache.contains_local(key):  # not a call's lookup: not counted
                    job.next_segment()
                elif flight is not None:
                    job.busy = True  # its segment is in flight: cached when it ends
                    flight.warm.append(job)
                elif self._cache.has_shared:
                    self._fetch(job, key)
                else:
                    job.checked = True
            if job.finished and not job.waiting:
                self._finish(job)
                progressed = True
        for job in self._jobs:
            if job.to_synthesize and job.lane.batch is None and not host.call_work(job.lane):
                return self._inline(job, host) or progressed
        return progressed

    def _fetch(self, job: WarmJob, key: SegmentKey) -> None:
        self._tokens += 1
        token = job.fetching = self._tokens
        put = self._put

        def answer(_key: SegmentKey, found: CachedSegment | None) -> None:
            put(WarmFetched(job, token, found))

        self._cache.fetch(key, answer)

    def take_fetched(self, fetched: WarmFetched) -> None:
        job = fetched.job
        if job.fetching != fetched.token:
            return
        job.fetching = 0
        if fetched.segment is not None:
            job.next_segment()
        else:
            job.checked = True

    def _inline(self, job: WarmJob, host: Host) -> bool:
        """Synthesize the current segment of ``job`` (an inline lane's) here, given up as
        soon as anything arrives for the coordinator (a call must not wait behind it: the
        segment is done again later). True if it completed or failed."""
        self._wakeup.clear()  # from here on, any put interrupts the warm-up
        if host.interrupting(job.lane):
            return True  # calls first: the coordinator comes back to the job later
        request = job.request
        voice = request.voice
        key = request.keys[job.index]
        resampler = StreamingResampler(voice.sample_rate, key.sample_rate)
        pcm = bytearray()
        interrupted = False

        def emit(chunk: PcmChunk) -> bool:
            nonlocal interrupted
            if self._wakeup.is_set() or self._stopping.is_set():
                interrupted = True
                return False
            pcm.extend(resampler.process(chunk.tobytes()))
            return True

        started = time.perf_counter()
        try:
            voice.backend.synthesize(request.texts[job.index], voice.handle, emit)
        except BackendError as exc:
            job.error = ("synthesis_failed", exc.message)
        except Exception:
            log.exception("warm-up synthesis failed")
            job.error = ("synthesis_failed", "synthesis failed")
        finally:
            self._counters.synthesized(1, time.perf_counter() - started)
        if interrupted or job.error is not None:
            return job.error is not None
        pcm.extend(resampler.flush())
        backend = voice.backend
        timed = None
        if job.lane.times_words and isinstance(backend, WordTimer):
            timed = relative_words(backend.last_words())
        self._store(job, bytes(pcm), timed)
        return True

    def _store(self, job: WarmJob, pcm: bytes, timed: RelativeWords | None) -> None:
        """The current segment of ``job`` is synthesized: into the cache, on to the next."""
        key = job.request.keys[job.index]
        if timed is None:
            span = len(pcm) // 2 / key.sample_rate
            timed = relative_words(estimate_words(job.request.texts[job.index], span))
        self._cache.put(key, CachedSegment(pcm, timed), since=job.request.epoch)
        job.next_segment()

    def dispatch(self, lane: Lane, pool: WorkerPool, host: Host) -> None:
        """Hand a worker lane's idle worker one warm-up segment as a flight, keeping a
        worker free for calls when the lane has more than one, and one warm segment at a
        time."""
        if lane.warm_busy or host.call_work(lane):
            return
        if lane.in_flight >= (1 if lane.threads == 1 else lane.threads - 1):
            return
        job = next((j for j in self._jobs if j.lane is lane and j.to_synthesize), None)
        if job is None:
            return
        request = job.request
        key = request.keys[job.index]
        text = request.texts[job.index]
        resampler = StreamingResampler(request.voice.sample_rate, key.sample_rate)
        flight = self._flights.begin(key, text, lane, resampler)
        segment = Segment(text, request.voice.handle, 0, leading=job.index == 0, key=key)
        work = Batch(
            lane,
            (
                Job(
                    flight.slot,
                    flight.generation,
                    0,
                    text,
                    request.voice.handle,
                    resampler,
                    segment,
                    warm=job,
                    flight=flight,
                ),
            ),
        )
        job.busy = True
        flight.warm.append(job)
        lane.warm_busy = True
        now = time.monotonic()
        flight.expected_end = now + lane.call_seconds(len(text)) * self._cost_factor
        lane.begin(id(work), flight.expected_end, len(text), now, self._cost_factor)
        pool.submit(work)

    def flight_ended(self, flight: Flight, stored: bool, error: tuple[str, str] | None) -> None:
        """``flight`` ended: every warm job waiting for it moves on (its segment stored),
        looks it up again (not stored), or fails."""
        for job in flight.warm:
            job.busy = False
            if error is not None:
                job.error = ("synthesis_failed", error[1])
            elif stored:
                job.next_segment()
            else:
                job.checked = False
            if job.finished:
                self._finish(job)
