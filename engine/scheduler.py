"""The engine's scheduler: one coordinator thread owns every stream, lanes do the work.

The coordinator owns the streams' state (utterances, rings, boundaries, pending audio):
it is the rings' only writer. Each backend has a **lane**:

- a per-segment backend (espeak-ng: not thread-safe, streams audio out as it goes) runs
  in the coordinator itself, one segment at a time, its audio written as it comes;
- a :class:`~engine.backends.base.BatchSynthesizer` (Piper) runs on ``threads`` worker
  threads: the coordinator forms batches of up to ``max_batch`` segments of different
  streams (one model: the backend's ``batch_key``), a free worker runs one, and the audio
  comes back to the coordinator as commands, resampled by the worker.

A stream has at most one segment in flight, so its audio stays in order.

Order: work is done one text segment at a time (a clause or a sentence, at most
:attr:`engine.text.SegmentSplitter.max_segment_chars` characters), in three tiers
(:meth:`Scheduler._urgency`):

1. streams that are playing and hold less unplayed audio than a reserve (three times
   what their next segment is expected to take, from the lane's recent pace, plus
   0.2 s), the least slack first: audio a caller is already hearing must not stop;
2. new utterances (nothing of them produced, nothing playing), oldest first: first audio;
3. streams that are comfortably ahead, the least slack first.

A batch is the most urgent streams of one model. When the engine has spare capacity the
order changes nothing (every tier is served at once); when it is saturated, calls that
are speaking keep speaking and new utterances wait, so the excess shows up as first-audio
latency, which the gateway's admission control sees and acts on (queueing, then
``queue_timeout``), instead of as stutter spread over every call. One long text cannot
starve short prompts, and each utterance's first segment is a short clause.

Capacity: in a lane whose calls are independent (``independent_calls``: Piper), a new
utterance starts only when the lane's measured pace says it fits without any call in
progress (or itself) running out of audio (engine/capacity.py), and a playing stream's
next segment that would come too late at that pace is cut into a piece that fits
(:func:`engine.text.split_to_fit`).

Start deadline: a new utterance that could start (its stream has nothing else playing or
to do first) but has waited ``start_timeout_s`` (``ENGINE_START_TIMEOUT_MS``, 10 s) for
the engine fails with ``queue_timeout``: on an engine saturated for that long, the IVR
gets an error it can act on (a recorded fallback, a transfer) rather than a prompt that
starts any time later. The gateway's own queue (``GATEWAY_QUEUE_TIMEOUT_MS``) refuses
sooner; this bounds what the engine has already accepted.

Back-pressure: audio goes into the stream's outbound ring. When the ring is full the
rest of the segment waits in the stream's ``pending`` buffer, and the stream gets no new
turn until ``pending`` has drained: a full ring never overwrites unread audio.

Debugging: with ``ENGINE_PCM_TAP_DIR`` set, every stream's PCM (exactly the bytes put
into its ring, cancelled audio included) is also written to a file there, to hear what a
caller heard.

Thread contract: the public methods (``open_stream``, ``speak``, ``cancel``,
``close_stream``, ``stop``) are called from the server's event-loop thread and only
enqueue commands; everything else runs on the coordinator thread, but for the lanes'
worker threads, which only synthesize, resample and enqueue. Events go out through the
``on_event`` callback, called on the coordinator thread.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import BinaryIO

from engine.backends.base import (
    Backend,
    BackendError,
    BatchSynthesizer,
    PcmChunk,
    SynthesisJob,
    VoicePreparer,
    WordTimer,
    WordTiming,
    estimate_words,
)
from engine.backends.routing import BackendSet, RoutedVoice
from engine.capacity import COST_FACTOR, MARGIN_S, Pace, StreamWork, can_start
from engine.ipc.boundaries import BoundaryWriter
from engine.ipc.ring import SpscRing
from engine.ipc.schema import (
    Cancelled,
    Message,
    StreamClosed,
    UtteranceAudio,
    UtteranceEnd,
    UtteranceFailed,
    UtteranceWords,
    VoicePrepared,
    VoicePrepareFailed,
    WordTime,
)
from engine.text import MIN_FIT_CHARS, SegmentSplitter, split_to_fit
from telephony.codecs.resample import StreamingResampler

MAX_WORD_CHARS = 64  # a "word" longer than this (a URL read out) is cut in the event

log = logging.getLogger(__name__)

# Events are routed by the server: (owner token, message).
EventSink = Callable[[object, Message], None]
STATS_INTERVAL_S = 0.1
PENDING_POLL_S = 0.004
IDLE_WAIT_S = 0.5
# A playing stream goes before new utterances while it holds less unplayed audio than
# RESERVE_FACTOR times what its next segment is expected to take to synthesize (the
# lane's recent wall seconds per character), plus RESERVE_FLOOR_S.
RESERVE_FACTOR = 3.0
RESERVE_FLOOR_S = 0.2
PACE_SMOOTHING = 0.2  # weight of the newest batch in a lane's seconds per character
# Seconds of audio per character of text before a lane has measured its own (English
# speech is about 14 characters a second).
AUDIO_PER_CHAR_PRIOR = 0.07
START_TIMEOUT_S = 10.0  # a new utterance that can start but is not started fails then


def _smoothed(old: float, value: float) -> float:
    """A recent average: ``value`` weighted PACE_SMOOTHING against ``old`` (0: none yet)."""
    return value if old == 0.0 else old + PACE_SMOOTHING * (value - old)


@dataclass
class _Utterance:
    seq: int
    splitter: SegmentSplitter = field(default_factory=SegmentSplitter)
    arrived_at: float = field(default_factory=time.monotonic)
    segments: deque[str] = field(default_factory=deque)
    final: bool = False
    chars: int = 0
    start_pos: int | None = None
    announced: bool = False
    samples: int = 0
    tail_flushed: bool = False
    native_s: float = 0.0  # seconds of the backend's audio so far (word times count from 0)
    handle: object = None  # its own voice handle (a style instruction), else the stream's
    startable_since: float | None = None  # first seen able to start (the start deadline)
    dispatched: bool = False  # a segment of it went to synthesis: the deadline is over


@dataclass
class _Lane:
    """Where one backend's segments run (see the module docstring)."""

    backend: Backend
    batch: BatchSynthesizer | None  # None: in the coordinator, one segment at a time
    threads: int = 0
    max_batch: int = 1
    in_flight: int = 0  # batches handed to the workers and not yet done
    # Recent wall time of a call per character of its longest segment (the padded length).
    seconds_per_char: float = 0.0
    audio_per_char: float = 0.0  # recent seconds of audio per character of text
    # New utterances start only when they fit (engine/capacity.py): set for backends
    # whose calls are independent (``independent_calls``).
    gated: bool = False
    running: dict[int, float] = field(default_factory=dict)  # id(batch) -> expected end
    streams: dict[int, _Stream] = field(default_factory=dict)  # slot -> its open stream
    jobs: queue.SimpleQueue[_Batch | None] = field(default_factory=queue.SimpleQueue)
    workers: list[threading.Thread] = field(default_factory=list)


