"""Where segments are synthesized (see engine/scheduler/__init__.py):

- :class:`InlineLane`: a per-segment backend (espeak-ng: not thread-safe, streams audio
  out as it goes) runs in the coordinator thread, one segment at a time, its audio
  written as it comes;
- :class:`WorkerPool`: a batch backend (Piper, CosyVoice2) runs on ``threads`` worker
  threads, each taking one :class:`Batch` at a time; the audio, resampled by the worker,
  its words and the batch's end come back to the coordinator on the results channel.

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
from collections.abc import Sequence
from dataclasses import dataclass, field

from engine.backends.base import (
    BackendError,
    BatchSynthesizer,
    PcmChunk,
    SynthesisJob,
    WordTimer,
    WordTiming,
    estimate_words,
)
from engine.scheduler.channels import Channel
from engine.scheduler.output import OutputWriter
from engine.scheduler.policy import observe_pace
from engine.scheduler.state import Generations, Lane, StatsCounter, Stream, Utterance
from telephony.codecs.resample import StreamingResampler

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Segment:
    """One segment of a stream's head utterance, leaving for synthesis."""

    text: str
    voice: object  # the backend's handle
    utterance: int
    offset_s: float  # where its audio starts in the utterance (word times)


@dataclass(frozen=True)
class Job:
    """One segment of one stream, handed to a worker."""

    slot: int
    generation: int
    utterance: int
    text: str
    voice: object  # the backend's handle
    resampler: StreamingResampler  # the stream's, used by the worker while it runs the job
    offset_s: float = 0.0  # where its audio starts in the utterance (word times)
    # The stream it was taken from (its slot may hold another stream by the time the
    # job ends); not part of the job's identity.
    stream: Stream | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Batch:
    lane: Lane
    jobs: tuple[Job, ...]


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
    seconds: float


Result = Audio | Words | BatchDone


class InlineLane:
    """Per-segment backends, run on the coordinator thread."""

    def __init__(self, generations: Generations, output: OutputWriter, stats: StatsCounter):
        self._generations = generations
        self._output = output
        self._stats = stats

    def run(self, stream: Stream, utterance: Utterance, segment: Segment) -> None:
        """Synthesize ``segment`` of ``utterance`` (the stream's head), its audio into the
        stream's ring as it comes; then its words (timed by the backend, else estimated)."""
        generation = stream.generation
        rate = stream.voice.sample_rate

        def emit(chunk: PcmChunk) -> bool:
            if self._generations.current(stream.slot) != generation:
                return False  # cancelled or closed while synthesizing
            utterance.native_s += len(chunk) / rate
            self._output.write(stream, utterance, stream.resampler.process(chunk.tobytes()))
            return True

        started = time.perf_counter()
        try:
            stream.voice.backend.synthesize(segment.text, segment.voice, emit)
        except BackendError as exc:
            self._output.fail(stream, utterance, exc.code, exc.message)
        except Exception:
            log.exception("backend failed on stream %s", stream.stream_id)
            self._output.fail(stream, utterance, "engine_error", "synthesis failed")
        else:  # as for a worker lane's batch, a failed call says nothing of the pace
            observe_pace(stream.lane, time.perf_counter() - started, len(segment.text))
            backend = stream.voice.backend
            offset_s = segment.offset_s
            if self._generations.current(stream.slot) != generation:
                pass  # cancelled or closed meanwhile: nobody wants its words
            elif stream.lane.times_words and isinstance(backend, WordTimer):
                self._output.words(stream, utterance, offset_s, backend.last_words(), "engine")
            else:
                span = utterance.native_s - offset_s
                self._output.words(stream, utterance, offset_s, estimate_words(segment.text, span))
        finally:
            self._stats.synthesized(1, time.perf_counter() - started)


class WorkerPool:
    """A batch lane's worker threads."""

    def __init__(
        self,
        lane: Lane,
        batch: BatchSynthesizer,
        generations: Generations,
        results: Channel[Result],
    ) -> None:
        self._lane = lane
        self._batch = batch
        self._generations = generations
        self._results = results
        self._jobs: queue.SimpleQueue[Batch | None] = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []

    def start(self) -> None:
        for index in range(self._lane.threads):
            worker = threading.Thread(
                target=self._work, name=f"engine-{self._lane.backend.name}-{index}", daemon=True
            )
            self._workers.append(worker)
            worker.start()

    def submit(self, batch: Batch) -> None:
        self._jobs.put(batch)

    def stop(self) -> None:
        """Ask every worker to end once its batch is done."""
        for _ in self._workers:
            self._jobs.put(None)

    def join(self, timeout: float) -> None:
        for worker in self._workers:
            worker.join(timeout)

    def _work(self) -> None:
        """Run batches; send the audio, words and each batch's end back as results."""
        while True:
            batch = self._jobs.get()
            if batch is None:
                return
            self._results.put(self._run(batch))

    def _run(self, batch: Batch) -> BatchDone:
        jobs = batch.jobs

        def emit(index: int, chunk: PcmChunk) -> bool:
            job = jobs[index]
            if self._generations.current(job.slot) != job.generation:
                return False  # cancelled, or closed, while synthesizing
            pcm = job.resampler.process(chunk.tobytes())
            if pcm or len(chunk):
                self._results.put(Audio(job, pcm, len(chunk)))
            return True

        def timed(index: int, words: Sequence[WordTiming]) -> None:
            self._results.put(Words(jobs[index], tuple(words)))

        started = time.perf_counter()
        error: tuple[str, str] | None = None
        segments = [SynthesisJob(j.text, j.voice, j.offset_s == 0.0) for j in jobs]
        try:
            if self._lane.times_words:
                self._batch.synthesize_batch(segments, emit, timed)
            else:
                self._batch.synthesize_batch(segments, emit)
        except BackendError as exc:
            error = (exc.code, exc.message)
        except Exception:
            log.exception("backend %s failed on a batch of %d", self._lane.backend.name, len(jobs))
            error = ("engine_error", "synthesis failed")
        return BatchDone(batch, error, time.perf_counter() - started)
