"""The lane's core gate (engine/scheduler/cores.py): who holds a core between pieces, on
real threads and a clock the test sets."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from engine.scheduler.cores import FIRST_RUN_SEED_S, MARGIN_S, CoreGate, Ticket

JOIN_S = 5.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def always() -> bool:
    return True


GATES: list[CoreGate] = []
WAITERS: list[Waiter] = []


def new_gate(clock: Clock) -> CoreGate:
    """Two cores on the test's clock, closed when the test ends."""
    gate = CoreGate(2, clock=clock)
    GATES.append(gate)
    return gate


@pytest.fixture(autouse=True)
def no_thread_left() -> Iterator[None]:
    """Every gate closed and every waiting thread ended when a test ends: a thread left
    polling its gate would run beside later tests of the same process (the heap tests
    count the objects a collection sees)."""
    yield
    for gate in GATES:
        gate.close()
    for waiter in WAITERS:
        waiter.thread.join(JOIN_S)
        assert not waiter.thread.is_alive()
    GATES.clear()
    WAITERS.clear()


class Waiter:
    """A call into the gate on its own thread (it may block), and what it returned."""

    def __init__(self, call: Callable[[], bool]) -> None:
        WAITERS.append(self)
        self.result: bool | None = None
        self.done = threading.Event()

        def run() -> None:
            self.result = call()
            self.done.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def returned(self) -> bool:
        assert self.done.wait(JOIN_S), "the call did not return"
        assert self.result is not None
        return self.result

    def blocked(self) -> bool:
        return not self.done.wait(0.15)


@pytest.fixture
def clock() -> Clock:
    return Clock()


def waits(gate: CoreGate, count: tuple[int, int]) -> None:
    """Until ``count`` jobs (of which newcomers) wait at the gate."""
    deadline = time.monotonic() + JOIN_S
    while gate.waiting != count:
        assert time.monotonic() < deadline, f"waiting {gate.waiting}, not {count}"
        time.sleep(0.002)


def full_gate(clock: Clock) -> tuple[CoreGate, Ticket, Ticket]:
    """Two cores, each held by a running job whose first audio is out."""
    gate = new_gate(clock)
    a, b = Ticket(), Ticket()
    assert gate.enter(a, always) and gate.enter(b, always)
    return gate, a, b


def test_a_job_enters_at_once_while_a_core_is_free(clock: Clock) -> None:
    gate = new_gate(clock)
    assert gate.enter(Ticket(), always)
    assert gate.enter(Ticket(), always)
    third = Waiter(lambda: gate.enter(Ticket(newcomer=True), always))
    assert third.blocked() and gate.waiting == (1, 1)


def test_a_running_job_with_audio_in_hand_gives_a_newcomer_its_core(clock: Clock) -> None:
    gate, a, b = full_gate(clock)
    newcomer = Ticket(newcomer=True)
    waiting = Waiter(lambda: gate.enter(newcomer, always))
    waits(gate, (1, 1))
    # a's next piece must begin within 3 s: a newcomer's first run (the seed) fits
    stepping = Waiter(lambda: gate.checkpoint(a, clock.now + 3.0, 0.4, always))
    assert waiting.returned() and newcomer.holding
    assert stepping.blocked() and not a.holding  # a waits for a core
    # the newcomer's first audio is out: a's deadline is the earlier, it gets the core back
    clock.now += 0.6
    aside = Waiter(lambda: gate.checkpoint(newcomer, clock.now + 3.0, 0.4, always))
    assert stepping.returned() and a.holding
    waits(gate, (1, 0))
    assert aside.blocked() and not newcomer.holding
    assert gate.first_run_s < FIRST_RUN_SEED_S  # 0.6 s measured against the 1 s seed
    gate.leave(b)
    assert aside.returned() and newcomer.holding


def test_a_job_without_audio_in_hand_keeps_its_core(clock: Clock) -> None:
    gate, a, _b = full_gate(clock)
    waiting = Waiter(lambda: gate.enter(Ticket(newcomer=True), always))
    waits(gate, (1, 1))
    # its next piece must begin before a newcomer's first run could end
    assert gate.checkpoint(a, clock.now + FIRST_RUN_SEED_S + MARGIN_S - 0.01, 0.4, always)
    assert a.holding and waiting.blocked()
    gate.close()
    assert waiting.returned() is False


def test_a_freed_core_is_the_coordinator_s_pick_before_a_waiting_newcomer(
    clock: Clock,
) -> None:
    """As the coordinator does it: a job ends; the coordinator hands its pick (a playing
    stream's next segment) to a worker, which takes the free core at once; only then are
    the cores left given to the newcomers waiting."""
    gate, a, b = full_gate(clock)
    waiting = Waiter(lambda: gate.enter(Ticket(newcomer=True), always))
    waits(gate, (1, 1))
    gate.leave(a)
    pick = Ticket()
    assert gate.take_free(pick)  # on the coordinator thread, as it submits the batch
    gate.admit()
    assert waiting.blocked() and gate.enter(pick, always)  # its worker: already holding
    gate.leave(b)
    gate.admit()  # what is left goes to the newcomer
    assert waiting.returned()


