"""The coordinator: one thread that owns every stream, takes the server's commands and
the workers' results, applies the policy (engine/scheduler/policy.py) and hands segments
to the lanes (engine/scheduler/lanes.py); the output writer (engine/scheduler/output.py)
puts their audio into the rings. See engine/scheduler/__init__.py for the rules.

Thread contract: the public methods (``open_stream``, ``speak``, ``cancel``,
``close_stream``, ``stop``) are called from the server's event-loop thread; they bump
the slot's generation (locked) and put a command on the command channel. Everything else
runs on the coordinator thread, but for the lanes' workers, which only synthesize,
resample and put results on the results channel. Events go out through the
``on_event`` callback, called on the coordinator thread.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from engine.backends.base import (
    Backend,
    BackendError,
    BatchSynthesizer,
    VoicePreparer,
    capabilities_of,
    estimate_words,
)
from engine.backends.routing import BackendSet, RoutedVoice
from engine.capacity import COST_FACTOR, MARGIN_S
from engine.ipc.boundaries import BoundaryWriter
from engine.ipc.ring import SpscRing
from engine.ipc.schema import (
    Cancelled,
    Message,
    StreamClosed,
    VoicePrepared,
    VoicePrepareFailed,
)
from engine.scheduler import policy
from engine.scheduler.channels import Channel, Wakeup
from engine.scheduler.lanes import (
    Audio,
    Batch,
    BatchDone,
    InlineLane,
    Job,
    Result,
    Segment,
    Words,
    WorkerPool,
)
from engine.scheduler.output import EventSink, OutputWriter
from engine.scheduler.policy import RESERVE_FACTOR, RESERVE_FLOOR_S, Policy
from engine.scheduler.state import (
    Generations,
    Lane,
    SchedulerStats,
    StatsCounter,
    Stream,
    Utterance,
)
from engine.text import SegmentSplitter
from telephony.codecs.resample import StreamingResampler

log = logging.getLogger(__name__)

STATS_INTERVAL_S = 0.1
PENDING_POLL_S = 0.004
IDLE_WAIT_S = 0.5
START_TIMEOUT_S = 10.0  # a new utterance that can start but is not started fails then


@dataclass(frozen=True)
class _Open:
    stream: Stream


@dataclass(frozen=True)
class _Speak:
    slot: int
    utterance: int
    text: str
    final: bool
    release: bool = False
    instruct: str | None = None


@dataclass(frozen=True)
class _Cancel:
    slot: int
    close: bool


@dataclass(frozen=True)
class _CancelUtterance:
    slot: int
    utterance: int


@dataclass(frozen=True)
class _Prepare:
    request_id: int
    owner: object
    pcm16k: bytes
    language: str | None
    transcript: str | None = None


_Command = _Open | _Speak | _Cancel | _CancelUtterance | _Prepare


def _lane_for(backend: Backend) -> Lane:
    """The lane the backend's capability record asks for."""
    can = capabilities_of(backend)
    if can.batch and isinstance(backend, BatchSynthesizer):
        threads, max_batch = max(1, backend.threads), max(1, backend.max_batch)
        return Lane(backend, backend, threads, max_batch, can.independent_calls, can.word_timings)
    return Lane(backend, None, times_words=can.word_timings)


