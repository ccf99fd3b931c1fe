"""Whether a lane can start one more utterance without making a call it already speaks
stutter: admission by the engine's measured capacity (sans-I/O, no clock of its own).

A lane whose calls are independent (Piper: one call per worker thread, one core each)
knows its pace: a worker's wall seconds for a segment, a fixed cost plus a cost per
character (engine/scheduler/pace.py), and the seconds of audio a character gives. Every
stream the lane already speaks for (**committed**: its utterance has begun and has text
left to synthesize) needs each of its remaining segments before the audio it holds runs
out. :func:`can_start` replays the lane's known work on its workers, the new utterance's
first segment first (the scheduler serves new utterances before streams that are
comfortably ahead), then each ready segment by the time its stream's audio runs out. The
newcomer may start when it makes no stream run dry that would not run dry without it,
and its own later segments can follow in time: calls already speaking stay whole.
Otherwise it waits (first-audio latency, which the gateway's admission control sees and
acts on). A stream that runs dry whatever happens (text streamed in slower than it is
spoken) does not hold every newcomer back.

A lane cuts a playing stream's next segment that would come too late into a piece that
fits (``min_piece_chars`` and more, the rest too: ``engine.text.split_to_fit``); the
replay does the same, assuming a word boundary where the piece should end.

The replay is an estimate: costs are scaled by ``cost_factor`` and a segment must arrive
``margin_s`` before its stream's audio runs out. A lane with nothing committed always
starts its next utterance (nothing to protect; waiting would never end).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

#: Default safety of the replay (see the module docstring). The margin covers a stall of
#: the machine the engine shares with the gateway (a collection, another process's burst):
#: at 0.1 s a loaded 2-core machine left a call dry now and then (docs/architecture.md);
#: at 0.25 s a slower one (its gateway's pacer ticks up to 0.1 s late under 40 Piper
#: calls) still did, once in three runs of the neural overload test, by 81 ms.
COST_FACTOR = 1.25
MARGIN_S = 0.4


@dataclass(frozen=True)
class Pace:
    seconds_per_char: float  # a worker's wall seconds per character of a segment
    audio_per_char: float  # seconds of audio per character of text
    seconds_per_call: float = 0.0  # ... and per segment, whatever its length
    min_call_seconds: float = 0.0  # no segment costs less (the fastest call seen)

    def call_seconds(self, chars: int, cost_factor: float) -> float:
        """What a segment of ``chars`` characters costs a worker, ``cost_factor`` the
        safety on it."""
        line = self.seconds_per_call + self.seconds_per_char * chars
        return max(self.min_call_seconds, line) * cost_factor

    def chars_within(self, seconds: float, cost_factor: float) -> int:
        """The most characters a segment may have to cost at most ``seconds``
        (:meth:`call_seconds`; 0: none does, or the pace is not known)."""
        char_cost = self.seconds_per_char * cost_factor
        if char_cost <= 0.0 or seconds < self.min_call_seconds * cost_factor:
            return 0
        return max(0, int((seconds - self.seconds_per_call * cost_factor) / char_cost))


@dataclass(frozen=True)
class StreamWork:
    """One stream's synthesis still to do, as its lane sees it now."""

    segments: tuple[int, ...]  # characters of each segment not yet begun, in order
    unplayed_s: float = 0.0  # audio produced and not yet heard
    heard: bool = False  # some of the utterance has been produced (it is playing)
    in_flight_s: float | None = None  # a segment in flight: seconds until it is done
    in_flight_audio_s: float = 0.0  # ... and the audio it adds
    # ... which comes in pieces that keep pace and has begun: all of it plays without a
    # gap from now on (the backend holds a paced segment's first audio until the rest
    # can follow), and the worker is free when it is done
    in_flight_paced: bool = False
    audio_per_char: float | None = None  # the stream's own measured rate, else the pace's


def can_start(
    new: StreamWork,
    committed: Sequence[StreamWork],
    *,
    workers_free_in: Sequence[float],
    pace: Pace,
    cost_factor: float = COST_FACTOR,
    margin_s: float = MARGIN_S,
    min_piece_chars: int | None = None,
) -> bool:
    """True when ``new`` may start now (see the module docstring). ``workers_free_in``
    has one entry per worker: seconds until it is free (0: idle). ``min_piece_chars``:
    the lane cuts a heard stream's segment that would come too late into a piece that
    fits, of at least this many characters (None: segments are never cut)."""
    if not committed:
        return True
    replay = Replay(workers_free_in, pace, cost_factor, margin_s, min_piece_chars)
    return replay.joins_without_harm(new, committed)


