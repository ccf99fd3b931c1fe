"""A batch lane's cores, handed out between a segment's pieces (thread-safe).

A worker runs one job at a time, but a lane may have more jobs in its workers than it
has cores: a backend that decodes a leading segment in pieces (Kokoro) calls its job's
``checkpoint`` before each piece after its first audio is out, and there the job may give
its core to a waiting one and wait itself, while the audio it has out plays. So a new
utterance's first piece need not wait for a whole segment of another call: the start of a
busy minute, when several callers' first prompts miss the cache at once, no longer waits
for two workers to run whole segments one after another.

Who holds a core (:class:`CoreGate`, pieces not interrupted):

- a core freed by a job's end goes to the jobs that stepped aside, the earliest deadline
  first; else it stays free for the coordinator, whose order (engine/scheduler/policy.py
  ``urgency``: a playing stream short of audio before a new utterance) picks the next
  job, which takes it as it is handed to a worker (:meth:`CoreGate.take_free`), and only
  what that leaves goes to waiting newcomers (:meth:`CoreGate.admit`);
- at a checkpoint, the next in line is a job that stepped aside whose audio would run out
  before a newcomer's first run (``urgent``), then newcomers (a leading segment, nothing
  of it out yet) in arrival order, then the jobs that stepped aside, the earliest
  deadline first.

A running job at a checkpoint gives its core to a newcomer when its audio lasts for the
newcomer's first run (measured on one core: grant to first checkpoint,
:attr:`first_run_s`) and its own next piece, with :data:`MARGIN_S` to spare, and no
playing stream waits for a core in the coordinator (``playing_waits``); to a job that
stepped aside when that job's deadline is earlier. A job's deadline is when its next
piece must begin: its audio out plays from its first emit (or later: a ring with audio
ahead, a held utterance), so the audio runs out no earlier than ``first emit + audio
out``; less the next piece's expected decode (its backend's measured pace) times
:data:`PIECE_SAFETY`, less the margin.

Jobs that never call ``checkpoint`` (Piper, a segment decoded whole) hold their core from
``enter`` to ``leave``. The coordinator lets jobs beyond the cores into a lane only for
newcomers (engine/scheduler/policy.py ``room``); everything else is dispatched when a
core is free, so it never waits here."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

MARGIN_S = 0.15  # what a job keeps in hand beyond the estimates when it steps aside
PIECE_SAFETY = 1.3  # on a next piece's expected decode
FIRST_RUN_SEED_S = 1.0  # a newcomer's first run until one was measured
SLOWER_WEIGHT, FASTER_WEIGHT = 0.5, 0.2  # a measured first run against the estimate
WAIT_POLL_S = 0.05  # a waiting job checks this often whether it is still wanted


@dataclass(eq=False)
class Ticket:
    """One job's place at the gate."""

    cores: int = 1
    newcomer: bool = False  # a new utterance's first segment, its first audio not out yet
    wide: bool = False  # began on more than one core (its first run says nothing of one)
    deadline: float = 0.0  # monotonic: when its next piece must begin (not a newcomer)
    next_s: float = 0.0  # that piece's expected decode
    granted_at: float = 0.0
    holding: bool = False
    waited_s: float = 0.0  # in all, at the gate
    order: int = field(default_factory=itertools.count().__next__)


