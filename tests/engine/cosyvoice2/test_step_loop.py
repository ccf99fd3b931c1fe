"""The step loop without a model: streams of later calls join at the next step, the
driver role passes on, and a failed step fails exactly the calls it held."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from engine.backends.cosyvoice2.step_loop import LoopStream, StepLoop


@dataclass(eq=False)
class Counting:
    name: str
    steps_left: int
    finished: bool = False
    stepped_with: list[set[str]] = field(default_factory=list)


class Recorder:
    def __init__(self, pause_s: float = 0.002, fail_on: str | None = None) -> None:
        self.pause_s = pause_s
        self.fail_on = fail_on
        # the threads that stepped (objects, not idents: a thread that ended may leave
        # its ident to the next one started, as the driver's did to the waiter's when
        # the short call was done before the waiter began, under a full test run's load)
        self.threads: set[threading.Thread] = set()

    def __call__(self, streams: Sequence[LoopStream]) -> None:
        self.threads.add(threading.current_thread())
        names = {s.name for s in streams if isinstance(s, Counting)}
        if self.fail_on in names:
            raise RuntimeError(f"step failed on {self.fail_on}")
        time.sleep(self.pause_s)
        for stream in streams:
            assert isinstance(stream, Counting)
            stream.stepped_with.append(names)
            stream.steps_left -= 1
            stream.finished = stream.steps_left == 0


def in_thread(
    loop: StepLoop, streams: list[Counting], errors: list[BaseException]
) -> threading.Thread:
    def run() -> None:
        try:
            loop.run(streams)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_later_call_joins_the_running_loop_at_the_next_step() -> None:
    loop = StepLoop(Recorder())
    long = Counting("long", 200)
    errors: list[BaseException] = []
    first = in_thread(loop, [long], errors)
    while len(long.stepped_with) < 5:
        time.sleep(0.001)
    short = Counting("short", 3)
    loop.run([short])  # returns when its own stream is done
    assert short.finished and not long.finished
    assert all(names == {"long", "short"} for names in short.stepped_with)
    first.join(10)
    assert long.finished and not errors
    assert loop.widest == 2


def test_the_driver_role_passes_to_a_waiting_call() -> None:
    recorder = Recorder()
    loop = StepLoop(recorder)
    short, long = Counting("short", 5), Counting("long", 60)
    errors: list[BaseException] = []
    driver = in_thread(loop, [short], errors)
    while not short.stepped_with:
        time.sleep(0.001)
    waiter = in_thread(loop, [long], errors)
    driver.join(10)
    waiter.join(10)
    assert short.finished and long.finished and not errors
    assert len(recorder.threads) == 2  # the second call drove once the first returned


def test_a_failed_step_fails_the_calls_it_held_and_the_loop_goes_on() -> None:
    loop = StepLoop(Recorder(fail_on="bad"))
    errors: list[BaseException] = []
    bad, neighbour = Counting("bad", 3), Counting("neighbour", 100)
    first = in_thread(loop, [neighbour], errors)
    with pytest.raises(RuntimeError, match="step failed on bad"):
        loop.run([bad])
    first.join(10)
    assert len(errors) == 1 and "bad" in str(errors[0])  # its neighbour in the step too
    later = Counting("later", 2)
    loop.run([later])
    assert later.finished
    assert loop.active_streams() == 0