@dataclass(frozen=True)
class Replay:
    """A lane's workers (seconds until each is free) and pace, with the replay's safety
    (:func:`run_dry`'s arguments but the streams): the questions the scheduler asks."""

    workers_free_in: Sequence[float]
    pace: Pace
    cost_factor: float = COST_FACTOR
    margin_s: float = MARGIN_S
    min_piece_chars: int | None = None

    def run_dry(self, streams: Sequence[StreamWork]) -> set[int]:
        return run_dry(
            streams,
            self.workers_free_in,
            self.pace,
            self.cost_factor,
            self.margin_s,
            self.min_piece_chars,
        )

    def keeps_pace(self, stream: StreamWork, others: Sequence[StreamWork]) -> bool:
        """Whether every later segment of ``stream`` arrives before its audio runs out,
        its work replayed beside ``others``."""
        return len(others) not in self.run_dry([*others, stream])

    def joins_without_harm(self, new: StreamWork, others: Sequence[StreamWork]) -> bool:
        """Whether ``new``, replayed beside ``others``, keeps its own pace and makes no
        other stream run dry that would not run dry without it (the rule of
        :func:`can_start`, without its empty-lane shortcut)."""
        after = self.run_dry([*others, new])
        return len(others) not in after and after <= self.run_dry(others)


def run_dry(
    streams: Sequence[StreamWork],
    workers_free_in: Sequence[float],
    pace: Pace,
    cost_factor: float = COST_FACTOR,
    margin_s: float = MARGIN_S,
    min_piece_chars: int | None = None,
) -> set[int]:
    """Indexes of ``streams`` whose audio would run out before a segment arrives, when
    the lane's workers do their known work: a stream that has not been heard yet goes
    first, the others by when their audio runs out (see the module docstring)."""
    if min_piece_chars is not None and min_piece_chars < 1:
        raise ValueError("min_piece_chars must be at least 1")
    free = sorted(max(0.0, f) for f in workers_free_in) or [0.0]
    heapq.heapify(free)
    plays_until = [s.unplayed_s for s in streams]
    heard = [s.heard for s in streams]
    rate = [s.audio_per_char or pace.audio_per_char for s in streams]
    left = [list(s.segments) for s in streams]
    # Streams waiting for a segment in flight: (done at, index, audio it adds; None: a
    # paced segment, whose audio is counted already and cannot come late).
    arrivals: list[tuple[float, int, float | None]] = []
    ready: list[tuple[int, float, int]] = []  # (0 if never heard, plays until, index)
    for i, s in enumerate(streams):
        if s.in_flight_s is not None and s.in_flight_paced:
            plays_until[i] += s.in_flight_audio_s
            arrivals.append((max(0.0, s.in_flight_s), i, None))
        elif s.in_flight_s is not None:
            arrivals.append((max(0.0, s.in_flight_s), i, s.in_flight_audio_s))
        elif left[i]:
            ready.append((1 if heard[i] else 0, plays_until[i], i))
    heapq.heapify(arrivals)
    heapq.heapify(ready)
    dry: set[int] = set()

    def arrive(at: float, i: int, audio_s: float | None) -> None:
        if audio_s is not None:
            if heard[i] and at > plays_until[i] - margin_s:
                dry.add(i)
            plays_until[i] = max(plays_until[i], at) + audio_s
        heard[i] = True
        if left[i]:
            heapq.heappush(ready, (1, plays_until[i], i))

    while ready or arrivals:
        worker = heapq.heappop(free)
        while arrivals and arrivals[0][0] <= worker:
            arrive(*heapq.heappop(arrivals))
        if not ready:  # idle until the next segment in flight arrives
            if not arrivals:
                break
            at, i, audio_s = heapq.heappop(arrivals)
            arrive(at, i, audio_s)
            worker = at
            if not ready:
                heapq.heappush(free, worker)
                continue
        _, _, i = heapq.heappop(ready)
        chars = left[i].pop(0)
        if min_piece_chars is not None and heard[i] and pace.seconds_per_char > 0.0:
            fits = pace.chars_within(plays_until[i] - margin_s - worker, cost_factor)
            piece = min(max(fits, min_piece_chars), chars - min_piece_chars)
            if piece >= min_piece_chars and piece < chars:  # the lane cuts: a piece now
                left[i].insert(0, chars - piece)
                chars = piece
        done = worker + pace.call_seconds(chars, cost_factor)
        heapq.heappush(arrivals, (done, i, chars * rate[i]))
        heapq.heappush(free, done)
    return dry