def test_no_newcomer_takes_a_core_while_a_playing_stream_waits_for_one(clock: Clock) -> None:
    gate, a, _b = full_gate(clock)
    waiting = Waiter(lambda: gate.enter(Ticket(newcomer=True), always))
    waits(gate, (1, 1))
    gate.playing_waits = True  # (policy.room: a playing stream is ready, no core free)
    assert gate.checkpoint(a, clock.now + 5.0, 0.3, always) and a.holding
    assert waiting.blocked()
    gate.playing_waits = False
    stepping = Waiter(lambda: gate.checkpoint(a, clock.now + 5.0, 0.3, always))
    assert waiting.returned() and stepping.blocked()
    gate.close()
    assert stepping.returned() is False


def test_the_earliest_deadline_among_jobs_that_stepped_aside_goes_first(clock: Clock) -> None:
    gate, a, b = full_gate(clock)
    first, second = Ticket(newcomer=True), Ticket(newcomer=True)
    entering = [Waiter(lambda t=t: gate.enter(t, always)) for t in (first, second)]  # type: ignore[misc]
    waits(gate, (2, 2))
    late = Waiter(lambda: gate.checkpoint(a, clock.now + 5.0, 0.3, always))
    early = Waiter(lambda: gate.checkpoint(b, clock.now + 3.0, 0.3, always))
    assert all(w.returned() for w in entering)  # both newcomers got a core
    assert late.blocked() and early.blocked()
    gate.leave(first)  # one core frees: the job due sooner takes it
    assert early.returned() and b.holding and not a.holding
    gate.leave(second)
    assert late.returned() and a.holding


def test_a_job_due_soon_goes_before_a_newcomer(clock: Clock) -> None:
    gate, a, b = full_gate(clock)
    newcomer = Ticket(newcomer=True)
    entering = Waiter(lambda: gate.enter(newcomer, always))
    waits(gate, (1, 1))
    stepping = Waiter(lambda: gate.checkpoint(a, clock.now + 2.0, 0.3, always))
    assert entering.returned() and stepping.blocked()
    # a's deadline draws near: a second newcomer must not take the next free core
    clock.now += 1.5
    later = Ticket(newcomer=True)
    second = Waiter(lambda: gate.enter(later, always))
    assert second.blocked()
    gate.leave(b)
    assert stepping.returned() and a.holding and second.blocked()
    gate.close()
    assert second.returned() is False


def test_a_job_that_is_no_longer_wanted_stops_waiting(clock: Clock) -> None:
    gate, a, _b = full_gate(clock)
    wanted = threading.Event()
    wanted.set()
    waiting = Waiter(lambda: gate.enter(Ticket(newcomer=True), wanted.is_set))
    waits(gate, (1, 1))
    wanted.clear()  # cancelled while it waited
    assert waiting.returned() is False and gate.waiting == (0, 0)
    gate.leave(a)
    assert gate.enter(Ticket(), always)  # the core it did not take is free


def test_a_lone_job_gives_back_its_second_core_when_it_narrows(clock: Clock) -> None:
    gate = new_gate(clock)
    lone = Ticket(cores=2, newcomer=True)
    assert gate.enter(lone, always)
    waiting = Waiter(lambda: gate.enter(Ticket(newcomer=True), always))
    waits(gate, (1, 1))
    clock.now += 0.2
    # holding both cores it never steps aside (and its first run, on both, is not taken
    # for a newcomer's on one)
    assert gate.checkpoint(lone, clock.now + 10.0, 0.3, always) and waiting.blocked()
    assert gate.first_run_s == FIRST_RUN_SEED_S
    gate.narrow(lone)
    gate.admit()
    assert waiting.returned() and lone.holding and lone.cores == 1


def test_waits_are_counted_apart_from_the_time_with_a_core(clock: Clock) -> None:
    gate, _a, b = full_gate(clock)
    newcomer = Ticket(newcomer=True)
    entering = Waiter(lambda: gate.enter(newcomer, always))
    waits(gate, (1, 1))
    clock.now += 0.5
    gate.leave(b)
    gate.admit()
    assert entering.returned()
    assert newcomer.waited_s == pytest.approx(0.5)


def test_room_for_a_newcomer_is_said_only_while_a_running_job_has_audio_in_hand(
    clock: Clock,
) -> None:
    gate, a, b = full_gate(clock)
    assert not gate.could_step_aside()  # no checkpoint yet: nothing known of their audio
    assert gate.checkpoint(a, clock.now + 0.5, 0.3, always)  # too little to give
    assert not gate.could_step_aside()
    assert gate.checkpoint(b, clock.now + 3.0, 0.3, always)
    assert gate.could_step_aside()
    clock.now += 2.5  # b's audio in hand is spent by now
    assert not gate.could_step_aside()