class Scheduler:
    def __init__(
        self,
        backends: BackendSet,
        on_event: EventSink,
        *,
        max_text_chars: int,
        tap_directory: str | None = None,
        reserve_factor: float = RESERVE_FACTOR,
        reserve_floor_s: float = RESERVE_FLOOR_S,
        cost_factor: float = COST_FACTOR,
        margin_s: float = MARGIN_S,
        on_fatal: Callable[[BaseException], None] | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self._tap_directory = tap_directory
        self._start_timeout_s = start_timeout_s
        self._on_fatal = on_fatal
        self._policy = Policy(reserve_factor, reserve_floor_s, cost_factor, margin_s)
        self._backends = backends
        self._on_event = on_event
        self._max_text_chars = max_text_chars
        self._counters = StatsCounter()
        self._generations = Generations()
        self._wakeup = Wakeup()
        self._commands: Channel[_Command] = Channel(self._wakeup)
        self._results: Channel[Result] = Channel(self._wakeup)
        self._output = OutputWriter(on_event, self._counters)
        self._inline = InlineLane(self._generations, self._output, self._counters)
        self._lanes: dict[int, Lane] = {}
        self._pools: dict[int, WorkerPool] = {}  # id(lane) -> its workers (batch lanes)
        for backend in backends.members:
            lane = _lane_for(backend)
            self._lanes[id(backend)] = lane
            if lane.batch is not None:
                self._pools[id(lane)] = WorkerPool(
                    lane, lane.batch, self._generations, self._results
                )
        self._timed_jobs: set[Job] = set()  # jobs whose words the backend timed
        self._streams: dict[int, Stream] = {}
        # Slots whose head utterance may have segments to synthesize (a superset, pruned
        # as it is scanned; added by _flush_all for every touched slot that has some), so
        # choosing the next segment never walks every open stream.
        self._waiting: dict[int, None] = {}
        # Slots whose ring, boundaries or head utterance may need work from _flush_all:
        # touched by every command and synthesis for them; kept while output waits for
        # ring space. _flush_all visits only these, not every stream.
        self._dirty: dict[int, None] = {}
        self._thread = threading.Thread(target=self._run, name="engine-scheduler", daemon=True)
        self._stopping = threading.Event()  # set by stop(), on the loop thread

    @property
    def stats(self) -> SchedulerStats:
        """A copy of the counters as they are now."""
        return self._counters.snapshot()

    # --- loop-thread API -------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()
        for pool in self._pools.values():
            pool.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        self._wakeup.set()
        for pool in self._pools.values():
            pool.stop()
        self._thread.join(timeout)
        for pool in self._pools.values():
            pool.join(timeout)
        if not self._thread.is_alive():
            for stream in self._streams.values():
                if stream.tap is not None:
                    stream.tap.close()
            self._streams.clear()

    def open_stream(
        self,
        *,
        slot: int,
        stream_id: int,
        owner: object,
        ring: SpscRing,
        boundaries: SpscRing,
        voice: RoutedVoice,
        sample_rate: int,
    ) -> None:
        stream = Stream(
            slot,
            stream_id,
            owner,
            ring,
            BoundaryWriter(boundaries),
            voice,
            self._lanes[id(voice.backend)],
            StreamingResampler(voice.sample_rate, sample_rate),
            bytes_per_second=2 * sample_rate,
            sample_rate=sample_rate,
        )
        if self._tap_directory:
            name = f"{time.time_ns()}-slot{slot}-stream{stream_id}-{sample_rate}hz.pcm"
            stream.tap = open(os.path.join(self._tap_directory, name), "wb")  # noqa: SIM115
        self._generations.bump(slot)
        self._commands.put(_Open(stream))

    def speak(
        self,
        slot: int,
        utterance: int,
        text: str,
        final: bool,
        release: bool = False,
        *,
        instruct: str | None = None,
    ) -> None:
        """Text for ``utterance``; ``instruct`` (with its first text) gives the utterance
        its own style instruction."""
        self._commands.put(_Speak(slot, utterance, text, final, release, instruct))

    def cancel(self, slot: int) -> None:
        self._generations.bump(slot)
        self._commands.put(_Cancel(slot, close=False))

    def cancel_utterance(self, slot: int, utterance: int) -> None:
        """Synthesize no more of ``utterance`` than the segment in progress; it then ends
        as usual. Its later text is ignored."""
        self._commands.put(_CancelUtterance(slot, utterance))

    def prepare_voice(
        self,
        *,
        request_id: int,
        owner: object,
        pcm16k: bytes,
        language: str | None,
        transcript: str | None = None,
    ) -> None:
        """Extract voice features on the coordinator thread (the backend's owner);
        answered with VoicePrepared or VoicePrepareFailed through ``on_event``."""
        self._commands.put(_Prepare(request_id, owner, pcm16k, language, transcript))

    def close_stream(self, slot: int) -> None:
        self._generations.bump(slot)
        self._commands.put(_Cancel(slot, close=True))

    # --- the coordinator thread ------------------------------------------------------

    def _run(self) -> None:
        """The coordinator thread. A bug here would leave every stream silent for good,
        so an exception is logged and handed to ``on_fatal`` (the engine exits and its
        supervisor starts a new one) instead of ending the thread quietly."""
        try:
            self._coordinate()
        except Exception as exc:
            log.critical("the scheduler failed", exc_info=True)
            if self._on_fatal is None:
                raise
            self._on_fatal(exc)

    def _coordinate(self) -> None:
        checked_at = 0.0
        while not self._stopping.is_set():
            # After a flush only streams waiting for ring space stay dirty.
            self._wakeup.wait(PENDING_POLL_S if self._dirty else IDLE_WAIT_S)
            self._take_inputs()
            while not self._stopping.is_set():
                now = time.monotonic()
                if now - checked_at > STATS_INTERVAL_S:  # O(streams): not per segment
                    checked_at = now
                    self._update_queue_stats()
                    self._expire_unstarted(now)
                self._flush_all()
                self._dispatch_batches()
                stream = self._policy.most_urgent(self._waiting_streams(), inline=True)
                if stream is None:
                    break
                utterance = stream.utterances[0]
                self._inline.run(stream, utterance, self._next_segment(stream))
                self._dirty[stream.slot] = None
                self._take_inputs()
            self._update_queue_stats()

    def _take_inputs(self) -> None:
        """Apply every command, then every worker result, that has come (commands first:
        a cancel is applied before the audio of the work it voids)."""
        for command in self._commands.drain():
            self._apply(command)
        for result in self._results.drain():
            self._take_result(result)

    def _next_segment(self, stream: Stream) -> Segment:
        """The single point where a segment leaves for synthesis, in any lane: the next
        segment of ``stream``'s head utterance, taken off it."""
        utterance = stream.utterances[0]
        text = utterance.segments.popleft()
        utterance.dispatched = True
        return Segment(text, stream.handle(), utterance.seq, utterance.native_s)

    def _expire_unstarted(self, now: float) -> None:
        """Fail with ``queue_timeout`` every new utterance that could have started (its
        stream is ready and has nothing playing) for ``start_timeout_s``; the clock starts
        when it is first seen startable, not when its text came (it may wait behind its
        own stream's earlier prompt)."""
        for stream in self._waiting_streams():
            if not (policy.ready(stream) and policy.is_new(stream)):
                continue
            head = stream.utterances[0]
            if head.dispatched:  # begun, though nothing of it is heard yet
                continue
            if head.startable_since is None:
                head.startable_since = now
            elif now - head.startable_since > self._start_timeout_s:
                waited = now - head.startable_since
                self._output.fail(
                    stream, head, "queue_timeout",
                    f"not started in {waited:.1f} s: the engine is saturated",
                )  # fmt: skip
                self._dirty[stream.slot] = None

    def _update_queue_stats(self) -> None:
        self._counters.queued(sum(len(s.utterances) for s in self._streams.values()))

    def _apply(self, command: _Command) -> None:
        if isinstance(command, _Prepare):
            self._prepare(command)
            return
        if isinstance(command, _CancelUtterance):
            self._cancel_utterance(command)
            self._dirty[command.slot] = None
            return
        if isinstance(command, _Open):
            stream = command.stream
            stream.generation = self._generations.current(stream.slot)
            previous = self._streams.get(stream.slot)
            if previous is not None:
                previous.lane.streams.pop(stream.slot, None)
            self._streams[stream.slot] = stream
            stream.lane.streams[stream.slot] = stream
        elif isinstance(command, _Speak):
            self._accept_text(command)
        else:
            self._drop_work(command)
        self._dirty[command.stream.slot if isinstance(command, _Open) else command.slot] = None
        self._counters.streams(len(self._streams))

    def _prepare(self, command: _Prepare) -> None:
        backend = self._backends.preparer
        version = backend.version if backend is not None else ""
        started = time.perf_counter()
        message: Message
        try:
            if not isinstance(backend, VoicePreparer):
                raise BackendError(
                    "voice_cloning_unsupported",
                    f"backend {self._backends.name} has no custom voices",
                )
            features = backend.prepare_voice(command.pcm16k, command.language, command.transcript)
            message = VoicePrepared(
                request_id=command.request_id,
                features=features,
                backend=backend.name,
                version=version,
                seconds=time.perf_counter() - started,
            )
        except BackendError as exc:
            message = VoicePrepareFailed(
                request_id=command.request_id, code=exc.code, message=exc.message
            )
        except Exception:
            log.exception("voice preparation failed")
            message = VoicePrepareFailed(
                request_id=command.request_id, code="engine_error", message="extraction failed"
            )
        self._on_event(command.owner, message)

    def _accept_text(self, command: _Speak) -> None:
        stream = self._streams.get(command.slot)
        if stream is None:
            return
        if command.utterance in stream.failed:
            return  # more text for an utterance that already failed
        utterance = stream.utterances[-1] if stream.utterances else None
        if utterance is None or utterance.seq != command.utterance or utterance.final:
            utterance = Utterance(
                command.utterance, SegmentSplitter(language=stream.voice.language)
            )
            stream.utterances.append(utterance)
            if command.instruct:
                settings = replace(stream.voice.settings, instruct=command.instruct)
                try:
                    utterance.handle = self._backends.resolve_voice(settings).handle
                except BackendError as exc:
                    self._output.fail(stream, utterance, exc.code, exc.message)
                    return
        utterance.chars += len(command.text)
        if utterance.chars > self._max_text_chars:
            self._output.fail(stream, utterance, "text_too_long", "utterance text over the limit")
            return
        utterance.segments.extend(utterance.splitter.feed(command.text))
        if command.final:
            utterance.segments.extend(utterance.splitter.flush())
            utterance.final = True
        elif command.release:
            utterance.segments.extend(utterance.splitter.release())

    def _cancel_utterance(self, command: _CancelUtterance) -> None:
        stream = self._streams.get(command.slot)
        if stream is None:
            return
        for utterance in stream.utterances:
            if utterance.seq == command.utterance:
                utterance.segments.clear()  # the one a worker may hold is its last
                utterance.splitter = SegmentSplitter(language=stream.voice.language)
                utterance.final = True
        stream.failed.append(command.utterance)  # its later text is ignored

    def _drop_work(self, command: _Cancel) -> None:
        stream = self._streams.get(command.slot)
        if stream is None:
            return
        stream.utterances.clear()
        stream.pending.clear()
        stream.pending_boundaries.clear()
        stream.failed.clear()
        stream.renew_resampler()
        stream.generation = self._generations.current(stream.slot)
        if command.close:
            del self._streams[stream.slot]
            stream.lane.streams.pop(stream.slot, None)
            if stream.tap is not None:
                stream.tap.close()
            self._on_event(stream.owner, StreamClosed(stream_id=stream.stream_id, slot=stream.slot))
        else:
            self._on_event(
                stream.owner,
                Cancelled(stream_id=stream.stream_id, write_pos=stream.ring.write_pos),
            )

    def _waiting_streams(self) -> list[Stream]:
        """Streams whose head utterance has segments to do (busy or backlogged ones too)."""
        found: list[Stream] = []
        for slot in list(self._waiting):
            stream = self._streams.get(slot)
            if stream is None or not stream.utterances or not stream.utterances[0].segments:
                del self._waiting[slot]
            else:
                found.append(stream)
        return found

    def _flush_all(self) -> None:
        """Output for every touched stream (see OutputWriter.flush); note the streams
        that have segments to do."""
        if not self._dirty:
            return
        dirty, self._dirty = self._dirty, {}
        for slot in dirty:
            stream = self._streams.get(slot)
            if stream is None:
                continue  # closed
            if self._output.flush(stream):
                self._dirty[slot] = None  # waiting for ring space: retry next pass
            if stream.utterances and stream.utterances[0].segments:
                self._waiting[slot] = None

    # --- worker lanes ------------------------------------------------------------------

    def _dispatch_batches(self) -> None:
        """Hand every idle worker a batch: the most urgent ready streams of one model."""
        for lane in self._lanes.values():
            batch = lane.batch
            if batch is None:
                continue
            while lane.in_flight < lane.threads:
                candidates = [
                    s for s in self._waiting_streams() if s.lane is lane and policy.ready(s)
                ]
                if not candidates:
                    break
                candidates.sort(key=self._policy.urgency)
                chosen = self._policy.choose(lane, batch, candidates, time.monotonic())
                if not chosen:
                    break  # only new utterances that do not fit yet
                jobs = []
                for stream in chosen:
                    segment = self._next_segment(stream)
                    jobs.append(
                        Job(
                            stream.slot,
                            stream.generation,
                            segment.utterance,
                            segment.text,
                            segment.voice,
                            stream.resampler,
                            segment.offset_s,
                            stream,
                        )
                    )
                lane.in_flight += 1
                work = Batch(lane, tuple(jobs))
                lane.running[id(work)] = max(s.busy_until for s in chosen)
                self._pools[id(lane)].submit(work)

    def _take_result(self, result: Result) -> None:
        if isinstance(result, Audio):
            self._take_audio(result)
        elif isinstance(result, Words):
            self._take_words(result)
        else:
            self._batch_done(result)

    def _current(self, job: Job) -> tuple[Stream, Utterance] | None:
        """The stream and utterance ``job`` still belongs to (None: cancelled, closed, or
        its utterance failed meanwhile)."""
        stream = self._streams.get(job.slot)
        if stream is None or stream.generation != job.generation or not stream.utterances:
            return None
        utterance = stream.utterances[0]
        return (stream, utterance) if utterance.seq == job.utterance else None

    def _take_audio(self, audio: Audio) -> None:
        current = self._current(audio.job)
        if current is not None:
            stream, utterance = current
            utterance.native_s += audio.native_samples / stream.voice.sample_rate
            self._output.write(stream, utterance, audio.pcm)
            self._dirty[stream.slot] = None

    def _take_words(self, timed: Words) -> None:
        current = self._current(timed.job)
        if current is not None:
            self._timed_jobs.add(timed.job)
            self._output.words(current[0], current[1], timed.job.offset_s, timed.words, "engine")

    def _batch_done(self, done: BatchDone) -> None:
        lane = done.batch.lane
        lane.in_flight -= 1
        lane.running.pop(id(done.batch), None)
        if done.error is None:  # a padded batch takes as long as its longest segment
            policy.observe_pace(lane, done.seconds, max(len(job.text) for job in done.batch.jobs))
        self._counters.synthesized(len(done.batch.jobs), done.seconds)
        for job in done.batch.jobs:
            stream = self._streams.get(job.slot)
            # The worker no longer holds any of this stream's work, whether or not it was
            # cancelled meanwhile (a backend that streams a segment out over several emits
            # is still running when a cancel arrives).
            if stream is not None and stream is job.stream:
                stream.busy = False
                self._dirty[stream.slot] = None
            current = self._current(job)
            if current is not None and done.error is not None:
                self._output.fail(current[0], current[1], *done.error)
            elif current is not None:
                stream, utterance = current
                span = utterance.native_s - job.offset_s
                policy.observe_audio(stream.lane, stream, span, len(job.text))
                if job not in self._timed_jobs:
                    self._output.words(
                        stream, utterance, job.offset_s, estimate_words(job.text, span)
                    )
            self._timed_jobs.discard(job)
