"""What the coordinator knows of its streams, utterances and lanes, and the two pieces of
state other threads share with it, each behind its own lock: the slots' generations
(read by the lanes' workers) and the counters (read by the server's event loop)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, BinaryIO

from engine.backends.base import Backend, BatchSynthesizer
from engine.backends.routing import RoutedVoice
from engine.capacity import Pace
from engine.ipc.boundaries import BoundaryWriter
from engine.ipc.ring import SpscRing
from engine.scheduler.cache_keys import KeyMaker
from engine.scheduler.cores import CoreGate
from engine.scheduler.pace import PaceFit
from engine.speech_cache import SegmentKey
from engine.text import SegmentSplitter
from telephony.codecs.resample import StreamingResampler

if TYPE_CHECKING:
    from engine.scheduler.flights import Flight


@dataclass
class CutSegment:
    """A segment the capacity fit cut into pieces (engine/scheduler/policy.py): what its
    pieces played so far, stored in the speech cache under the whole segment's text once
    the last has played, so the next caller of that text hits it whole (as this caller
    heard it) instead of missing it because it was stored only piece by piece."""

    text: str  # the whole segment
    pieces_left: int
    pcm: bytearray = field(default_factory=bytearray)
    words: list[tuple[str, int, int]] = field(default_factory=list)  # from its start
    played_ms: int = 0  # the pieces' durations so far, each rounded as the words were


@dataclass
class Utterance:
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
    # Where its next segment's words start (ms): the sum of its segments' durations, each
    # rounded on its own, so a cached segment's words come out as its synthesis gave them.
    words_ms: int = 0
    handle: object = None  # its own voice handle (a style instruction), else the stream's
    # Speech cache: its segments' keys (None: not cached); ``checked``: its next segment
    # was looked up and missed (it goes to synthesis); ``cache``: where its first
    # segment's audio came from ("hit", "miss"; "" not cached), told in UtteranceAudio.
    keys: KeyMaker | None = None
    checked: bool = False
    cache: str = ""
    # Its segments that the memory level held when their text came: no synthesis work
    # for the capacity fit (an estimate: one evicted meanwhile is synthesized as usual).
    cached_texts: set[str] = field(default_factory=set)
    # What the cache may keep (engine/scheduler/retention.py): ``retain`` False keeps
    # nothing of it; ``private``: its segments (and their pieces) that carry personal data.
    retain: bool = True
    private: set[str] = field(default_factory=set)
    # Its segments that are the words before a personal item (kept apart to be reused:
    # a hit on one is a cached prefix, counted as such).
    prefixes: set[str] = field(default_factory=set)
    # A prefix and the rest cut from one segment -> that segment whole (SegmentSplitter).
    wholes: dict[tuple[str, str], str] = field(default_factory=dict)
    cut: CutSegment | None = None  # its segment in pieces, while they play
    startable_since: float | None = None  # first seen able to start (the start deadline)
    dispatched: bool = False  # a segment of it went to synthesis: the deadline is over
    # Its audio is kept back from the ring (in the stream's ``pending``) until the rest
    # of it can follow without a gap (Policy.may_release): a new utterance in a gated
    # lane, with more than its first segment to synthesize (released once its lane has
    # measured its pace and the replay says so, or nothing of it is left to do).
    held: bool = False
    # When the release was last weighed, and the utterance's progress then (segments
    # left, in flight, samples made): Policy.recheck_release.
    release_checked: tuple[float, tuple[int, bool, int]] | None = None


@dataclass
class RunningBatch:
    """A batch with a lane's workers: when it is expected done, and what that was
    estimated from (a batch that began alone is estimated again at the lane's shared
    pace once another begins beside it: Lane.begin)."""

    end: float  # monotonic
    started: float = 0.0
    chars: int = 0  # its longest segment's
    alone: bool = False  # began while the lane ran nothing else
    workers: int = 1  # of the lane's (every one: a lone call, Lane.lone_calls)
    overlapped: bool = False  # another batch began while it ran
    narrowed: bool = False  # began alone and went on with one core (Lane.narrow)
    streams: tuple[Stream, ...] = ()  # whose segments it synthesizes


@dataclass
class Lane:
    """Where one backend's segments run, and what the coordinator has measured of it
    (see engine/scheduler/__init__.py). Owned by the coordinator thread."""

    backend: Backend
    batch: BatchSynthesizer | None  # None: in the coordinator, one segment at a time
    threads: int = 0
    max_batch: int = 1
    # New utterances start only when they fit (engine/capacity.py): set for backends
    # whose calls are independent (their capability record's ``independent_calls``).
    gated: bool = False
    # The backend times the words it speaks (its capability record's ``word_timings``).
    times_words: bool = False
    in_flight: int = 0  # workers busy with a batch (a lone call's batch takes them all)
    # Workers beyond the cores, for new utterances' first segments (lanes.SPARE_JOBS):
    # each waits for a core that a running job gives between pieces (scheduler/cores.py).
    spare: int = 0
    # Its cores, given between pieces (scheduler/cores.py; a batch lane's workers use it).
    gate: CoreGate = field(init=False)
    # A call that runs alone may take every core (its capability record's ``lone_calls``).
    lone_calls: bool = False
    # A leading segment comes in pieces that keep pace once the first is out (its
    # capability record's ``paced_leading``).
    paced_leading: bool = False
    warm_busy: bool = False  # one of them is a warm-up job's (engine/scheduler/warm.py)
    # A call's recent wall time: a fixed cost plus a cost per character of its longest
    # segment (the padded length), fitted to the calls that ran beside others, or while
    # there were none yet, to those that ran alone (engine/scheduler/pace.py): the fit's
    # line as last observed (policy.observe_pace), priced through :meth:`pace`.
    seconds_per_call: float = 0.0
    seconds_per_char: float = 0.0
    # ... and no call below the fastest that fit has seen (PaceFit.fastest)
    fastest_call: float = 0.0
    # The fits: calls that ran beside another of the lane's, and calls that ran alone
    # (a backend may give a lone call every core: Kokoro's idle session).
    fit: PaceFit = field(default_factory=PaceFit)
    alone_fit: PaceFit = field(default_factory=PaceFit)
    audio_per_char: float = 0.0  # recent seconds of audio per character of text
    running: dict[int, RunningBatch] = field(default_factory=dict)  # id(batch) -> it
    streams: dict[int, Stream] = field(default_factory=dict)  # slot -> its open stream

    def __post_init__(self) -> None:
        self.gate = CoreGate(self.threads)

    @property
    def idle(self) -> bool:
        """No batch of the lane runs: one that begins now runs alone."""
        return self.in_flight == 0

    def cores_of(self, *, lone: bool) -> int:
        """The cores a batch holds: every one for a lone call (:meth:`runs_alone`), else one."""
        return self.threads if lone else 1

    def pace(self, *, alone: bool = False, audio_per_char_prior: float = 0.0) -> Pace:
        """The lane's pace (engine/capacity.py): its line, and its audio per character
        (``audio_per_char_prior`` while it has measured none); ``alone``: the pace of a
        call that runs while the lane runs nothing else, once one was measured."""
        audio_per_char = self.audio_per_char or audio_per_char_prior
        if alone and self.alone_fit.calls:
            per_call, per_char = self.alone_fit.line()
            return Pace(per_char, audio_per_char, per_call, self.alone_fit.fastest)
        return Pace(self.seconds_per_char, audio_per_char, self.seconds_per_call, self.fastest_call)

    def call_seconds(self, chars: int, *, alone: bool = False) -> float:
        """The expected wall seconds of a call whose longest segment has ``chars``
        characters, no safety on it (:meth:`pace`'s ``alone``)."""
        return self.pace(alone=alone).call_seconds(chars, 1.0)

    def begin(
        self,
        key: int,
        end: float,
        chars: int,
        now: float,
        cost_factor: float,
        *,
        streams: Sequence[Stream] = (),
        lone: bool = False,
    ) -> None:
        """A batch (``key``: its ``id``) goes to the lane's workers at ``now``, expected
        done at ``end``, its longest segment ``chars`` long, for ``streams``; ``lone``:
        it takes every worker (:meth:`runs_alone`). A batch that began alone and took one
        worker shares the cores from now on (a backend may have given it every core): it
        and its streams are expected done when the lane's shared pace says,
        ``cost_factor`` its safety (never earlier than before)."""
        workers = self.cores_of(lone=lone)
        batch = RunningBatch(end, now, chars, self.idle, workers, streams=tuple(streams))
        for running in self.running.values():
            if running.overlapped:
                continue
            running.overlapped = True
            if running.alone:
                self._expect_shared(running, cost_factor)
        self.in_flight += batch.workers
        self.running[key] = batch

    def narrow(self, key: int, cost_factor: float) -> None:
        """The lone batch ``key`` goes on with one core (its backend said so, its first
        audio out): the lane's other workers are free for another batch, and it and its
        streams are expected done at the shared pace (``cost_factor`` its safety)."""
        running = self.running.get(key)
        if running is None or running.workers == 1:
            return
        self.in_flight -= running.workers - 1
        running.workers, running.narrowed = 1, True
        self._expect_shared(running, cost_factor)

    def _expect_shared(self, running: RunningBatch, cost_factor: float) -> None:
        """``running`` began alone and shares the cores from now on: it and its streams
        are expected done when the shared pace says (never earlier than before)."""
        shared = running.started + self.call_seconds(running.chars) * cost_factor
        running.end = max(running.end, shared)
        for stream in running.streams:
            if stream.busy:
                stream.busy_until = max(stream.busy_until, running.end)

    def finish(self, key: int) -> RunningBatch | None:
        """The batch ``key`` (its ``id``) is done: what was known of it."""
        running = self.running.pop(key, None)
        self.in_flight -= 1 if running is None else running.workers
        return running

    def runs_alone(self, streams: Sequence[Stream]) -> bool:
        """Whether a batch for ``streams`` gets every worker of the lane: its backend gives
        a lone call every core (``lone_calls``), the lane runs nothing, and no other of
        its streams has a segment to do (a newcomer that comes meanwhile waits for it:
        a call decoded beside a lone one on two cores slows both past their plan, and a
        caller then hears a hole)."""
        if not self.lone_calls or self.in_flight or self.threads < 2:
            return False
        return not any(
            s not in streams and (s.busy or (s.utterances and s.utterances[0].segments))
            for s in self.streams.values()
        )


@dataclass
class Stream:
    slot: int
    stream_id: int
    owner: object
    ring: SpscRing
    boundaries: BoundaryWriter
    voice: RoutedVoice
    lane: Lane
    resampler: StreamingResampler
    bytes_per_second: int
    sample_rate: int
    busy: bool = False  # a segment of it is with a lane's worker, or in a flight it joined
    flight: Flight | None = None  # the flight it listens to (engine/scheduler/flights.py)
    fetching: int = 0  # the token of its speech-cache lookup in the shared level (0: none)
    keys: KeyMaker | None = None  # its voice's speech-cache keys (None: not cached)
    cache_epoch: int = 0  # the speech cache's epoch when it opened (SpeechCache.epoch)
    # Whose its speech is (the key's scope), whether its utterances may be kept by
    # default, and its registered voice's digest (from the gateway; "" built-in).
    scope: str = "tenant:"
    retain: bool = True
    voice_digest: str = ""
    record: SegmentRecord | None = None  # the segment in synthesis, kept for the cache
    busy_until: float = 0.0  # when that segment is expected done (monotonic)
    busy_audio_s: float = 0.0  # and the audio it is expected to give, less what it gave
    # That segment comes in pieces that keep pace once its first audio is out (the lane's
    # ``paced_leading``), and some of its audio has come: the rest plays without a gap.
    busy_paced: bool = False
    busy_began: bool = False
    audio_per_char: float = 0.0  # this stream's recent seconds of audio per character
    utterances: deque[Utterance] = field(default_factory=deque)
    pending: bytearray = field(default_factory=bytearray)
    # Utterance ends not yet in the boundaries ring (it was full): block later audio.
    pending_boundaries: deque[tuple[int, int]] = field(default_factory=deque)
    # The slot's generation when this stream last dropped its work (see Generations).
    generation: int = 0
    tap: BinaryIO | None = None  # debug copy of everything written (ENGINE_PCM_TAP_DIR)
    # Recently failed utterances: later pieces of their text are ignored.
    failed: deque[int] = field(default_factory=lambda: deque(maxlen=64))

    def handle(self) -> object:
        """The voice handle of the head utterance (its own, with a style instruction) or
        the stream's."""
        head = self.utterances[0] if self.utterances else None
        return head.handle if head is not None and head.handle is not None else self.voice.handle

    def renew_resampler(self) -> None:
        """A fresh resampler (a worker may still hold the old one for work now void)."""
        self.resampler = StreamingResampler(self.voice.sample_rate, self.sample_rate)


@dataclass
class SegmentRecord:
    """What the stream's segment in synthesis wrote to its ring, and its words (relative
    ms): stored in the speech cache under ``key`` once the segment is complete."""

    key: SegmentKey
    pcm: bytearray = field(default_factory=bytearray)
    words: tuple[tuple[str, int, int], ...] | None = None  # timed by the backend


class Generations:
    """slot -> generation, bumped (on the server's loop thread) on open, cancel and close,
    so that work begun for a slot's earlier stream or earlier utterances is recognized
    and stopped at once; read by the coordinator and the lanes' workers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[int, int] = {}

    def bump(self, slot: int) -> None:
        with self._lock:
            self._values[slot] = self._values.get(slot, 0) + 1

    def current(self, slot: int) -> int:
        with self._lock:
            return self._values.get(slot, 0)


@dataclass
class SchedulerStats:
    active_streams: int = 0
    queued_utterances: int = 0
    segments: int = 0
    cached_segments: int = 0  # segments played from the speech cache
    cached_audio_s: float = 0.0  # ... their audio
    audio_samples: int = 0
    audio_s: float = 0.0  # every stream's audio, whatever its source
    synth_seconds: float = 0.0
    joined_segments: int = 0  # segments a stream heard from another's synthesis
    joined_audio_s: float = 0.0  # ... the audio they did not synthesize again
    prefix_hits: int = 0  # cache hits on the words before a personal item
    prefix_audio_s: float = 0.0  # ... the audio they did not synthesize


class StatsCounter:
    """The scheduler's counters: written by the coordinator, read (as a copy) by anyone."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stats = SchedulerStats()

    def snapshot(self) -> SchedulerStats:
        with self._lock:
            return replace(self._stats)

    def audio(self, samples: int, seconds: float = 0.0) -> None:
        """Audio written to a stream (synthesized for it, joined or from the cache)."""
        with self._lock:
            self._stats.audio_samples += samples
            self._stats.audio_s += seconds

    def synthesized(self, segments: int, seconds: float) -> None:
        with self._lock:
            self._stats.segments += segments
            self._stats.synth_seconds += seconds

    def cached(self, segments: int, seconds: float = 0.0) -> None:
        with self._lock:
            self._stats.cached_segments += segments
            self._stats.cached_audio_s += seconds

    def joined(self, audio_s: float) -> None:
        with self._lock:
            self._stats.joined_segments += 1
            self._stats.joined_audio_s += audio_s

    def prefix_hit(self, audio_s: float) -> None:
        with self._lock:
            self._stats.prefix_hits += 1
            self._stats.prefix_audio_s += audio_s

    def streams(self, active: int) -> None:
        with self._lock:
            self._stats.active_streams = active

    def queued(self, utterances: int) -> None:
        with self._lock:
            self._stats.queued_utterances = utterances


def held(stream: Stream) -> bool:
    """Its head utterance's audio is kept back from the ring (Policy.may_release)."""
    return bool(stream.utterances) and stream.utterances[0].held
