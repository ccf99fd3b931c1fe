"""The coordinator: one thread that owns every stream, takes the server's commands and
the workers' results, applies the policy (engine/scheduler/policy.py) and hands segments
to the lanes (engine/scheduler/lanes.py); the output writer (engine/scheduler/output.py)
puts their audio into the rings, the cache path (engine/scheduler/cache_path.py) serves
and stores the speech cache's segments and joins syntheses in flight
(engine/scheduler/flights.py), and the warm-ups (engine/scheduler/warming.py) render
prompts on idle capacity. See engine/scheduler/__init__.py for the rules.

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
from collections.abc import Callable

from engine.backends.routing import BackendSet, RoutedVoice
from engine.capacity import COST_FACTOR, MARGIN_S
from engine.ipc.boundaries import BoundaryWriter
from engine.ipc.ring import SpscRing
from engine.ipc.schema import (
    Cancelled,
    StreamClosed,
)
from engine.scheduler import commands, policy
from engine.scheduler.cache_keys import key_maker
from engine.scheduler.cache_path import CachePath
from engine.scheduler.channels import Channel, Wakeup
from engine.scheduler.dispatch import next_batch
from engine.scheduler.flights import Flight, FlightTable
from engine.scheduler.lanes import (
    Audio,
    Batch,
    BatchDone,
    InlineLane,
    Job,
    Narrowed,
    Segment,
    Words,
    WorkerPool,
    lane_for,
    take_segment,
)
from engine.scheduler.output import EventSink, OutputWriter, RelativeWords, relative_words
from engine.scheduler.policy import RESERVE_FACTOR, RESERVE_FLOOR_S, CachedStart, Policy
from engine.scheduler.state import (
    Generations,
    Lane,
    SchedulerStats,
    StatsCounter,
    Stream,
    Utterance,
)
from engine.scheduler.utterances import Utterances, prepare_voice
from engine.scheduler.warm import MAX_WARM_JOBS, WARM_TIMEOUT_S, WarmRequest
from engine.scheduler.warming import WarmUps
from engine.speech_cache import SpeechCache, tenant_scope
from telephony.codecs.resample import StreamingResampler

log = logging.getLogger(__name__)

STATS_INTERVAL_S = 0.1
PENDING_POLL_S = 0.004
IDLE_WAIT_S = 0.5
START_TIMEOUT_S = 10.0  # a new utterance that can start but is not started fails then


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
        self._tap_directory = tap_directory
        self._on_fatal = on_fatal
        self._policy = Policy(reserve_factor, reserve_floor_s, cost_factor, margin_s)
        self._backends = backends
        self._on_event = on_event
        self._counters = StatsCounter()
        self._generations = Generations()
        self._wakeup = Wakeup()
        self._stopping = threading.Event()  # set by stop(), on the loop thread
        self._commands: Channel[commands.Command] = Channel(self._wakeup)
        self._results: Channel[commands.Incoming] = Channel(self._wakeup)
        self._output = OutputWriter(on_event, self._counters)
        self._inline = InlineLane(self._generations, self._output, self._counters)
        self._utterances = Utterances(
            backends, self._cache, self._output, max_text_chars=max_text_chars,
            start_timeout_s=start_timeout_s,
        )  # fmt: skip
        self._flights = FlightTable(self._generations)
        self._cache_path = CachePath(
            self._cache, self._flights, self._output, self._counters, self._results.put,
            self._touch, self._may_start,
        )  # fmt: skip
        self._warm_ups = WarmUps(
            self._cache, self._flights, self._counters, self._results.put, self._wakeup,
            self._stopping, max_jobs=max_warm_jobs, timeout_s=warm_timeout_s,
            cost_factor=cost_factor,
        )  # fmt: skip
        self._lanes: dict[int, Lane] = {}
        self._pools: dict[int, WorkerPool] = {}  # id(lane) -> its workers (batch lanes)
        for backend in backends.members:
            lane = lane_for(backend)
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
        self._commands.put(commands.Open(stream))

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
        self._commands.put(commands.Speak(slot, utterance, text, final, release, instruct,
                                          retain))  # fmt: skip

    def cancel(self, slot: int) -> None:
        self._generations.bump(slot)
        self._commands.put(commands.Cancel(slot, close=False))

    def cancel_utterance(self, slot: int, utterance: int) -> None:
        """Synthesize no more of ``utterance`` than the segment in progress; it then ends
        as usual. Its later text is ignored."""
        self._commands.put(commands.CancelUtterance(slot, utterance))

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
        self._commands.put(commands.Prepare(request_id, owner, pcm16k, language, transcript))

    def close_stream(self, slot: int) -> None:
        self._generations.bump(slot)
        self._commands.put(commands.Cancel(slot, close=True))

    def warm_prompt(self, request: WarmRequest) -> bool:
        """Render ``request``'s segments into the speech cache behind every call's work;
        ``request.done`` is called once when it ends. False (and nothing is done) when
        ``max_warm_jobs`` are queued already."""
        if not self._warm_ups.reserve():
            return False
        self._commands.put(commands.Warm(request))
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
                    self._warm_ups.expire(now)
                self._flush_all()
                served = self._cache_path.serve(self._waiting_streams())
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

    def _may_start(self, stream: Stream, leading_s: float, due_at: float | None) -> CachedStart:
        now = time.monotonic()
        arrives_in = 0.0 if due_at is None else max(0.0, due_at - now)
        return self._policy.cached_start(
            stream.lane, stream, leading_s, now, arrives_in_s=arrives_in
        )

    def _touch(self, slot: int) -> None:
        """``slot``'s stream has output or work to look at in the next pass."""
        self._dirty[slot] = None

    def _take(self, stream: Stream, *, record: bool) -> Segment:
        """The next segment of ``stream``'s head utterance, leaving for synthesis."""
        segment = take_segment(stream, record=record)
        utterance = stream.utterances[0]
        if segment.key is not None and not utterance.cache:
            utterance.cache = "miss"
        return segment

    def _run_inline(self, stream: Stream) -> None:
        """Synthesize the next segment of ``stream`` (an inline lane's) here and now."""
        utterance = stream.utterances[0]
        segment = self._take(stream, record=True)
        spoken = self._inline.run(stream, utterance, segment)
        if spoken is not None:
            timed = relative_words(spoken.timed) if spoken.timed is not None else None
            self._segment_done(stream, utterance, segment, timed, told=False)
        self._touch(stream.slot)

    def _segment_done(self, stream: Stream, utterance: Utterance, segment: Segment,
                      timed: RelativeWords | None, *, told: bool) -> None:  # fmt: skip
        """``segment``, synthesized for ``stream`` alone, is complete and wanted."""
        cancelled = self._generations.current(stream.slot) != stream.generation
        self._cache_path.record_done(stream, utterance, segment, timed, told=told,
                                     cancelled=cancelled)  # fmt: skip

    # --- what the warm-ups need (engine/scheduler/warming.py Host) ----------------------

    def call_work(self, lane: Lane) -> bool:
        """Whether a call has segments for ``lane`` that no worker holds (warm-up jobs
        then wait: they take idle capacity only)."""
        return any(s.lane is lane and not s.busy for s in self._waiting_streams())

    def interrupting(self, lane: Lane) -> bool:
        self._take_inputs()
        self._flush_all()
        return self._cache_path.serve(self._waiting_streams()) or self.call_work(lane)

    def _advance_warm(self) -> bool:
        progressed = self._warm_ups.advance(self)
        if any(self._warm_ups.to_synthesize(lane) for lane in self._lanes.values()
               if lane.batch is not None):  # fmt: skip
            self._dispatch_batches()  # now, not at the coordinator's next wake-up
        return progressed

    # --- commands ----------------------------------------------------------------------

    def _expire_unstarted(self, now: float) -> None:
        for stream in self._utterances.expire_unstarted(self._waiting_streams(), now):
            self._touch(stream.slot)

    def _update_queue_stats(self) -> None:
        self._counters.queued(sum(policy.awaits_synthesis(s) for s in self._streams.values()))

    def _apply(self, command: commands.Command) -> None:
        if isinstance(command, commands.Prepare):
            self._on_event(command.owner, prepare_voice(self._backends, command))
            return
        if isinstance(command, commands.Warm):
            request = command.request
            self._warm_ups.start(request, self._lanes[id(request.voice.backend)])
            return
        if isinstance(command, commands.CancelUtterance):
            cancelled = self._streams.get(command.slot)
            if cancelled is not None:
                self._utterances.cancel(cancelled, command.utterance)
            self._touch(command.slot)
            return
        if isinstance(command, commands.Open):
            stream = command.stream
            stream.generation = self._generations.current(stream.slot)
            previous = self._streams.get(stream.slot)
            if previous is not None:
                previous.lane.streams.pop(stream.slot, None)
            self._streams[stream.slot] = stream
            stream.lane.streams[stream.slot] = stream
        elif isinstance(command, commands.Speak):
            speaking = self._streams.get(command.slot)
            if speaking is not None:
                self._utterances.accept(speaking, command)
        else:
            self._drop_work(command)
        self._touch(command.stream.slot if isinstance(command, commands.Open) else command.slot)
        self._counters.streams(len(self._streams))

    def _drop_work(self, command: commands.Cancel) -> None:
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
        flight, stream.flight = stream.flight, None
        if flight is not None:
            # It no longer waits on that synthesis; the others hearing it go on, and the
            # worker stops only when nobody is left (engine/scheduler/flights.py).
            stream.busy = False
            if not flight.wanted:
                self._flights.abandon(flight)
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
        now = time.monotonic()
        for slot in dirty:
            stream = self._streams.get(slot)
            if stream is None:
                continue  # closed
            self._policy.recheck_release(stream, now)
            if self._output.flush(stream):
                self._dirty[slot] = None  # waiting for ring space: retry next pass
            if stream.utterances and stream.utterances[0].segments:
                self._waiting[slot] = None

    # --- worker lanes ------------------------------------------------------------------

    def _dispatch_batches(self) -> None:
        """Hand every idle worker a batch: the most urgent ready streams of one model. A
        ready stream whose next segment is in flight for another joins it instead."""
        for lane in self._lanes.values():
            batch = lane.batch
            if batch is None:
                continue
            while True:
                now = time.monotonic()
                waiting = self._waiting_streams()
                formed = next_batch(lane, batch, waiting, self._policy, self._cache_path.joins, now)
                if formed is None:
                    break
                chosen = formed.streams
                jobs = [job for s in chosen if (job := self._job_for(s, lane)) is not None]
                if not jobs:
                    continue  # each joined a flight another of them began
                work = Batch(lane, tuple(jobs), lane.runs_alone(chosen), formed.newcomer)
                end, chars = max(s.busy_until for s in chosen), max(len(j.text) for j in jobs)
                cost = self._policy.cost_factor
                lane.begin(id(work), end, chars, now, cost, streams=chosen, lone=work.alone)
                self._pools[id(lane)].submit(work)
            lane.gate.admit()  # the cores left free go to newcomers waiting for one
            if self._warm_ups:
                self._warm_ups.dispatch(lane, self._pools[id(lane)], self)

    def _job_for(self, stream: Stream, lane: Lane) -> Job | None:
        """The job of ``stream``'s next segment, as a flight others may join when it has
        a key and may be shared; None when it joined one begun in this very batch."""
        if self._cache_path.join(stream, admitted=True) == "joined":
            return None
        utterance = stream.utterances[0]
        shared = utterance.keys is not None and utterance.retain
        segment = self._take(stream, record=not shared)
        if segment.key is None or not shared:
            return Job(stream.slot, stream.generation, segment.utterance, segment.text,
                       segment.voice, stream.resampler, segment, stream)  # fmt: skip
        resampler = StreamingResampler(stream.voice.sample_rate, stream.sample_rate)
        flight = self._flights.begin(segment.key, segment.text, lane, resampler)
        flight.expected_end, flight.expected_audio_s = stream.busy_until, stream.busy_audio_s
        flight.paced = stream.busy_paced
        self._cache_path.listen(flight, stream, utterance, segment, joined=False)
        return Job(flight.slot, flight.generation, segment.utterance, segment.text,
                   segment.voice, resampler, segment, stream, flight=flight)  # fmt: skip

    def _take_result(self, result: commands.Incoming) -> None:
        if isinstance(result, Audio):
            self._take_audio(result)
        elif isinstance(result, Words):
            self._take_words(result)
        elif isinstance(result, commands.Fetched):
            self._cache_path.take_fetched(result)
        elif isinstance(result, commands.WarmFetched):
            self._warm_ups.take_fetched(result)
        elif isinstance(result, Narrowed):
            result.batch.lane.narrow(id(result.batch), self._policy.cost_factor)
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
        flight = audio.job.flight
        if flight is not None:
            if not self._cache_path.flight_audio(flight, audio.pcm):
                self._flights.abandon(flight)  # nobody listens: the worker stops
            return
        current = self._current(audio.job)
        if current is not None:
            stream, utterance = current
            self._output.write(stream, utterance, audio.pcm)
            self._touch(stream.slot)

    def _take_words(self, timed: Words) -> None:
        words = relative_words(timed.words)
        if timed.job.flight is not None:
            self._cache_path.flight_words(timed.job.flight, words)
            return
        current = self._current(timed.job)
        if current is not None:
            segment = timed.job.segment
            self._timed_jobs[timed.job] = words
            offset_ms = segment.offset_ms if segment is not None else 0
            self._output.words(current[0], current[1], offset_ms, words, "engine")

    def _batch_done(self, done: BatchDone) -> None:
        lane = done.batch.lane
        running = lane.finish(id(done.batch))
        if done.error is None:
            chars = max(len(job.text) for job in done.batch.jobs)
            policy.observe_batch(lane, running, done.seconds, chars)
        self._counters.synthesized(len(done.batch.jobs), done.seconds)
        for job in done.batch.jobs:
            if job.flight is not None:
                self._flight_done(job.flight, done.error, warm=job.warm is not None)
                continue
            stream = self._streams.get(job.slot)
            # The worker no longer holds any of this stream's work, whether or not it was
            # cancelled meanwhile (a backend that streams a segment out over several emits
            # is still running when a cancel arrives).
            if stream is not None and stream is job.stream:
                stream.busy = False
                self._touch(stream.slot)
            current = self._current(job)
            timed = self._timed_jobs.pop(job, None)
            if current is not None and done.error is not None:
                self._output.fail(current[0], current[1], *done.error)
            elif current is not None and job.segment is not None:
                stream, utterance = current
                span = (utterance.samples - job.segment.start_samples) / stream.sample_rate
                policy.observe_audio(stream.lane, stream, span, len(job.text))
                self._segment_done(stream, utterance, job.segment, timed, told=timed is not None)

    def _flight_done(self, flight: Flight, error: tuple[str, str] | None, *, warm: bool) -> None:
        """``flight``'s batch ended: its listeners fail with the same error, or complete
        (and it is stored once); the warm-ups waiting for it move on."""
        self._flights.end(flight)
        if warm:
            flight.lane.warm_busy = False
        if error is not None:
            for listener in flight.live():
                self._output.fail(listener.stream, listener.utterance, *error)
        complete = error is None and self._generations.current(flight.slot) == flight.generation
        stored = self._cache_path.flight_ended(flight, complete)
        self._warm_ups.flight_ended(flight, stored is not None, error)