@dataclass
class _Stream:
    slot: int
    stream_id: int
    owner: object
    ring: SpscRing
    boundaries: BoundaryWriter
    voice: RoutedVoice
    lane: _Lane
    resampler: StreamingResampler
    bytes_per_second: int
    sample_rate: int
    busy: bool = False  # a segment of it is with a lane's worker
    busy_until: float = 0.0  # when that segment is expected done (monotonic)
    busy_audio_s: float = 0.0  # and the audio it is expected to give
    audio_per_char: float = 0.0  # this stream's recent seconds of audio per character
    utterances: deque[_Utterance] = field(default_factory=deque)
    pending: bytearray = field(default_factory=bytearray)
    # Utterance ends not yet in the boundaries ring (it was full): block later audio.
    pending_boundaries: deque[tuple[int, int]] = field(default_factory=deque)
    # Bumped (from the loop thread) on cancel/close so in-flight synthesis stops at once.
    generation: int = 0
    tap: BinaryIO | None = None  # debug copy of everything written (ENGINE_PCM_TAP_DIR)
    # Recently failed utterances: later pieces of their text are ignored.
    failed: deque[int] = field(default_factory=lambda: deque(maxlen=64))


@dataclass(frozen=True)
class _Open:
    stream: _Stream


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


@dataclass(frozen=True)
class _Job:
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
    stream: object = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class _Batch:
    lane: _Lane
    jobs: tuple[_Job, ...]


