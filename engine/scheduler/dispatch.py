"""A batch lane's next batch: which ready streams it takes now (the coordinator hands it
to the lane's workers). The rules are the policy's (engine/scheduler/policy.py: ``room``,
``urgency``, ``choose``); this only puts them in their order."""

from __future__ import annotations

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
    next segment is in flight for another joins it instead (``joins``). None: nothing more
    now (no room, nothing ready, or only new utterances that do not fit yet)."""
    ready = [s for s in waiting if s.lane is lane and policy.ready(s) and not joins(s)]
    room = policy.room(lane, ready)
    if room == "none":
        return None
    candidates = [s for s in ready if room == "any" or (room == "newcomers") == policy.is_new(s)]
    fresh = {id(s) for s in candidates if policy.is_new(s)}  # before choose marks them busy
    candidates.sort(key=rules.urgency)
    chosen = rules.choose(lane, batch, candidates, now)
    if not chosen:
        return None
    return Formed(chosen, lane.spare > 0 and all(id(s) in fresh for s in chosen))
