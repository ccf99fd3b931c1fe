"""Where segments are synthesized (see engine/scheduler/__init__.py):

- :class:`InlineLane`: a per-segment backend (espeak-ng: not thread-safe, streams audio
  out as it goes) runs in the coordinator thread, one segment at a time, its audio
  written as it comes;
- :class:`WorkerPool`: a batch backend (Piper, CosyVoice2) runs on ``threads`` worker
  threads, each taking one :class:`Batch` at a time; the audio, resampled by the worker,
  its words and the batch's end come back to the coordinator on the results channel. A
  lane whose leading segments come in pieces has ``spare`` more workers than cores: a
  newcomer's job waits at the lane's :class:`~engine.scheduler.cores.CoreGate` for a core
  that a running job gives it between pieces (engine/scheduler/cores.py).

Resampling is per segment: each segment's audio goes through the stream's resampler and
the resampler is flushed at the segment's end (by the worker, or the inline lane), so a
segment's bytes do not depend on the segment before it and a speech-cache hit gives the
bytes its synthesis gave. The segments of TTS backends start and end in their own
silence (pauses between sentences), so the joins are as smooth as one stream's.

Workers touch nothing of the coordinator's state: they read the slots' generations
(:class:`~engine.scheduler.state.Generations`, locked) to stop work that was cancelled,
and use the stream's resampler, which the job holds until it ends (a cancel gives the
stream a fresh one).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.backends.base import (
    Backend,
    BackendError,
    BatchSynthesizer,
    PcmChunk,
    SynthesisJob,
    WordTimer,
    WordTiming,
    capabilities_of,
)
from engine.scheduler.cores import MARGIN_S, PIECE_SAFETY, CoreGate, Ticket
from engine.scheduler.output import OutputWriter
from engine.scheduler.policy import observe_pace
from engine.scheduler.state import (
    Generations,
    Lane,
    SegmentRecord,
    StatsCounter,
    Stream,
    Utterance,
)
from engine.speech_cache import SegmentKey
from telephony.codecs.resample import StreamingResampler

if TYPE_CHECKING:
    from engine.scheduler.flights import Flight
    from engine.scheduler.warm import WarmJob

log = logging.getLogger(__name__)

#: Jobs a lane whose leading segments come in pieces may hold beyond its cores: new
#: utterances' first segments, each waiting at the CoreGate for a core given between
#: pieces (engine/scheduler/cores.py).
SPARE_JOBS = 2


@dataclass(frozen=True)
class Segment:
    """One segment of a stream's head utterance, leaving for synthesis."""

    text: str
    voice: object  # the backend's handle
    utterance: int
    offset_ms: int = 0  # where its words start in the utterance
    start_samples: int = 0  # the utterance's samples before it
    leading: bool = False  # the utterance's first audio
    key: SegmentKey | None = None  # its speech-cache key (None: not cached)


@dataclass(frozen=True)
class Job:
    """One segment of one stream, handed to a worker."""

    slot: int
    generation: int
    utterance: int
    text: str
    voice: object  # the backend's handle
    resampler: StreamingResampler  # the stream's, used by the worker while it runs the job
    segment: Segment | None = field(default=None, compare=False, repr=False)
    # The stream it was taken from (its slot may hold another stream by the time the
    # job ends); not part of the job's identity.
    stream: Stream | None = field(default=None, compare=False, repr=False)
    # A warm-up job's segment (engine/scheduler/warm.py) instead of a stream's.
    warm: WarmJob | None = field(default=None, compare=False, repr=False)
    # The flight it synthesizes (engine/scheduler/flights.py): its audio goes to every
    # listener, and ``slot``/``generation`` are the flight's own.
    flight: Flight | None = field(default=None, compare=False, repr=False)

    @property
    def leading(self) -> bool:
        return self.segment is not None and self.segment.leading


@dataclass(frozen=True)
class Batch:
    lane: Lane
    jobs: tuple[Job, ...]
    alone: bool = False  # every worker of the lane is its (Lane.runs_alone)
    newcomer: bool = False  # a new utterance's first segment (nothing of it out yet)


@dataclass(frozen=True)
class Audio:
    """A worker's output for one job, resampled to the stream's rate."""

    job: Job
    pcm: bytes
    native_samples: int = 0


@dataclass(frozen=True)
class Words:
    """A batch backend's words for one job, timed against the job's audio."""

    job: Job
    words: tuple[WordTiming, ...]