@dataclass(frozen=True)
class _Audio:
    """A worker's output for one job, resampled to the stream's rate."""

    job: _Job
    pcm: bytes
    native_samples: int = 0


@dataclass(frozen=True)
class _Words:
    """A batch backend's words for one job, timed against the job's audio."""

    job: _Job
    words: tuple[WordTiming, ...]


@dataclass(frozen=True)
class _BatchDone:
    batch: _Batch
    error: tuple[str, str] | None  # (code, message) for every job of the batch
    seconds: float


_Command = (
    _Open | _Speak | _Cancel | _CancelUtterance | _Prepare | _Audio | _Words | _BatchDone | None
)


@dataclass
class SchedulerStats:
    active_streams: int = 0
    queued_utterances: int = 0
    segments: int = 0
    audio_samples: int = 0
    synth_seconds: float = 0.0


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
        self._cost_factor = cost_factor
        self._margin_s = margin_s
        self._reserve_factor = reserve_factor
        self._reserve_floor_s = reserve_floor_s
        self._backends = backends
        self._lanes: dict[int, _Lane] = {}
        for backend in backends.members:
            if isinstance(backend, BatchSynthesizer):
                lane = _Lane(backend, backend, max(1, backend.threads), max(1, backend.max_batch))
                lane.gated = bool(getattr(backend, "independent_calls", False))
            else:
                lane = _Lane(backend, None)
            self._lanes[id(backend)] = lane
        self._on_event = on_event
        self._timed_jobs: set[_Job] = set()  # jobs whose words the backend timed
        self._max_text_chars = max_text_chars
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._streams: dict[int, _Stream] = {}
        # Slots whose head utterance may have segments to synthesize (a superset, pruned
        # as it is scanned; added by _flush_all for every touched slot that has some), so
        # choosing the next segment never walks every open stream.
        self._waiting: dict[int, None] = {}
        # Slots whose ring, boundaries or head utterance may need work from _flush_all:
        # touched by every command and synthesis for them; kept while output waits for
        # ring space. _flush_all visits only these, not every stream.
        self._dirty: dict[int, None] = {}
        # slot -> generation, written by the loop thread: bumped on open, cancel and close,
        # so work begun for a slot's earlier stream or earlier utterances is recognized.
        self._generations: dict[int, int] = {}
        self._thread = threading.Thread(target=self._run, name="engine-scheduler", daemon=True)
        self._stopping = False
        self.stats = SchedulerStats()

    # --- loop-thread API -------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()
        for lane in self._lanes.values():
            for index in range(lane.threads if lane.batch is not None else 0):
                worker = threading.Thread(
                    target=self._work,
                    args=(lane,),
                    name=f"engine-{lane.backend.name}-{index}",
                    daemon=True,
                )
                lane.workers.append(worker)
                worker.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping = True
        self._commands.put(None)
        for lane in self._lanes.values():
            for _ in lane.workers:
                lane.jobs.put(None)
        self._thread.join(timeout)
        for lane in self._lanes.values():
            for worker in lane.workers:
                worker.join(timeout)
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
        stream = _Stream(
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
        self._generations[slot] = self._generations.get(slot, 0) + 1
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
        self._generations[slot] = self._generations.get(slot, 0) + 1
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
        """Extract voice features on the worker thread (the backend's owner); answered
        with VoicePrepared or VoicePrepareFailed through ``on_event``."""
        self._commands.put(_Prepare(request_id, owner, pcm16k, language, transcript))

    def close_stream(self, slot: int) -> None:
        self._generations[slot] = self._generations.get(slot, 0) + 1
        self._commands.put(_Cancel(slot, close=True))

    # --- worker thread -----------------------------------------------------------------

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
        while not self._stopping:
            # After a flush only streams waiting for ring space stay dirty.
            self._take_commands(PENDING_POLL_S if self._dirty else IDLE_WAIT_S, block=True)
            while True:
                now = time.monotonic()
                if now - checked_at > STATS_INTERVAL_S:  # O(streams): not per segment
                    checked_at = now
                    self._update_queue_stats()
                    self._expire_unstarted(now)
                self._flush_all()
                self._dispatch_batches()
                stream = self._next_ready(inline=True)
                if stream is None:
                    break
                self._synthesize_next(stream)
                self._take_commands(0, block=False)
                if self._stopping:
                    return
            self._update_queue_stats()

    def _expire_unstarted(self, now: float) -> None:
        """Fail with ``queue_timeout`` every new utterance that could have started (its
        stream is ready and has nothing playing) for ``start_timeout_s``; the clock starts
        when it is first seen startable, not when its text came (it may wait behind its
        own stream's earlier prompt)."""
        for stream in self._waiting_streams():
            if not (self._ready(stream) and self._is_new(stream)):
                continue
            head = stream.utterances[0]
            if head.dispatched:  # begun, though nothing of it is heard yet
                continue
            if head.startable_since is None:
                head.startable_since = now
            elif now - head.startable_since > self._start_timeout_s:
                waited = now - head.startable_since
                self._fail(
                    stream, head, "queue_timeout",
                    f"not started in {waited:.1f} s: the engine is saturated",
                )  # fmt: skip
                self._dirty[stream.slot] = None

    def _update_queue_stats(self) -> None:
        self.stats.queued_utterances = sum(len(s.utterances) for s in self._streams.values())

    def _take_commands(self, timeout: float, *, block: bool) -> None:
        try:
            command = self._commands.get(block=block, timeout=timeout if block else None)
        except queue.Empty:
            return
        while True:
            if command is None:
                return
            self._apply(command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _apply(
        self,
        command: (
            _Open | _Speak | _Cancel | _CancelUtterance | _Prepare | _Audio | _Words | _BatchDone
        ),
    ) -> None:
        if isinstance(command, _Prepare):
            self._prepare(command)
            return
        if isinstance(command, _Audio):
            self._take_audio(command)
            return
        if isinstance(command, _Words):
            self._take_words(command)
            return
        if isinstance(command, _CancelUtterance):
            self._cancel_utterance(command)
            self._dirty[command.slot] = None
            return
        if isinstance(command, _BatchDone):
            self._batch_done(command)
            return
        if isinstance(command, _Open):
            stream = command.stream
            stream.generation = self._generations.get(stream.slot, 0)
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
        self.stats.active_streams = len(self._streams)

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
            utterance = _Utterance(
                command.utterance, SegmentSplitter(language=stream.voice.language)
            )
            stream.utterances.append(utterance)
            if command.instruct:
                settings = replace(stream.voice.settings, instruct=command.instruct)
                try:
                    utterance.handle = self._backends.resolve_voice(settings).handle
                except BackendError as exc:
                    self._fail(stream, utterance, exc.code, exc.message)
                    return
        utterance.chars += len(command.text)
        if utterance.chars > self._max_text_chars:
            self._fail(stream, utterance, "text_too_long", "utterance text over the limit")
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
        self._renew_resampler(stream)
        stream.generation = self._generations.get(stream.slot, 0)
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

    @staticmethod
    def _ready(stream: _Stream) -> bool:
        """Has a segment to do, and room for its audio (no backlog), and none in flight."""
        return not (
            stream.busy
            or stream.pending
            or stream.pending_boundaries
            or not stream.utterances
            or not stream.utterances[0].segments
        )

    def _urgency(self, stream: _Stream) -> tuple[int, float]:
        """Sort key of a ready stream, most urgent first (see the module docstring): a
        playing stream's slack is its unplayed audio less the expected synthesis time of
        its next segment."""
        head = stream.utterances[0]
        buffered = stream.ring.readable_bytes() / stream.bytes_per_second
        if self._is_new(stream):
            return (1, head.arrived_at)  # a new utterance, nothing playing
        expected = stream.lane.seconds_per_char * len(head.segments[0])
        slack = buffered - expected
        at_risk = buffered < self._reserve_factor * expected + self._reserve_floor_s
        return (0 if at_risk else 2, slack)

    @staticmethod
    def _is_new(stream: _Stream) -> bool:
        """Its head utterance has not begun and nothing of the stream is playing."""
        head = stream.utterances[0]
        return (
            head.start_pos is None
            and not stream.busy
            and not stream.pending
            and stream.ring.readable_bytes() == 0
        )

    def _can_start(self, lane: _Lane, stream: _Stream, forming: list[_Stream]) -> bool:
        """Whether the new utterance of ``stream`` fits in ``lane`` now
        (engine/capacity.py); ``forming`` are the streams of the batch being formed."""
        committed = [
            s
            for s in lane.streams.values()
            if s is not stream
            and (s.busy or (s.utterances and s.utterances[0].segments and not self._is_new(s)))
        ]
        if lane.seconds_per_char == 0.0:  # no pace yet: one new utterance per worker
            return sum(s.busy for s in committed) < lane.threads
        now = time.monotonic()
        ends = list(lane.running.values())
        if forming:
            ends.append(max(s.busy_until for s in forming))
        workers = [max(0.0, end - now) for end in ends]
        workers += [0.0] * (lane.threads - len(workers))
        return can_start(
            StreamWork(self._segment_chars(stream)),
            [self._remaining_work(s, now) for s in committed],
            workers_free_in=workers,
            pace=Pace(lane.seconds_per_char, lane.audio_per_char or AUDIO_PER_CHAR_PRIOR),
            cost_factor=self._cost_factor,
            margin_s=self._margin_s,
            min_piece_chars=MIN_FIT_CHARS,
        )

    @staticmethod
    def _unplayed_s(stream: _Stream) -> float:
        """Seconds of the stream's audio produced and not yet heard (ring and backlog)."""
        return (stream.ring.readable_bytes() + len(stream.pending)) / stream.bytes_per_second

    @staticmethod
    def _segment_chars(stream: _Stream) -> tuple[int, ...]:
        return tuple(len(segment) for u in stream.utterances for segment in u.segments)

    def _remaining_work(self, stream: _Stream, now: float) -> StreamWork:
        """What ``stream`` still needs from its lane (engine/capacity.py)."""
        return StreamWork(
            self._segment_chars(stream),
            unplayed_s=self._unplayed_s(stream),
            heard=bool(stream.utterances) and stream.utterances[0].start_pos is not None,
            in_flight_s=max(0.0, stream.busy_until - now) if stream.busy else None,
            in_flight_audio_s=stream.busy_audio_s,
            audio_per_char=stream.audio_per_char or None,
        )

    @staticmethod
    def _observe_audio(lane: _Lane, stream: _Stream, seconds: float, chars: int) -> None:
        if chars > 0 and seconds > 0.0:
            rate = seconds / chars
            lane.audio_per_char = _smoothed(lane.audio_per_char, rate)
            stream.audio_per_char = _smoothed(stream.audio_per_char, rate)

    @staticmethod
    def _observe_pace(lane: _Lane, seconds: float, chars: int) -> None:
        if chars > 0:
            lane.seconds_per_char = _smoothed(lane.seconds_per_char, seconds / chars)

    def _waiting_streams(self) -> list[_Stream]:
        """Streams whose head utterance has segments to do (busy or backlogged ones too)."""
        found: list[_Stream] = []
        for slot in list(self._waiting):
            stream = self._streams.get(slot)
            if stream is None or not stream.utterances or not stream.utterances[0].segments:
                del self._waiting[slot]
            else:
                found.append(stream)
        return found

    def _next_ready(self, *, inline: bool) -> _Stream | None:
        """The most urgent stream (:meth:`_urgency`) with a segment to do in an inline
        lane (``inline``) or in a worker lane. Streams with a backlog (``pending``) are
        skipped: their ring is full."""
        best: _Stream | None = None
        best_key = (0, 0.0)  # (tier, slack or arrival)
        for stream in self._waiting_streams():
            if (stream.lane.batch is None) != inline or not self._ready(stream):
                continue
            key = self._urgency(stream)
            if best is None or key < best_key:
                best, best_key = stream, key
        return best

    # --- worker lanes ------------------------------------------------------------------

    def _dispatch_batches(self) -> None:
        """Hand every idle worker a batch: the most urgent ready streams of one model."""
        for lane in self._lanes.values():
            batch = lane.batch
            if batch is None:
                continue
            while lane.in_flight < lane.threads:
                candidates = [
                    s for s in self._waiting_streams() if s.lane is lane and self._ready(s)
                ]
                if not candidates:
                    break
                candidates.sort(key=self._urgency)
                chosen = self._choose(lane, batch, candidates)
                if not chosen:
                    break  # only new utterances that do not fit yet
                jobs = []
                for stream in chosen:
                    utterance = stream.utterances[0]
                    utterance.dispatched = True
                    jobs.append(
                        _Job(
                            stream.slot,
                            stream.generation,
                            utterance.seq,
                            utterance.segments.popleft(),
                            self._handle(stream),
                            stream.resampler,
                            utterance.native_s,
                            stream,
                        )
                    )
                lane.in_flight += 1
                work = _Batch(lane, tuple(jobs))
                lane.running[id(work)] = max(s.busy_until for s in chosen)
                lane.jobs.put(work)

    def _choose(
        self, lane: _Lane, batch: BatchSynthesizer, candidates: list[_Stream]
    ) -> list[_Stream]:
        """The next batch: the most urgent ready streams of one model, up to
        ``max_batch``, each marked busy. In a gated lane new utterances start in order of
        arrival and only while they fit (:meth:`_can_start`)."""
        chosen: list[_Stream] = []
        key: object = None
        may_start = True
        for stream in candidates:
            if len(chosen) == lane.max_batch:
                break
            stream_key = batch.batch_key(self._handle(stream))
            if chosen and stream_key != key:
                continue
            if lane.gated and self._is_new(stream):
                may_start = may_start and self._can_start(lane, stream, chosen)
                if not may_start:
                    continue
            elif lane.gated:
                self._fit_next_segment(lane, stream)
            key = stream_key
            self._mark_busy(lane, stream)
            chosen.append(stream)
        return chosen

    def _fit_next_segment(self, lane: _Lane, stream: _Stream) -> None:
        """Cut the next segment of a playing stream when, at the lane's pace, it would not
        be ready before the stream's unplayed audio runs out: its first piece goes now, the
        rest next (a slow or loaded machine would otherwise stutter at a long segment that
        follows a short opening)."""
        head = stream.utterances[0]
        if lane.seconds_per_char == 0.0 or head.start_pos is None:
            return
        char_cost = lane.seconds_per_char * self._cost_factor
        budget = (self._unplayed_s(stream) - self._margin_s) / char_cost
        if len(head.segments[0]) > budget:
            pieces = split_to_fit(head.segments[0], int(budget))
            if len(pieces) > 1:
                head.segments.popleft()
                head.segments.extendleft(reversed(pieces))

    def _mark_busy(self, lane: _Lane, stream: _Stream) -> None:
        chars = len(stream.utterances[0].segments[0])
        rate = stream.audio_per_char or lane.audio_per_char or AUDIO_PER_CHAR_PRIOR
        stream.busy = True
        # expected done, with the replay's safety on its cost (engine/capacity.py)
        stream.busy_until = time.monotonic() + lane.seconds_per_char * chars * self._cost_factor
        stream.busy_audio_s = rate * chars

    def _work(self, lane: _Lane) -> None:
        """A lane's worker thread: run batches, send the audio back as commands."""
        assert lane.batch is not None
        while True:
            batch = lane.jobs.get()
            if batch is None:
                return
            jobs = batch.jobs

            def emit(index: int, chunk: PcmChunk, jobs: tuple[_Job, ...] = jobs) -> bool:
                job = jobs[index]
                if self._generations.get(job.slot) != job.generation:
                    return False  # cancelled, or closed, while synthesizing
                pcm = job.resampler.process(chunk.tobytes())
                if pcm or len(chunk):
                    self._commands.put(_Audio(job, pcm, len(chunk)))
                return True

            def timed(
                index: int, words: Sequence[WordTiming], jobs: tuple[_Job, ...] = jobs
            ) -> None:
                self._commands.put(_Words(jobs[index], tuple(words)))

            started = time.perf_counter()
            error: tuple[str, str] | None = None
            segments = [SynthesisJob(j.text, j.voice, j.offset_s == 0.0) for j in jobs]
            try:
                if getattr(lane.batch, "times_words", False):
                    lane.batch.synthesize_batch(segments, emit, timed)  # type: ignore[call-arg]
                else:
                    lane.batch.synthesize_batch(segments, emit)
            except BackendError as exc:
                error = (exc.code, exc.message)
            except Exception:
                log.exception("backend %s failed on a batch of %d", lane.backend.name, len(jobs))
                error = ("engine_error", "synthesis failed")
            self._commands.put(_BatchDone(batch, error, time.perf_counter() - started))

    @staticmethod
    def _handle(stream: _Stream) -> object:
        """The voice handle of the stream's head utterance (its own, with a style
        instruction) or the stream's."""
        head = stream.utterances[0] if stream.utterances else None
        return head.handle if head is not None and head.handle is not None else stream.voice.handle

    def _current(self, job: _Job) -> tuple[_Stream, _Utterance] | None:
        """The stream and utterance ``job`` still belongs to (None: cancelled, closed, or
        its utterance failed meanwhile)."""
        stream = self._streams.get(job.slot)
        if stream is None or stream.generation != job.generation or not stream.utterances:
            return None
        utterance = stream.utterances[0]
        return (stream, utterance) if utterance.seq == job.utterance else None

    def _take_audio(self, audio: _Audio) -> None:
        current = self._current(audio.job)
        if current is not None:
            stream, utterance = current
            utterance.native_s += audio.native_samples / stream.voice.sample_rate
            self._output(stream, utterance, audio.pcm)
            self._dirty[stream.slot] = None

    def _take_words(self, timed: _Words) -> None:
        current = self._current(timed.job)
        if current is not None:
            self._timed_jobs.add(timed.job)
            self._words(current[0], current[1], timed.job.offset_s, timed.words, "engine")

    def _batch_done(self, done: _BatchDone) -> None:
        done.batch.lane.in_flight -= 1
        done.batch.lane.running.pop(id(done.batch), None)
        if done.error is None:  # a padded batch takes as long as its longest segment
            self._observe_pace(
                done.batch.lane, done.seconds, max(len(job.text) for job in done.batch.jobs)
            )
        self.stats.segments += len(done.batch.jobs)
        self.stats.synth_seconds += done.seconds
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
                self._fail(current[0], current[1], *done.error)
            elif current is not None:
                stream, utterance = current
                span = utterance.native_s - job.offset_s
                self._observe_audio(stream.lane, stream, span, len(job.text))
                if job not in self._timed_jobs:
                    self._words(stream, utterance, job.offset_s, estimate_words(job.text, span))
            self._timed_jobs.discard(job)

    def _renew_resampler(self, stream: _Stream) -> None:
        """A fresh resampler (a worker may still hold the old one for work now void)."""
        stream.resampler = StreamingResampler(stream.voice.sample_rate, stream.sample_rate)

    def _synthesize_next(self, stream: _Stream) -> None:
        utterance = stream.utterances[0]
        segment = utterance.segments.popleft()
        utterance.dispatched = True
        generation = stream.generation
        offset_s = utterance.native_s
        rate = stream.voice.sample_rate

        def emit(chunk: PcmChunk) -> bool:
            if self._generations.get(stream.slot) != generation:
                return False  # cancelled or closed while synthesizing
            utterance.native_s += len(chunk) / rate
            self._output(stream, utterance, stream.resampler.process(chunk.tobytes()))
            return True

        started = time.perf_counter()
        try:
            stream.voice.backend.synthesize(segment, self._handle(stream), emit)
        except BackendError as exc:
            self._fail(stream, utterance, exc.code, exc.message)
        except Exception:
            log.exception("backend failed on stream %s", stream.stream_id)
            self._fail(stream, utterance, "engine_error", "synthesis failed")
        else:  # as for a worker lane's batch, a failed call says nothing of the pace
            self._observe_pace(stream.lane, time.perf_counter() - started, len(segment))
            backend = stream.voice.backend
            if self._generations.get(stream.slot) != generation:
                pass  # cancelled or closed meanwhile: nobody wants its words
            elif isinstance(backend, WordTimer):
                self._words(stream, utterance, offset_s, backend.last_words(), "engine")
            else:
                span = utterance.native_s - offset_s
                self._words(stream, utterance, offset_s, estimate_words(segment, span))
        finally:
            self._dirty[stream.slot] = None
            self.stats.segments += 1
            self.stats.synth_seconds += time.perf_counter() - started

    def _words(
        self,
        stream: _Stream,
        utterance: _Utterance,
        offset_s: float,
        words: Sequence[WordTiming],
        source: str = "estimate",
    ) -> None:
        """Tell the stream's owner the words of the segment that started at ``offset_s``
        of the utterance's audio."""
        if not words:
            return
        self._on_event(
            stream.owner,
            UtteranceWords(
                stream_id=stream.stream_id,
                utterance=utterance.seq,
                words=tuple(
                    WordTime(
                        w.text[:MAX_WORD_CHARS],
                        round((offset_s + w.start_s) * 1000),
                        round((offset_s + w.end_s) * 1000),
                    )
                    for w in words
                ),
                source=source,
            ),
        )

    def _output(self, stream: _Stream, utterance: _Utterance, pcm: bytes) -> None:
        if not pcm:
            return
        if utterance.start_pos is None:
            utterance.start_pos = stream.ring.write_pos + len(stream.pending)
        utterance.samples += len(pcm) // 2
        self.stats.audio_samples += len(pcm) // 2
        if stream.pending:
            stream.pending += pcm
        else:
            written = self._to_ring(stream, pcm)
            if written < len(pcm):
                stream.pending += pcm[written:]
        self._announce(stream, utterance)

    @staticmethod
    def _to_ring(stream: _Stream, data: bytes | bytearray) -> int:
        written = stream.ring.write(data)
        if stream.tap is not None and written:
            stream.tap.write(data[:written])
        return written

    def _announce(self, stream: _Stream, utterance: _Utterance) -> None:
        if (
            not utterance.announced
            and utterance.start_pos is not None
            and stream.ring.write_pos > utterance.start_pos
        ):
            utterance.announced = True
            self._on_event(
                stream.owner,
                UtteranceAudio(
                    stream_id=stream.stream_id,
                    utterance=utterance.seq,
                    start_pos=utterance.start_pos,
                ),
            )

    def _flush_all(self) -> None:
        if not self._dirty:
            return
        dirty, self._dirty = self._dirty, {}
        for slot in dirty:
            stream = self._streams.get(slot)
            if stream is None:
                continue  # closed
            while stream.pending_boundaries and stream.boundaries.append(
                *stream.pending_boundaries[0]
            ):
                stream.pending_boundaries.popleft()
            if stream.pending:
                written = self._to_ring(stream, stream.pending)
                if written:
                    del stream.pending[:written]
            # Several utterances may finish in one pass (empty ones queued behind).
            while stream.utterances:
                utterance = stream.utterances[0]
                self._announce(stream, utterance)
                if not self._maybe_finish(stream, utterance):
                    break
            if stream.pending or stream.pending_boundaries:
                self._dirty[slot] = None  # waiting for ring space: retry next pass
            if stream.utterances and stream.utterances[0].segments:
                self._waiting[slot] = None

    def _maybe_finish(self, stream: _Stream, utterance: _Utterance) -> bool:
        """End the head ``utterance`` if all of it is in the ring; True if it ended."""
        if not utterance.final or utterance.segments or stream.busy:
            return False
        if not utterance.tail_flushed:
            utterance.tail_flushed = True
            self._output(stream, utterance, stream.resampler.flush())
        if stream.pending:
            return False
        self._announce(stream, utterance)
        end = stream.ring.write_pos
        start = utterance.start_pos if utterance.start_pos is not None else end
        if end > start:
            self._publish_boundary(stream, utterance.seq, end)
        stream.utterances.popleft()  # the resampler was cleared by its flush() above
        self._on_event(
            stream.owner,
            UtteranceEnd(
                stream_id=stream.stream_id,
                utterance=utterance.seq,
                start_pos=start,
                end_pos=end,
                samples=utterance.samples,
            ),
        )
        return True

    def _publish_boundary(self, stream: _Stream, seq: int, end_pos: int) -> None:
        """Record where ``seq`` ends before any later audio enters the ring."""
        if stream.pending_boundaries or not stream.boundaries.append(seq, end_pos):
            stream.pending_boundaries.append((seq, end_pos))

    def _fail(self, stream: _Stream, utterance: _Utterance, code: str, message: str) -> None:
        """Drop ``utterance``. Audio of it already in the ring ends at ``end_pos``."""
        end_pos: int | None = None
        if stream.utterances and stream.utterances[0] is utterance:
            stream.pending.clear()  # only the head utterance has output in flight
            self._renew_resampler(stream)
            if utterance.announced:
                end_pos = stream.ring.write_pos
                self._publish_boundary(stream, utterance.seq, end_pos)
        if utterance in stream.utterances:
            stream.utterances.remove(utterance)
        stream.failed.append(utterance.seq)
        self._on_event(
            stream.owner,
            UtteranceFailed(
                stream_id=stream.stream_id,
                utterance=utterance.seq,
                code=code,
                message=message,
                start_pos=utterance.start_pos if utterance.announced else None,
                end_pos=end_pos,
            ),
        )
