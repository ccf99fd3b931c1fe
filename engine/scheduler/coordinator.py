"""The coordinator: one thread that owns every stream, takes the server's commands and
the workers' results, applies the policy (engine/scheduler/policy.py) and hands segments
to the lanes (engine/scheduler/lanes.py); the output writer (engine/scheduler/output.py)
puts their audio into the rings. See engine/scheduler/__init__.py for the rules.

Thread contract: the public methods (``open_stream``, ``speak``, ``cancel``,
``close_stream``, ``warm_prompt``, ``stop``) are called from the server's event-loop
thread; they bump the slot's generation (locked) and put a command on the command
channel. Everything else runs on the coordinator thread, but for the lanes' workers, which
only synthesize, resample and put results on the results channel, and the speech cache's
I/O thread, which puts the answers of shared-level lookups there too. Events go out
through the ``on_event`` callback, called on the coordinator thread.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from engine.backends.base import (
    Backend,
    BackendError,
    BatchSynthesizer,
    PcmChunk,
    VoicePreparer,
    WordTimer,
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
from engine.scheduler.cache_keys import key_maker
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
from engine.scheduler.output import (
    EventSink,
    OutputWriter,
    RelativeWords,
    duration_ms,
    relative_words,
)
from engine.scheduler.policy import RESERVE_FACTOR, RESERVE_FLOOR_S, Policy
from engine.scheduler.retention import may_keep
from engine.scheduler.state import (
    Generations,
    Lane,
    SchedulerStats,
    SegmentRecord,
    StatsCounter,
    Stream,
    Utterance,
)
from engine.scheduler.warm import MAX_WARM_JOBS, WARM_TIMEOUT_S, WarmJob, WarmRequest
from engine.speech_cache import CachedSegment, SegmentKey, SpeechCache, tenant_scope
from engine.text import stream_splitter
from telephony.codecs.resample import StreamingResampler

log = logging.getLogger(__name__)

STATS_INTERVAL_S = 0.1
PENDING_POLL_S = 0.004
IDLE_WAIT_S = 0.5
START_TIMEOUT_S = 10.0  # a new utterance that can start but is not started fails then
WARM_SLOT = -1  # the generation slot of warm-up jobs given to workers (never bumped)


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
    retain: bool | None = None  # the utterance's own ``cache``; None: the stream's


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
class _Warm:
    request: WarmRequest


@dataclass(frozen=True)
class _Fetched:
    """The answer of a shared-level lookup for a stream's next segment."""

    slot: int
    token: int
    key: SegmentKey
    segment: CachedSegment | None


@dataclass(frozen=True)
class _WarmFetched:
    """The answer of a shared-level lookup for a warm job's segment."""

    job: WarmJob
    token: int
    segment: CachedSegment | None


