"""The coordinator's two inbound channels (engine/scheduler/channels.py) and the locked
state other threads share with it (engine/scheduler/state.py)."""

from __future__ import annotations

import threading
import time

import pytest

from engine.scheduler.channels import Channel, Wakeup
from engine.scheduler.state import Generations, StatsCounter


@pytest.mark.realtime  # a wake-up within 2 s: runs alone (Makefile)
def test_a_put_on_either_channel_wakes_the_coordinator_and_each_drains_in_order() -> None:
    wakeup = Wakeup()
    commands: Channel[str] = Channel(wakeup)
    results: Channel[int] = Channel(wakeup)
    started = time.monotonic()
    wakeup.wait(0.05)  # nothing put: times out
    assert time.monotonic() - started >= 0.04
    threading.Timer(0.02, results.put, args=(7,)).start()
    started = time.monotonic()
    wakeup.wait(5.0)
    assert time.monotonic() - started < 2.0
    commands.put("open")
    commands.put("speak")
    assert list(commands.drain()) == ["open", "speak"]
    assert list(results.drain()) == [7]
    assert list(commands.drain()) == [] and list(results.drain()) == []


def test_generations_and_counters_read_from_other_threads() -> None:
    generations = Generations()
    assert generations.current(3) == 0

    def bump() -> None:
        for _ in range(500):
            generations.bump(3)

    bumpers = [threading.Thread(target=bump) for _ in range(2)]
    for thread in bumpers:
        thread.start()
    for thread in bumpers:
        thread.join()
    assert generations.current(3) == 1000
    counters = StatsCounter()
    counters.audio(160)
    counters.synthesized(2, 0.5)
    snapshot = counters.snapshot()
    counters.audio(160)
    assert (snapshot.audio_samples, snapshot.segments, snapshot.synth_seconds) == (160, 2, 0.5)
    assert counters.snapshot().audio_samples == 320  # a copy: later counts do not change it
