"""The scheduler's rules, as functions of its state: which stream is most urgent, which
streams form a lane's next batch, whether a new utterance fits the lane's capacity, when
a playing stream's next segment must be cut, and the paces those rules read. No threads
and no clock of its own (the caller passes ``now``): unit-tested directly
(tests/engine/scheduler/test_policy.py). The rules are explained in
engine/scheduler/__init__.py."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from engine.backends.base import BatchSynthesizer
from engine.capacity import COST_FACTOR, MARGIN_S, Pace, Replay, StreamWork, can_start
from engine.scheduler.state import CutSegment, Lane, RunningBatch, Stream, held
from engine.text import MIN_FIT_CHARS, split_to_fit

# A playing stream goes before new utterances while it holds less unplayed audio than
# RESERVE_FACTOR times what its next segment is expected to take to synthesize (the
# lane's recent wall seconds per character), plus RESERVE_FLOOR_S.
RESERVE_FACTOR = 3.0
RESERVE_FLOOR_S = 0.2
PACE_SMOOTHING = 0.2  # weight of the newest batch in a lane's seconds per character
# Seconds of audio per character of text before a lane has measured its own (English
# speech is about 14 characters a second).
AUDIO_PER_CHAR_PRIOR = 0.07


def smoothed(old: float, value: float) -> float:
    """A recent average: ``value`` weighted PACE_SMOOTHING against ``old`` (0: none yet)."""
    return value if old == 0.0 else old + PACE_SMOOTHING * (value - old)


#: How long a new utterance with a cached start waits for room for its rest before it is
#: spoken whole (Policy.cached_start). Spoken whole, its cached words are synthesized again
#: and it goes first among the new utterances (it is the oldest), holding the others back
#: until that larger job fits: at 0.5 s, 100 warm calls of the IVR mix on a 2-core VM
#: (K, stop 47) had p99 3.7-4.6 s in six runs, at 5 s 2.6-4.0 s (docs/benchmarks.md).
CACHED_WAIT_S = 5.0
#: A held-back utterance whose own progress has not changed is weighed again (a replay
#: of its lane) at most this often: the coordinator polls streams that wait for ring
#: space every few milliseconds, and a held one waits so; the lane's other changes (a
#: worker freed, a call ended) reach it within this.
RELEASE_RECHECK_S = 0.05
#: A held-back utterance goes once it holds this much audio, whatever the replay says:
#: what one stream keeps in memory is bounded (20 s: 1.9 MB at 48 kHz).
MAX_HELD_S = 20.0

#: How a new utterance whose next segment is cached may start (Policy.cached_start).
CachedStart = Literal["play", "wait", "whole"]


#: Which streams a lane's next batch may take (:func:`room`).
Room = Literal["any", "playing", "newcomers", "none"]


def room(lane: Lane, *, playing_waits: bool) -> Room:
    """What a batch lane may take now, of its ready streams (``playing_waits``: one of
    them is playing, not new): with a core free, "any" stream, or only "playing" ones
    while newcomers already wait at its gate for a core (they go first, in order:
    engine/scheduler/cores.py ``admit``); with every core held, "newcomers" on its
    ``spare`` workers while a running call has audio enough to give one its core between
    pieces (``CoreGate.could_step_aside``) and no stream already playing waits for a core
    (it goes before any newcomer: :meth:`Policy.urgency`); else "none". Tells the gate
    whether such a stream waits: running calls then give their cores to no newcomer."""
    gate = lane.gate
    gate.playing_waits = playing_waits
    waiting, newcomers = gate.waiting
    if lane.in_flight >= lane.threads + lane.spare:
        return "none"
    if lane.in_flight - waiting < lane.threads:
        return "playing" if newcomers else "any"
    steps_aside = lane.spare > 0 and not playing_waits and gate.could_step_aside()
    return "newcomers" if steps_aside else "none"


def has_room(stream: Stream) -> bool:
    """Has a segment to do, and room for its audio (no backlog: audio held back is none),
    and none in flight (in synthesis or being looked up in the speech cache's shared
    level)."""
    return not (
        stream.busy
        or stream.fetching
        or (stream.pending and not held(stream))
        or stream.pending_boundaries
        or not stream.utterances
        or not stream.utterances[0].segments
    )


def ready(stream: Stream) -> bool:
    """Ready for synthesis: :func:`has_room`, and its next segment is not cached (looked
    up and missed, or its voice is not cached)."""
    if not has_room(stream):
        return False
    head = stream.utterances[0]
    return head.keys is None or head.checked


def lookup_ready(stream: Stream) -> bool:
    """Its next segment is to be looked up in the speech cache (before synthesis)."""
    if not has_room(stream):
        return False
    head = stream.utterances[0]
    return head.keys is not None and not head.checked


def awaits_synthesis(stream: Stream) -> int:
    """Its utterances that synthesis has (or had) work for, the count in
    queued_utterances: an utterance played from the speech cache so far (its first
    segment a hit, nothing of it synthesized) does not count."""
    return sum(
        1
        for u in stream.utterances
        if u.dispatched or not u.final or (u.segments and u.cache != "hit")
    )


def is_new(stream: Stream) -> bool:
    """Its head utterance has not begun and nothing of the stream is playing."""
    head = stream.utterances[0]
    return (
        head.start_pos is None
        and not stream.busy
        and not stream.pending
        and stream.ring.readable_bytes() == 0
    )


def unplayed_s(stream: Stream) -> float:
    """Seconds of the stream's audio produced and not yet heard (ring and backlog)."""
    return (stream.ring.readable_bytes() + len(stream.pending)) / stream.bytes_per_second


