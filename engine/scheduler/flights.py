"""One synthesis per segment in flight: the in-flight table and its listeners.

A segment a worker lane synthesizes for a stream (or a warm-up) is a :class:`Flight`,
keyed by its speech-cache key (so only streams of the same scope, voice, text, rate and
settings can meet in one; a tenant never joins another's, docs/speech-cache.md
"Tenants"). Another stream whose next segment has that key **joins** it instead of being
synthesized again: it gets at once what was produced so far, then the rest as it comes,
and the same words. The flight has a generation slot of its own (a negative number
:class:`FlightTable` hands out), so the worker stops only when nobody listens any more:
a joiner's cancel or barge-in leaves the others playing, and the first caller's cancel
does not stop the synthesis while others listen. A failure reaches every listener as
the same error. The work is counted once: one batch in the lane's capacity, the joiners
as streams waiting for a segment in flight. The cache is filled once, when the flight
ends complete. State of the coordinator thread only (workers read the generation).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.scheduler.output import RelativeWords
from engine.scheduler.state import Generations, Lane, Stream, Utterance
from engine.speech_cache import SegmentKey
from telephony.codecs.resample import StreamingResampler

if TYPE_CHECKING:
    from engine.scheduler.lanes import Segment
    from engine.scheduler.warm import WarmJob

#: Flights' generation slots: below the streams' (0 and up) and the warm-ups' (-1).
FIRST_FLIGHT_SLOT = -2


@dataclass(eq=False)
class Listener:
    """A stream hearing a flight: the utterance and segment it plays it as."""

    stream: Stream
    utterance: Utterance
    segment: Segment
    generation: int  # the stream's generation when it joined (a cancel changes it)
    joined: bool = False  # it came after the flight began (not the stream it began for)
    told: bool = False  # the backend's words were told to it

    def current(self) -> bool:
        """Still wanted: not cancelled, closed, failed or past this utterance."""
        stream = self.stream
        return (
            stream.generation == self.generation
            and bool(stream.utterances)
            and stream.utterances[0] is self.utterance
        )


@dataclass(eq=False)
class Flight:
    key: SegmentKey
    text: str
    lane: Lane
    slot: int  # its generation slot (bumped to stop the worker)
    generation: int
    resampler: StreamingResampler  # the voice's rate to the key's
    expected_end: float = 0.0  # monotonic, as the lane's pace predicts
    expected_audio_s: float = 0.0
    paced: bool = False  # its pieces keep pace once its first audio is out (Stream.busy_paced)
    pcm: bytearray = field(default_factory=bytearray)  # everything produced so far
    words: RelativeWords | None = None  # timed by the backend, once told
    listeners: list[Listener] = field(default_factory=list)
    warm: list[WarmJob] = field(default_factory=list)  # warm-ups waiting for it
    keep: bool = True  # every listener may keep it (engine/scheduler/retention.py)
    joins: int = 0  # listeners that joined after it began

    def live(self) -> list[Listener]:
        """Its current listeners (the others are dropped)."""
        self.listeners = [listener for listener in self.listeners if listener.current()]
        return self.listeners

    @property
    def wanted(self) -> bool:
        return bool(self.live()) or bool(self.warm)


class FlightTable:
    def __init__(self, generations: Generations) -> None:
        self._generations = generations
        self._flights: dict[str, Flight] = {}
        self._slots = itertools.count(FIRST_FLIGHT_SLOT, -1)

    def __len__(self) -> int:
        return len(self._flights)

    def get(self, key: SegmentKey) -> Flight | None:
        return self._flights.get(key.digest())

    def begin(
        self, key: SegmentKey, text: str, lane: Lane, resampler: StreamingResampler
    ) -> Flight:
        """A new flight of ``key`` (none may be in the table)."""
        digest = key.digest()
        assert digest not in self._flights
        slot = next(self._slots)
        flight = Flight(key, text, lane, slot, self._generations.current(slot), resampler)
        self._flights[digest] = flight
        return flight

    def end(self, flight: Flight) -> None:
        """``flight`` is over (its batch ended): out of the table."""
        if self._flights.get(flight.key.digest()) is flight:
            del self._flights[flight.key.digest()]

    def abandon(self, flight: Flight) -> None:
        """Nobody wants ``flight`` any more: its worker stops (it stays in the table until
        its batch ends, so that nobody joins a synthesis cut short)."""
        self._generations.bump(flight.slot)

    def joinable(self, key: SegmentKey) -> Flight | None:
        """The flight of ``key`` a stream may still join (not being stopped)."""
        flight = self._flights.get(key.digest())
        if flight is None or self._generations.current(flight.slot) != flight.generation:
            return None
        return flight