_Command = _Open | _Speak | _Cancel | _CancelUtterance | _Prepare | _Warm
_Result = Result | _Fetched | _WarmFetched


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
        speech_cache: SpeechCache | None = None,
        max_warm_jobs: int = MAX_WARM_JOBS,
        warm_timeout_s: float = WARM_TIMEOUT_S,
    ) -> None:
        self._cache = SpeechCache.disabled() if speech_cache is None else speech_cache
        self._warm_slots = threading.BoundedSemaphore(max_warm_jobs)
        self._warm_timeout_s = warm_timeout_s
        self._warm: deque[WarmJob] = deque()
        self._lookups = 0  # the last shared-level lookup's token
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
        self._results: Channel[_Result] = Channel(self._wakeup)
        self._output = OutputWriter(on_event, self._counters)
        self._inline = InlineLane(self._generations, self._output, self._counters)
        self._lanes: dict[int, Lane] = {}
        self._pools: dict[int, WorkerPool] = {}  # id(lane) -> its workers (batch lanes)
        for backend in backends.members:
            lane = _lane_for(backend)
            self._lanes[id(backend)] = lane
            if lane.batch is not None:
                self._pools[id(lane)] = WorkerPool(
                    lane, lane.batch, self._generations, self._results.put
                )
        self._timed_jobs: dict[Job, RelativeWords] = {}  # words the backend timed
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
        scope: str = tenant_scope(""),
        retain: bool = True,
        voice_digest: str = "",
    ) -> None:
        """``scope``: whose speech it is (the speech cache's key); ``retain``: whether
        its utterances may be kept by default; ``voice_digest``: its registered voice's
        (engine/speech_cache/key.py), "" for a built-in voice."""
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
        stream.scope, stream.retain, stream.voice_digest = scope, retain, voice_digest
        if self._cache.enabled:
            stream.keys = key_maker(
                voice, voice.handle, None, sample_rate, scope=scope,
                voice_digest=voice_digest, declared=self._cache.is_declared,
            )  # fmt: skip
            stream.cache_epoch = self._cache.epoch()  # its voice deleted later: not stored
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
        retain: bool | None = None,
    ) -> None:
        """Text for ``utterance``; ``instruct`` (with its first text) gives the utterance
        its own style instruction, ``retain`` (likewise) its own ``cache`` setting."""
        self._commands.put(_Speak(slot, utterance, text, final, release, instruct, retain))

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

    def warm_prompt(self, request: WarmRequest) -> bool:
        """Render ``request``'s segments into the speech cache behind every call's work;
        ``request.done`` is called once when it ends. False (and nothing is done) when
        ``max_warm_jobs`` are queued already."""
        if not self._warm_slots.acquire(blocking=False):
            return False
        self._commands.put(_Warm(request))
        return True

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
                    self._expire_warm(now)
                self._flush_all()
                served = self._serve_from_cache()
                self._dispatch_batches()
                stream = self._policy.most_urgent(self._waiting_streams(), inline=True)
                if stream is not None:
                    self._run_inline(stream)
                elif not served and not self._advance_warm():
                    break
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
        segment of ``stream``'s head utterance, taken off it (with its speech-cache key,
        under which it is stored once complete)."""
        utterance = stream.utterances[0]
        text = utterance.segments.popleft()
        utterance.checked = False
        utterance.dispatched = True
        key = utterance.keys.key(text) if utterance.keys is not None else None
        if key is not None and not utterance.cache:
            utterance.cache = "miss"
        stream.record = SegmentRecord(key) if key is not None else None
        return Segment(
            text,
            stream.handle(),
            utterance.seq,
            offset_ms=utterance.words_ms,
            start_samples=utterance.samples,
            leading=utterance.samples == 0,
            key=key,
        )

    def _run_inline(self, stream: Stream) -> None:
        """Synthesize the next segment of ``stream`` (an inline lane's) here and now."""
        utterance = stream.utterances[0]
        segment = self._next_segment(stream)
        spoken = self._inline.run(stream, utterance, segment)
        if spoken is not None:
            timed = relative_words(spoken.timed) if spoken.timed is not None else None
            self._segment_done(stream, utterance, segment, timed)
        self._dirty[stream.slot] = None

    def _segment_done(
        self,
        stream: Stream,
        utterance: Utterance,
        segment: Segment,
        timed: RelativeWords | None,
        *,
        told: bool = False,
    ) -> None:
        """``segment`` of ``utterance`` (the stream's head) is complete and wanted: its
        words (``timed`` by the backend, already ``told`` to the owner, else estimated
        now), where the next segment's words start, and the segment into the speech cache
        (exactly the bytes its ring got, and its words)."""
        samples = utterance.samples - segment.start_samples
        if timed is None:
            span = samples / stream.sample_rate
            words = relative_words(estimate_words(segment.text, span))
            self._output.words(stream, utterance, segment.offset_ms, words)
        else:
            words = timed
            if not told:
                self._output.words(stream, utterance, segment.offset_ms, words, "engine")
        utterance.words_ms = segment.offset_ms + duration_ms(samples, stream.sample_rate)
        record, stream.record = stream.record, None
        # A cancel bumps the generation before its command comes: a worker that saw the
        # bump stopped mid-segment, and its batch may end before the command is applied.
        # Such a segment is cut short, never stored.
        cancelled = self._generations.current(stream.slot) != stream.generation
        if (
            record is not None
            and segment.key is not None
            and record.key == segment.key
            and not cancelled
        ):
            cached = CachedSegment(bytes(record.pcm), words)
            if self._may_keep(utterance, segment.key, segment.text):
                self._cache.put(segment.key, cached, since=stream.cache_epoch)
            self._add_to_cut(stream, utterance, cached)
        else:
            utterance.cut = None  # a piece that cannot be stored: nor can the whole

    def _may_keep(self, utterance: Utterance, key: SegmentKey, text: str) -> bool:
        """Whether ``text`` of ``utterance``, synthesized under ``key``, may be stored
        (engine/scheduler/retention.py)."""
        return may_keep(
            retain=utterance.retain,
            declared=self._cache.is_declared(key),
            personal=text in utterance.private,
        )

    def _add_to_cut(self, stream: Stream, utterance: Utterance, piece: CachedSegment) -> None:
        """``piece`` (synthesized or from the cache) just played: if it is a piece of a
        segment the capacity fit cut, add it to the whole, and store the whole once its
        last piece has played (its words as they were told: each piece's rounded on its
        own; a segment after it may start 1 ms apart on a later hit, from rounding)."""
        cut = utterance.cut
        if cut is None:
            return
        cut.pcm += piece.pcm
        shift = cut.played_ms
        cut.words.extend((word, start + shift, end + shift) for word, start, end in piece.words)
        cut.played_ms += duration_ms(len(piece.pcm) // 2, stream.sample_rate)
        cut.pieces_left -= 1
        if cut.pieces_left > 0:
            return
        utterance.cut = None
        if utterance.keys is not None:
            key = utterance.keys.key(cut.text)
            if self._may_keep(utterance, key, cut.text):
                whole = CachedSegment(bytes(cut.pcm), tuple(cut.words))
                self._cache.put(key, whole, since=stream.cache_epoch)

    # --- the speech cache ----------------------------------------------------------------

    def _serve_from_cache(self) -> bool:
        """Look up the next segment of every stream that has one to look up: a memory hit
        is written to the ring now (it never enters a lane), a miss waits on the shared
        level (when there is one) or goes to synthesis. True if a hit was played."""
        if not self._cache.enabled:
            return False
        played = False
        for stream in self._waiting_streams():
            while policy.lookup_ready(stream):
                if not self._look_up(stream):
                    break
                played = True
        return played

    def _look_up(self, stream: Stream) -> bool:
        """Look up the next segment of ``stream``; True if it was played from memory."""
        head = stream.utterances[0]
        assert head.keys is not None
        key = head.keys.key(head.segments[0])
        segment = self._cache.get_local(key)
        if segment is not None:
            self._play_cached(stream, head, segment)
            return True
        if not self._cache.has_shared:
            head.checked = True
            return False
        self._lookups += 1
        token = stream.fetching = self._lookups
        slot = stream.slot

        def answer(found_key: SegmentKey, found: CachedSegment | None) -> None:
            self._results.put(_Fetched(slot, token, found_key, found))

        self._cache.fetch(key, answer)
        return False

    def _play_cached(self, stream: Stream, utterance: Utterance, segment: CachedSegment) -> None:
        """Play the next segment of ``utterance`` (the stream's head) from the cache: its
        audio into the ring (or ``pending``), its words, as its synthesis gave them."""
        utterance.segments.popleft()
        utterance.checked = False
        if not utterance.cache:
            utterance.cache = "hit"
        offset_ms = utterance.words_ms
        self._output.write(stream, utterance, segment.pcm)
        source = "engine" if stream.lane.times_words else "estimate"
        self._output.words(stream, utterance, offset_ms, segment.words, source)
        utterance.words_ms = offset_ms + duration_ms(len(segment.pcm) // 2, stream.sample_rate)
        self._add_to_cut(stream, utterance, segment)
        self._counters.cached(1)
        self._dirty[stream.slot] = None

    def _take_fetched(self, fetched: _Fetched) -> None:
        """A shared-level answer for a stream: played if still wanted, else dropped (the
        stream was cancelled, closed or moved on meanwhile)."""
        stream = self._streams.get(fetched.slot)
        if stream is None or stream.fetching != fetched.token:
            return
        stream.fetching = 0
        self._dirty[stream.slot] = None
        head = stream.utterances[0] if stream.utterances else None
        if head is None or not head.segments or head.keys is None:
            return
        if head.keys.key(head.segments[0]) != fetched.key:
            return  # its next segment changed meanwhile: look it up again
        if fetched.segment is None:
            head.checked = True
        else:
            self._play_cached(stream, head, fetched.segment)

    # --- warm-up jobs --------------------------------------------------------------------

    def _start_warm(self, request: WarmRequest) -> None:
        lane = self._lanes[id(request.voice.backend)]
        self._warm.append(WarmJob.start(request, lane, self._warm_timeout_s))

    def _finish_warm(self, job: WarmJob) -> None:
        self._warm.remove(job)
        self._warm_slots.release()
        job.request.done(job.outcome())

    def _expire_warm(self, now: float) -> None:
        for job in list(self._warm):
            if now > job.deadline and not job.busy:
                job.error = ("queue_timeout", "not rendered in time: the engine is busy")
                self._finish_warm(job)

    def _call_work(self, lane: Lane) -> bool:
        """Whether a call has segments for ``lane`` that no worker holds (warm-up jobs
        then wait: they take idle capacity only)."""
        return any(s.lane is lane and not s.busy for s in self._waiting_streams())

    def _advance_warm(self) -> bool:
        """Move the warm-up jobs on: look their segments up, and synthesize one segment of
        an inline lane's job if no call has work for that lane. True if it did something
        that may let more be done at once."""
        progressed = False
        for job in list(self._warm):
            while not job.waiting and not job.finished and not job.checked:
                key = job.request.keys[job.index]
                if self._cache.contains_local(key):  # not a call's lookup: not counted
                    job.next_segment()
                elif self._cache.has_shared:
                    self._fetch_for_warm(job, key)
                else:
                    job.checked = True
            if job.finished and not job.waiting:
                self._finish_warm(job)
                progressed = True
        if any(job.to_synthesize and job.lane.batch is not None for job in self._warm):
            self._dispatch_batches()  # now, not at the coordinator's next wake-up
        for job in self._warm:
            if not job.to_synthesize or job.lane.batch is not None:
                continue
            if self._call_work(job.lane):
                continue
            return self._warm_inline(job) or progressed
        return progressed

    def _fetch_for_warm(self, job: WarmJob, key: SegmentKey) -> None:
        self._lookups += 1
        token = job.fetching = self._lookups

        def answer(_key: SegmentKey, found: CachedSegment | None) -> None:
            self._results.put(_WarmFetched(job, token, found))

        self._cache.fetch(key, answer)

    def _take_warm_fetched(self, fetched: _WarmFetched) -> None:
        job = fetched.job
        if job.fetching != fetched.token:
            return
        job.fetching = 0
        if fetched.segment is not None:
            job.next_segment()
        else:
            job.checked = True

    def _warm_inline(self, job: WarmJob) -> bool:
        """Synthesize the current segment of ``job`` (an inline lane's) here, given up as
        soon as anything arrives for the coordinator (a call must not wait behind it: the
        segment is done again later). True if it completed or failed."""
        self._wakeup.clear()  # from here on, any put interrupts the warm-up
        self._take_inputs()
        self._flush_all()
        if self._serve_from_cache() or self._call_work(job.lane):
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
        self._store_warm(job, bytes(pcm), timed)
        return True

    def _store_warm(self, job: WarmJob, pcm: bytes, timed: RelativeWords | None) -> None:
        """The current segment of ``job`` is synthesized: into the cache, on to the next."""
        key = job.request.keys[job.index]
        if timed is None:
            span = len(pcm) // 2 / key.sample_rate
            timed = relative_words(estimate_words(job.request.texts[job.index], span))
        self._cache.put(key, CachedSegment(pcm, timed), since=job.request.epoch)
        job.next_segment()

    def _dispatch_warm(self, lane: Lane, pool: WorkerPool) -> None:
        """Hand a worker lane's idle worker one warm-up segment, keeping a worker free for
        calls when the lane has more than one, and one warm segment at a time."""
        if lane.warm_busy or self._call_work(lane):
            return
        if lane.in_flight >= (1 if lane.threads == 1 else lane.threads - 1):
            return
        job = next((j for j in self._warm if j.lane is lane and j.to_synthesize), None)
        if job is None:
            return
        request = job.request
        key = request.keys[job.index]
        text = request.texts[job.index]
        segment = Segment(text, request.voice.handle, 0, leading=job.index == 0, key=key)
        work = Batch(
            lane,
            (
                Job(
                    WARM_SLOT,
                    self._generations.current(WARM_SLOT),
                    0,
                    text,
                    request.voice.handle,
                    StreamingResampler(request.voice.sample_rate, key.sample_rate),
                    segment,
                    warm=job,
                ),
            ),
        )
        job.busy = True
        lane.warm_busy = True
        lane.in_flight += 1
        now = time.monotonic()
        lane.running[id(work)] = now + lane.seconds_per_char * len(text) * self._policy.cost_factor
        pool.submit(work)

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
        self._counters.queued(sum(policy.awaits_synthesis(s) for s in self._streams.values()))

    def _apply(self, command: _Command) -> None:
        if isinstance(command, _Prepare):
            self._prepare(command)
            return
        if isinstance(command, _Warm):
            self._start_warm(command.request)
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
            utterance = Utterance(command.utterance, stream_splitter(stream.voice.language))
            utterance.keys = stream.keys
            utterance.retain = stream.retain if command.retain is None else command.retain
            stream.utterances.append(utterance)
            if command.instruct:
                settings = replace(stream.voice.settings, instruct=command.instruct)
                try:
                    utterance.handle = self._backends.resolve_voice(settings).handle
                except BackendError as exc:
                    self._output.fail(stream, utterance, exc.code, exc.message)
                    return
                if stream.keys is not None:
                    utterance.keys = key_maker(
                        stream.voice, utterance.handle, command.instruct, stream.sample_rate,
                        scope=stream.scope, voice_digest=stream.voice_digest,
                        declared=self._cache.is_declared,
                    )  # fmt: skip
        utterance.chars += len(command.text)
        if utterance.chars > self._max_text_chars:
            self._output.fail(stream, utterance, "text_too_long", "utterance text over the limit")
            return
        segments = utterance.splitter.feed(command.text)
        if command.final:
            segments += utterance.splitter.flush()
            utterance.final = True
        elif command.release:
            segments += utterance.splitter.release()
        utterance.segments.extend(segments)
        personal = utterance.splitter.personal
        utterance.private.update(text for text in segments if text in personal)
        if utterance.keys is not None and self._cache.enabled:
            keys = utterance.keys
            utterance.cached_texts.update(
                text for text in segments if self._cache.contains_local(keys.key(text))
            )

    def _cancel_utterance(self, command: _CancelUtterance) -> None:
        stream = self._streams.get(command.slot)
        if stream is None:
            return
        for utterance in stream.utterances:
            if utterance.seq == command.utterance:
                utterance.segments.clear()  # the one a worker may hold is its last
                utterance.splitter = stream_splitter(stream.voice.language)
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
        stream.fetching = 0  # an answer still out is dropped
        stream.record = None
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
                            segment,
                            stream,
                        )
                    )
                lane.in_flight += 1
                work = Batch(lane, tuple(jobs))
                lane.running[id(work)] = max(s.busy_until for s in chosen)
                self._pools[id(lane)].submit(work)
            if self._warm:
                self._dispatch_warm(lane, self._pools[id(lane)])

    def _take_result(self, result: _Result) -> None:
        if isinstance(result, Audio):
            self._take_audio(result)
        elif isinstance(result, Words):
            self._take_words(result)
        elif isinstance(result, _Fetched):
            self._take_fetched(result)
        elif isinstance(result, _WarmFetched):
            self._take_warm_fetched(result)
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
        if audio.job.warm is not None:
            audio.job.warm.pcm += audio.pcm
            return
        current = self._current(audio.job)
        if current is not None:
            stream, utterance = current
            self._output.write(stream, utterance, audio.pcm)
            self._dirty[stream.slot] = None

    def _take_words(self, timed: Words) -> None:
        if timed.job.warm is not None:
            timed.job.warm.words = relative_words(timed.words)
            return
        current = self._current(timed.job)
        if current is not None:
            segment = timed.job.segment
            words = relative_words(timed.words)
            self._timed_jobs[timed.job] = words
            offset_ms = segment.offset_ms if segment is not None else 0
            self._output.words(current[0], current[1], offset_ms, words, "engine")

    def _batch_done(self, done: BatchDone) -> None:
        lane = done.batch.lane
        lane.in_flight -= 1
        lane.running.pop(id(done.batch), None)
        if done.error is None:  # a padded batch takes as long as its longest segment
            policy.observe_pace(lane, done.seconds, max(len(job.text) for job in done.batch.jobs))
        self._counters.synthesized(len(done.batch.jobs), done.seconds)
        for job in done.batch.jobs:
            if job.warm is not None:
                self._warm_done(lane, job.warm, done.error)
                continue
            stream = self._streams.get(job.slot)
            # The worker no longer holds any of this stream's work, whether or not it was
            # cancelled meanwhile (a backend that streams a segment out over several emits
            # is still running when a cancel arrives).
            if stream is not None and stream is job.stream:
                stream.busy = False
                self._dirty[stream.slot] = None
            current = self._current(job)
            timed = self._timed_jobs.pop(job, None)
            if current is not None and done.error is not None:
                self._output.fail(current[0], current[1], *done.error)
            elif current is not None and job.segment is not None:
                stream, utterance = current
                span = (utterance.samples - job.segment.start_samples) / stream.sample_rate
                policy.observe_audio(stream.lane, stream, span, len(job.text))
                self._segment_done(stream, utterance, job.segment, timed, told=timed is not None)

    def _warm_done(self, lane: Lane, job: WarmJob, error: tuple[str, str] | None) -> None:
        lane.warm_busy = False
        job.busy = False
        if error is not None:
            job.error = ("synthesis_failed", error[1])
        else:
            self._store_warm(job, bytes(job.pcm), job.words)
        if job.finished:
            self._finish_warm(job)