def segment_chars(stream: Stream, *, skip: int = 0) -> tuple[int, ...]:
    """The lengths of the segments ``stream`` still needs synthesized (but its first
    ``skip``): those the speech cache held when their text came are left out (they cost
    the lane nothing)."""
    chars: list[int] = []
    index = 0
    for u in stream.utterances:
        for segment in u.segments:
            if index >= skip and segment not in u.cached_texts:
                chars.append(len(segment))
            index += 1
    return tuple(chars)


def remaining_work(stream: Stream, now: float) -> StreamWork:
    """What ``stream`` still needs from its lane (engine/capacity.py)."""
    return StreamWork(
        segment_chars(stream),
        unplayed_s=unplayed_s(stream),
        heard=bool(stream.utterances) and stream.utterances[0].start_pos is not None,
        in_flight_s=max(0.0, stream.busy_until - now) if stream.busy else None,
        in_flight_audio_s=stream.busy_audio_s,
        in_flight_paced=stream.busy and stream.busy_paced and stream.busy_began,
        audio_per_char=stream.audio_per_char or None,
    )


def observe_audio(lane: Lane, stream: Stream, seconds: float, chars: int) -> None:
    """A segment of ``chars`` characters gave ``seconds`` of audio."""
    if chars > 0 and seconds > 0.0:
        rate = seconds / chars
        lane.audio_per_char = smoothed(lane.audio_per_char, rate)
        stream.audio_per_char = smoothed(stream.audio_per_char, rate)


def observe_pace(lane: Lane, seconds: float, chars: int, *, alone: bool = False) -> None:
    """A call whose longest segment had ``chars`` characters took ``seconds``;
    ``alone``: nothing else of the lane ran meanwhile. The lane's pace is the line fitted
    to the calls that ran beside others (engine/scheduler/pace.py), or while there were
    none yet, to those that ran alone."""
    if chars <= 0 or seconds <= 0.0:
        return  # (a job cancelled while it waited for a core ran for no time)
    (lane.alone_fit if alone else lane.fit).observe(chars, seconds)
    fit = lane.fit if lane.fit.calls else lane.alone_fit
    lane.seconds_per_call, lane.seconds_per_char = fit.line()
    lane.fastest_call = fit.fastest