@dataclass(frozen=True)
class BatchDone:
    batch: Batch
    error: tuple[str, str] | None  # (code, message) for every job of the batch
    seconds: float  # with a core (not counting its waits at the lane's CoreGate)


@dataclass(frozen=True)
class Narrowed:
    """A lone batch goes on with one core (its backend said so: SynthesisJob.narrowed)."""

    batch: Batch


Result = Audio | Words | BatchDone | Narrowed


def lane_for(backend: Backend) -> Lane:
    """The lane the backend's capability record asks for."""
    can = capabilities_of(backend)
    if can.batch and isinstance(backend, BatchSynthesizer):
        threads, max_batch = max(1, backend.threads), max(1, backend.max_batch)
        return Lane(
            backend, backend, threads, max_batch, can.independent_calls, can.word_timings,
            lone_calls=can.lone_calls, paced_leading=can.paced_leading,
            spare=SPARE_JOBS if can.paced_leading else 0,
        )  # fmt: skip
    return Lane(backend, None, times_words=can.word_timings)


def take_segment(stream: Stream, *, record: bool) -> Segment:
    """The single point where a segment leaves its stream's head utterance, for
    synthesis or to join one in flight: taken off the utterance, with its speech-cache
    key; ``record``: the stream keeps what its ring gets of it, to store it once complete
    (not for a flight, which holds its own audio)."""
    utterance = stream.utterances[0]
    text = utterance.segments.popleft()
    utterance.checked = False
    utterance.dispatched = True
    key = utterance.keys.key(text) if utterance.keys is not None else None
    stream.record = SegmentRecord(key) if key is not None and record else None
    return Segment(
        text,
        stream.handle(),
        utterance.seq,
        offset_ms=utterance.words_ms,
        start_samples=utterance.samples,
        leading=utterance.samples == 0,
        key=key,
    )


@dataclass(frozen=True)
class Spoken:
    """A segment synthesized whole: its words if the backend timed them (else None)."""

    timed: Sequence[WordTiming] | None


class InlineLane:
    """Per-segment backends, run on the coordinator thread."""

    def __init__(self, generations: Generations, output: OutputWriter, stats: StatsCounter):
        self._generations = generations
        self._output = output
        self._stats = stats

    def run(self, stream: Stream, utterance: Utterance, segment: Segment) -> Spoken | None:
        """Synthesize ``segment`` of ``utterance`` (the stream's head), its audio into the
        stream's ring as it comes, the resampler's tail at its end. None when it failed
        (the utterance failed) or was cancelled meanwhile; else its words if timed."""
        generation = stream.generation

        def emit(chunk: PcmChunk) -> bool:
            if self._generations.current(stream.slot) != generation:
                return False  # cancelled or closed while synthesizing
            self._output.write(stream, utterance, stream.resampler.process(chunk.tobytes()))
            return True

        started = time.perf_counter()
        try:
            stream.voice.backend.synthesize(segment.text, segment.voice, emit)
        except BackendError as exc:
            self._output.fail(stream, utterance, exc.code, exc.message)
            return None
        except Exception:
            log.exception("backend failed on stream %s", stream.stream_id)
            self._output.fail(stream, utterance, "engine_error", "synthesis failed")
            return None
        finally:
            self._stats.synthesized(1, time.perf_counter() - started)
        # as for a worker lane's batch, a failed call says nothing of the pace
        observe_pace(stream.lane, time.perf_counter() - started, len(segment.text))
        if self._generations.current(stream.slot) != generation:
            return None  # cancelled or closed meanwhile: nobody wants its words
        self._output.write(stream, utterance, stream.resampler.flush())
        backend = stream.voice.backend
        if stream.lane.times_words and isinstance(backend, WordTimer):
            return Spoken(backend.last_words())
        return Spoken(None)


