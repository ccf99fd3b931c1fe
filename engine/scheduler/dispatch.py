"""A batch lane's next batch: which ready streams it takes now (the coordinator hands it
to the lane's workers). The rules are the policy's (engine/scheduler/policy.py: ``room``,
``urgency``, ``choose``); this only puts them in their order."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine.backends.base import BatchSynthesizer
from engine.scheduler import policy
from engine.scheduler.state import Lane, Stream


@dataclass(frozen=True)
class Formed:
    """The streams of a lane's next batch, each marked busy (Policy.choose)."""

    streams: list[Stream]
    # every one a new utterance's first segment, nothing of its stream playing: its job
    # waits in arrival order for a core (engine/scheduler/cores.py)
    newcomer: bool


def next_batch(
    lane: Lane,
    batch: BatchSynthesizer,
    waiting: Sequence[Stream],
    rules: policy.Policy,
    joins: Callable[[Stream], bool],
    now: float,
) -> Formed | None:
    """The next batch of ``lane`` (its backend ``batch``) from ``waiting``'s ready streams,
    most urgent first, as far as the lane has room (``policy.room``); a ready stream whose
    next segment is in flight for another joins it instead (``joins``). Of new
    utterances, the one whose first segment most of them wait for goes first (its
    synthesis is one flight they all hear: a cold start's greeting before one caller's
    amount), then the earliest. None: nothing more now (no room, nothing ready, or only
    new utterances that do not fit yet)."""
    ready = [s for s in waiting if s.lane is lane and policy.ready(s) and not joins(s)]
    fresh = {id(s) for s in ready if policy.is_new(s)}  # before choose marks them busy
    room = policy.room(lane, playing_waits=len(fresh) < len(ready))
    if room == "none":
        return None
    candidates = [s for s in ready if room == "any" or (room == "newcomers") == (id(s) in fresh)]
    flights = {id(s): _flight_of(s) for s in candidates if id(s) in fresh}
    callers = Counter(flights.values())

    def order(stream: Stream) -> tuple[int, int, float]:
        """Policy.urgency, new utterances by how many callers wait for their first
        segment (one synthesis serves them all), then in arrival order."""
        tier, rank = rules.urgency(stream)
        flight = flights.get(id(stream))
        return tier, -callers[flight] if flight is not None else 0, rank

    candidates.sort(key=order)
    chosen = rules.choose(lane, batch, candidates, now)
    if not chosen:
        return None
    return Formed(chosen, lane.spare > 0 and all(id(s) in fresh for s in chosen))


def _flight_of(stream: Stream) -> object:
    """What other callers could join of ``stream``'s next segment: its speech-cache key
    (engine/scheduler/flights.py), or, not to be shared (no key, ``cache: false``), the
    stream alone."""
    head = stream.utterances[0]
    if head.keys is None or not head.retain:
        return id(stream)
    return head.keys.key(head.segments[0])