def observe_batch(lane: Lane, running: RunningBatch | None, seconds: float, chars: int) -> None:
    """A batch of ``lane`` that ran as ``running`` says (None: not known) ended after
    ``seconds``, its longest segment ``chars`` characters (a padded batch takes as long
    as that one): a call that ran alone, or beside others; one that began alone and went
    on with one core (``narrowed``) ran as neither, and says nothing of either pace."""
    if running is not None and running.narrowed:
        return
    alone = running is not None and running.alone and not running.overlapped
    observe_pace(lane, seconds, chars, alone=alone)


@dataclass(frozen=True)
class Policy:
    """The scheduler's tunables and the rules that read them."""

    reserve_factor: float = RESERVE_FACTOR
    reserve_floor_s: float = RESERVE_FLOOR_S
    cost_factor: float = COST_FACTOR
    margin_s: float = MARGIN_S
    #: A new utterance held back with its cached start no longer waits for room after
    #: this long: it is spoken whole, in its turn among the new utterances.
    cached_wait_s: float = CACHED_WAIT_S

    def urgency(self, stream: Stream) -> tuple[int, float]:
        """Sort key of a ready stream, most urgent first: a playing stream's slack is its
        unplayed audio less the expected synthesis time of its next segment."""
        head = stream.utterances[0]
        buffered = stream.ring.readable_bytes() / stream.bytes_per_second
        if is_new(stream):
            return (1, head.arrived_at)  # a new utterance, nothing playing
        expected = stream.lane.call_seconds(len(head.segments[0]))
        slack = buffered - expected
        at_risk = buffered < self.reserve_factor * expected + self.reserve_floor_s
        return (0 if at_risk else 2, slack)

    def most_urgent(self, streams: Sequence[Stream], *, inline: bool) -> Stream | None:
        """The most urgent ready stream of ``streams`` in an inline lane (``inline``) or a
        worker lane. Streams with a backlog (``pending``) are skipped: their ring is full."""
        best: Stream | None = None
        best_key = (0, 0.0)  # (tier, slack or arrival)
        for stream in streams:
            if (stream.lane.batch is None) != inline or not ready(stream):
                continue
            key = self.urgency(stream)
            if best is None or key < best_key:
                best, best_key = stream, key
        return best

    def choose(
        self,
        lane: Lane,
        batch: BatchSynthesizer,
        candidates: Sequence[Stream],
        now: float,
    ) -> list[Stream]:
        """The next batch of ``lane`` (whose backend is ``batch``): of ``candidates``
        (ready, most urgent first), the most urgent of one model (``batch_key``), up to
        ``max_batch``, each marked busy. In a gated lane new utterances start in order of
        arrival and only while they fit (:meth:`can_start`), and a playing stream's next
        segment is cut to fit (:meth:`fit_next_segment`)."""
        chosen: list[Stream] = []
        key: object = None
        may_start = True
        alone = lane.idle  # the batch runs while the lane runs nothing else
        for stream in candidates:
            if len(chosen) == lane.max_batch:
                break
            stream_key = batch.batch_key(stream.handle())
            if chosen and stream_key != key:
                continue
            if lane.gated and is_new(stream):
                may_start = may_start and self.can_start(lane, stream, chosen, now)
                if not may_start:
                    continue
                head = stream.utterances[0]
                head.held = len(segment_chars(stream)) > 1
            elif lane.gated:
                self.fit_next_segment(lane, stream)
            key = stream_key
            self.mark_busy(lane, stream, now, alone=alone)
            chosen.append(stream)
        return chosen

    def can_start(self, lane: Lane, stream: Stream, forming: Sequence[Stream], now: float) -> bool:
        """Whether the new utterance of ``stream`` fits in ``lane`` now
        (engine/capacity.py); ``forming`` are the streams of the batch being formed."""
        committed = self._committed(lane, stream)
        if lane.seconds_per_char == 0.0:  # no pace yet: one new utterance per worker
            return sum(s.busy for s in committed) < lane.threads
        return can_start(
            StreamWork(segment_chars(stream)),
            [remaining_work(s, now) for s in committed],
            workers_free_in=self._workers(lane, forming, now),
            pace=self._pace(lane),
            cost_factor=self.cost_factor,
            margin_s=self.margin_s,
            min_piece_chars=MIN_FIT_CHARS,
        )

    def cached_start(
        self,
        lane: Lane,
        stream: Stream,
        leading_s: float,
        now: float,
        *,
        arrives_in_s: float = 0.0,
    ) -> CachedStart:
        """May the new utterance of ``stream`` start with its next segment from the speech
        cache (``leading_s`` seconds of audio: a hit, or the words before a personal
        item), or from a synthesis of it in flight for others (a join: its audio
        ``arrives_in_s`` from now, as the lane expects that flight done)? Once a caller
        hears an utterance's first frame, the rest must come without a gap, so it starts
        ("play") only when what it must still synthesize can follow that audio in time
        without making a call in progress run dry (engine/capacity.py, the newcomer
        heard from its cached start on); otherwise it "wait"s (within the start
        deadline) while the lane could do it were it free, for ``cached_wait_s`` at
        most; when even a free lane could not follow that start in time, or it has
        waited that long, it is spoken "whole" (the cached words and the rest as one
        segment, synthesized as a new utterance in its turn). Cached whole, already
        playing, or in a lane that is not gated: "play"."""
        if not lane.gated or not is_new(stream):
            return "play"
        rest = segment_chars(stream, skip=1)
        if not rest:
            return "play"
        committed = self._committed(lane, stream)
        if lane.seconds_per_char == 0.0:  # no pace yet: while a worker is free
            return "play" if sum(s.busy for s in committed) < lane.threads else "wait"
        if arrives_in_s > 0.0:
            new = StreamWork(rest, in_flight_s=arrives_in_s, in_flight_audio_s=leading_s)
        else:
            new = StreamWork(rest, unplayed_s=leading_s, heard=True)
        if not self._replay(lane, [0.0] * lane.threads).keeps_pace(new, []):
            return "whole"  # even a free lane could not follow it in time
        streams = [remaining_work(s, now) for s in committed]
        if self._replay(lane, self._workers(lane, (), now)).joins_without_harm(new, streams):
            return "play"
        since = stream.utterances[0].startable_since
        return "whole" if since is not None and now - since >= self.cached_wait_s else "wait"

    def recheck_release(self, stream: Stream, now: float) -> None:
        """Let ``stream``'s held-back audio go if :meth:`may_release` says so, weighing it
        again when its utterance made progress since the last time, or
        :data:`RELEASE_RECHECK_S` after it."""
        if not held(stream):
            return
        head = stream.utterances[0]
        progress = (len(head.segments), stream.busy, head.samples)
        last = head.release_checked
        if last is not None and last[1] == progress and now - last[0] < RELEASE_RECHECK_S:
            return
        head.release_checked = (now, progress)
        head.held = not self.may_release(stream.lane, stream, now)

    def may_release(self, lane: Lane, stream: Stream, now: float) -> bool:
        """Whether the held-back audio of ``stream``'s new utterance may go to its caller
        now: once its first frame is heard, the rest must come without a gap, so it goes
        when the replay (engine/capacity.py, beside the lane's other calls) has every one
        of its later segments arrive before the audio before it runs out, or when nothing
        of it is left to synthesize. Until then the caller waits for first audio (on a
        machine whose worker decodes near real time, a short first clause would otherwise
        play, then a hole while the next sentence is synthesized)."""
        head = stream.utterances[0]
        if not head.segments and not stream.busy:
            return True
        if head.start_pos is None:
            return False  # nothing to let go yet
        if unplayed_s(stream) >= MAX_HELD_S:
            return True  # a bound on what a stream keeps back (memory)
        if lane.seconds_per_char == 0.0:
            # no pace measured yet (the lane's first calls): nothing tells whether the
            # rest can follow, so it waits for the first call to be timed (a fresh
            # engine's first Kokoro utterance on a slow CPU played its clause, then a hole)
            return False
        return self._replay(lane, self._workers(lane, (), now)).keeps_pace(
            remaining_work(stream, now),
            [remaining_work(s, now) for s in self._committed(lane, stream)],
        )

    @staticmethod
    def _committed(lane: Lane, stream: Stream) -> list[Stream]:
        """The lane's streams other than ``stream`` that hold it to its work: in flight,
        or playing with segments left."""
        return [
            s
            for s in lane.streams.values()
            if s is not stream
            and (s.busy or (s.utterances and s.utterances[0].segments and not is_new(s)))
        ]

    @staticmethod
    def _workers(lane: Lane, forming: Sequence[Stream], now: float) -> list[float]:
        """Seconds until each of the lane's cores is free (``forming``: a batch being
        formed takes one). Batches beyond the cores (on spare workers) are counted as
        work after the earliest free core's (a conservative fold)."""
        ends = [r.end for r in lane.running.values() for _ in range(r.workers)]
        if forming:
            ends.append(max(s.busy_until for s in forming))
        workers = sorted(max(0.0, end - now) for end in ends)
        while len(workers) > max(1, lane.threads):
            extra = workers.pop(0)
            workers[0] += extra
            workers.sort()
        return workers + [0.0] * (lane.threads - len(workers))

    def _replay(self, lane: Lane, workers: Sequence[float]) -> Replay:
        """The replay of ``lane`` at its pace, its workers free in ``workers`` seconds."""
        return Replay(workers, self._pace(lane), self.cost_factor, self.margin_s, MIN_FIT_CHARS)

    @staticmethod
    def _pace(lane: Lane) -> Pace:
        return lane.pace(audio_per_char_prior=AUDIO_PER_CHAR_PRIOR)

    def fit_next_segment(self, lane: Lane, stream: Stream) -> None:
        """Cut the next segment of a playing stream when, at the lane's pace, it would not
        be ready before the stream's unplayed audio runs out: its first piece goes now, the
        rest next (a slow or loaded machine would otherwise stutter at a long segment that
        follows a short opening)."""
        head = stream.utterances[0]
        if lane.seconds_per_char == 0.0 or head.start_pos is None:
            return
        budget = self._pace(lane).chars_within(unplayed_s(stream) - self.margin_s, self.cost_factor)
        if len(head.segments[0]) > budget:
            pieces = split_to_fit(head.segments[0], budget)
            if len(pieces) > 1:
                whole = head.segments.popleft()
                head.segments.extendleft(reversed(pieces))
                if whole in head.private:  # its pieces carry its personal data
                    head.private.update(pieces)
                if head.cut is None:
                    head.cut = CutSegment(whole, len(pieces))
                else:  # a piece cut again: the whole is still the first cut's text
                    head.cut.pieces_left += len(pieces) - 1

    def mark_busy(self, lane: Lane, stream: Stream, now: float, *, alone: bool = False) -> None:
        """``stream``'s next segment goes to ``lane``: when it is expected done (with the
        replay's safety on its cost, engine/capacity.py; ``alone``: at the pace of a call
        that runs alone, until another begins beside it: Lane.begin) and the audio it
        should give."""
        chars = len(stream.utterances[0].segments[0])
        rate = stream.audio_per_char or lane.audio_per_char or AUDIO_PER_CHAR_PRIOR
        stream.busy = True
        stream.busy_until = now + lane.call_seconds(chars, alone=alone) * self.cost_factor
        stream.busy_audio_s = rate * chars
        stream.busy_paced = lane.paced_leading and stream.utterances[0].samples == 0
        stream.busy_began = False