class WorkerPool:
    """A batch lane's worker threads."""

    def __init__(
        self,
        lane: Lane,
        batch: BatchSynthesizer,
        generations: Generations,
        results: Callable[[Result], None],
    ) -> None:
        self._lane = lane
        self._batch = batch
        self._generations = generations
        self._put = results
        self._jobs: queue.SimpleQueue[tuple[Batch, Ticket] | None] = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self.gate = lane.gate

    def start(self) -> None:
        for index in range(self._lane.threads + self._lane.spare):
            worker = threading.Thread(
                target=self._work, name=f"engine-{self._lane.backend.name}-{index}", daemon=True
            )
            self._workers.append(worker)
            worker.start()

    def submit(self, batch: Batch) -> None:
        """Hand ``batch`` to a worker (on the coordinator thread): it takes a free core now
        if there is one (the coordinator's pick goes before newcomers already waiting),
        else its worker waits for one at the gate."""
        ticket = Ticket(self._lane.cores_of(lone=batch.alone), batch.newcomer)
        self.gate.take_free(ticket)
        self._jobs.put((batch, ticket))

    def stop(self) -> None:
        """Ask every worker to end once its batch is done (one waiting for a core stops)."""
        self.gate.close()
        for _ in self._workers:
            self._jobs.put(None)

    def join(self, timeout: float) -> None:
        for worker in self._workers:
            worker.join(timeout)

    def _work(self) -> None:
        """Run batches; send the audio, words and each batch's end back as results."""
        while True:
            work = self._jobs.get()
            if work is None:
                return
            self._put(self._run(*work))

    def _run(self, batch: Batch, ticket: Ticket) -> BatchDone:
        jobs = batch.jobs
        run = _BatchRun(batch, ticket, self.gate, self._generations, self._put)
        started = time.perf_counter()
        if not self.gate.enter(ticket, run.wanted):
            stopped = ("engine_error", "the engine stopped") if self.gate.closed else None
            return BatchDone(batch, stopped, 0.0)  # cancelled while it waited: nothing ran
        error: tuple[str, str] | None = None
        segments = [
            SynthesisJob(j.text, j.voice, j.leading, batch.alone,
                         run.narrowed if batch.alone else None, None if j.warm else run.checkpoint)
            for j in jobs
        ]  # fmt: skip
        try:
            if self._lane.times_words:
                self._batch.synthesize_batch(segments, run.emit, run.timed)
            else:
                self._batch.synthesize_batch(segments, run.emit)
            for job in jobs:  # each segment's resampling ends with it (module docstring)
                if self._generations.current(job.slot) == job.generation:
                    tail = job.resampler.flush()
                    if tail:
                        self._put(Audio(job, tail))
        except BackendError as exc:
            error = (exc.code, exc.message)
        except Exception:
            log.exception("backend %s failed on a batch of %d", self._lane.backend.name, len(jobs))
            error = ("engine_error", "synthesis failed")
        finally:
            self.gate.leave(ticket)
        if error is None and self.gate.closed:
            error = ("engine_error", "the engine stopped")  # (a job may have been cut short)
        return BatchDone(batch, error, time.perf_counter() - started - ticket.waited_s)


@dataclass
class _BatchRun:
    """One batch on a worker: what its backend's callbacks share. Its audio and words go
    to the coordinator (``put``) while its jobs are wanted; at a checkpoint it may give its
    core to another job at the lane's ``gate`` (engine/scheduler/cores.py)."""

    batch: Batch
    ticket: Ticket
    gate: CoreGate
    generations: Generations
    put: Callable[[Result], None]
    first_emit: float | None = None  # when its first audio went out (monotonic)

    def wanted(self) -> bool:
        return any(self.generations.current(j.slot) == j.generation for j in self.batch.jobs)

    def emit(self, index: int, chunk: PcmChunk) -> bool:
        job = self.batch.jobs[index]
        if self.generations.current(job.slot) != job.generation:
            return False  # cancelled, or closed, while synthesizing
        pcm = job.resampler.process(chunk.tobytes())
        if pcm or len(chunk):
            if self.first_emit is None:
                self.first_emit = time.monotonic()
            self.put(Audio(job, pcm, len(chunk)))
        return True

    def timed(self, index: int, words: Sequence[WordTiming]) -> None:
        self.put(Words(self.batch.jobs[index], tuple(words)))

    def checkpoint(self, audio_out_s: float, next_s: float) -> bool:
        """A piece is next (SynthesisJob.checkpoint): False stops the job."""
        began = self.first_emit if self.first_emit is not None else time.monotonic()
        deadline = began + audio_out_s - next_s * PIECE_SAFETY - MARGIN_S
        return self.gate.checkpoint(self.ticket, deadline, next_s, self.wanted)

    def narrowed(self) -> None:
        """The lone batch goes on with one core (SynthesisJob.narrowed)."""
        self.gate.narrow(self.ticket)
        self.put(Narrowed(self.batch))