class CoreGate:
    """``cores`` cores of one lane; see the module docstring."""

    def __init__(self, cores: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._free = max(1, cores)
        self._clock = clock
        self._changed = threading.Condition()
        self._waiting: list[Ticket] = []
        self._holding: set[Ticket] = set()
        self._closed = False
        self.first_run_s = FIRST_RUN_SEED_S
        # A playing stream waits for a core in the coordinator (policy.room): no running
        # job gives its core to a newcomer meanwhile.
        self.playing_waits = False

    def take_free(self, ticket: Ticket) -> bool:
        """``ticket`` takes free cores now if there are enough (the coordinator's pick, as
        it hands the job to a worker: the core is its, not a waiting newcomer's)."""
        with self._changed:
            if ticket.holding or self._free < ticket.cores:
                return ticket.holding
            self._grant(ticket)
            return True

    def enter(self, ticket: Ticket, wanted: Callable[[], bool]) -> bool:
        """Wait for ``ticket.cores`` cores (at once if it took them: :meth:`take_free`);
        False (holding none) when the job is no longer wanted or the gate closed
        meanwhile."""
        with self._changed:
            if ticket.holding:
                return True
            if self._free >= ticket.cores:
                self._grant(ticket)
                return True
            return self._wait(ticket, wanted)

    def checkpoint(
        self, ticket: Ticket, deadline: float, next_s: float, wanted: Callable[[], bool]
    ) -> bool:
        """``ticket``'s job is between pieces, its next to begin by ``deadline`` and to
        take ``next_s``: it goes on, or gives its core to a waiting job and waits for one
        (False: no longer wanted, or the gate closed; it then holds no core)."""
        with self._changed:
            now = self._clock()
            if ticket.newcomer:
                ticket.newcomer = False
                self._observe_first_run(ticket, now - ticket.granted_at)
            ticket.deadline, ticket.next_s = deadline, next_s
            best = self._next(now)
            if best is None or ticket.cores != 1 or not self._yields_to(ticket, best, now):
                return True
            self._release(ticket, to=best)
            return self._wait(ticket, wanted)

    def narrow(self, ticket: Ticket) -> None:
        """``ticket``'s job goes on with one core: the others go to waiting jobs."""
        with self._changed:
            if ticket.holding and ticket.cores > 1:
                self._free += ticket.cores - 1
                ticket.cores = 1
                self._hand_out()

    def leave(self, ticket: Ticket) -> None:
        """``ticket``'s job ended: its cores go to waiting jobs."""
        with self._changed:
            if ticket.newcomer and ticket.holding:
                self._observe_first_run(ticket, self._clock() - ticket.granted_at)
            if ticket.holding:
                self._release(ticket)
            elif ticket in self._waiting:
                self._waiting.remove(ticket)

    def admit(self) -> None:
        """Cores still free go to waiting newcomers, in arrival order (the coordinator
        calls this once it has dispatched what it had)."""
        with self._changed:
            self._grant_in_turn(sorted(self._newcomers(), key=lambda t: t.order))

    def close(self) -> None:
        """Every waiting job returns False (the lane stops)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    @property
    def closed(self) -> bool:
        with self._changed:
            return self._closed

    def could_step_aside(self) -> bool:
        """Whether a job holding a core had, at its last checkpoint, audio enough to give
        a newcomer its first run (the coordinator sends newcomers beyond the cores only
        then: on a machine whose decoder barely keeps ahead of real time no job ever
        has, and the newcomer waits in the coordinator's order as before)."""
        with self._changed:
            now = self._clock()
            return any(
                t.cores == 1 and not t.newcomer and t.deadline > 0.0
                and t.deadline - now >= self.first_run_s + MARGIN_S
                for t in self._holding
            )  # fmt: skip

    @property
    def waiting(self) -> tuple[int, int]:
        """(jobs waiting for a core, of which newcomers)."""
        with self._changed:
            return len(self._waiting), len(self._newcomers())

    # --- under the lock --------------------------------------------------------------

    def _wait(self, ticket: Ticket, wanted: Callable[[], bool]) -> bool:
        began = self._clock()
        self._waiting.append(ticket)
        self._hand_out()
        try:
            while not ticket.holding:
                if self._closed or not wanted():
                    self._waiting.remove(ticket)
                    self._hand_out()
                    return False
                self._changed.wait(WAIT_POLL_S)
            return True
        finally:
            ticket.waited_s += self._clock() - began

    def _grant(self, ticket: Ticket) -> None:
        self._free -= ticket.cores
        ticket.holding, ticket.granted_at = True, self._clock()
        ticket.wide = ticket.wide or ticket.cores > 1
        self._holding.add(ticket)

    def _release(self, ticket: Ticket, to: Ticket | None = None) -> None:
        """``ticket``'s cores are free: for ``to`` (a waiting job), else as
        :meth:`_hand_out` says."""
        self._free += ticket.cores
        ticket.holding = False
        self._holding.discard(ticket)
        if to is not None:
            self._grant_in_turn([to])
        self._hand_out()

    def _newcomers(self) -> list[Ticket]:
        return [t for t in self._waiting if t.newcomer]

    def _hand_out(self) -> None:
        """Free cores to the jobs that stepped aside, the earliest deadline first."""
        self._grant_in_turn(sorted(self._stepped(), key=lambda t: t.deadline))

    def _grant_in_turn(self, turn: list[Ticket]) -> None:
        """Free cores to the waiting jobs of ``turn``, in its order, while they fit."""
        granted = False
        for ticket in turn:
            if ticket.cores > self._free:
                break
            self._waiting.remove(ticket)
            self._grant(ticket)
            granted = True
        if granted:
            self._changed.notify_all()

    def _next(self, now: float) -> Ticket | None:
        """The waiting job that gets the next free core."""
        newcomers = self._newcomers()
        earliest = min(self._stepped(), key=lambda t: t.deadline, default=None)
        if earliest is not None and (
            not newcomers or earliest.deadline - now < self.first_run_s + MARGIN_S
        ):
            return earliest
        return min(newcomers, key=lambda t: t.order, default=None)

    def _stepped(self) -> list[Ticket]:
        """The waiting jobs that stepped aside (not newcomers)."""
        return [t for t in self._waiting if not t.newcomer]

    def _yields_to(self, running: Ticket, waiting: Ticket, now: float) -> bool:
        """Whether ``running``, at a checkpoint, gives its core to ``waiting``."""
        if waiting.newcomer:
            enough = running.deadline - now >= self.first_run_s + MARGIN_S
            return enough and not self.playing_waits
        return waiting.deadline < running.deadline

    def _observe_first_run(self, ticket: Ticket, seconds: float) -> None:
        if ticket.wide:
            return  # on both cores: faster than a newcomer's on one
        weight = SLOWER_WEIGHT if seconds > self.first_run_s else FASTER_WEIGHT
        self.first_run_s += weight * (seconds - self.first_run_s)
