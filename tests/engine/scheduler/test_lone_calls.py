"""A lone call (docs/architecture.md, "A lone call takes every worker"), driven through
the real scheduler: it holds every worker of its lane, so a newcomer waits for it, until
its backend says it goes on with one core (``SynthesisJob.narrowed``, Kokoro once its
first audio is out); then the newcomer starts at once on the freed worker."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest
from msgspec.structs import replace

from engine.backends.base import BatchEmit, PcmChunk, SynthesisJob
from engine.backends.synthetic import SyntheticBackend
from engine.ipc.schema import Capabilities
from tests.engine.scheduler.rig import WAIT_S, MakeRig
from tests.engine.scheduler.test_flights import wait_until

FIRST = "Your account is ready for you now."
NEWCOMER = "Please hold the line."


class LoneTones(SyntheticBackend):
    """The tones as a two-worker lane whose lone calls take both cores (``lone_calls``,
    as Kokoro declares): the first job emits its first chunk, says it goes on with one
    core when ``narrows`` (as Kokoro does after its first piece), then waits for
    ``finish``; it records every job it was given, in order."""

    max_batch = 1
    threads = 2
    independent_calls = True

    def __init__(self, *, narrows: bool) -> None:
        super().__init__()
        self.narrows = narrows
        self.finish = threading.Event()
        self.jobs: list[SynthesisJob] = []

    @property
    def capabilities(self) -> Capabilities:
        return replace(super().capabilities, lone_calls=True)

    def batch_key(self, voice: object) -> object:
        return "tones"

    def synthesize_batch(
        self, jobs: Sequence[SynthesisJob], emit: BatchEmit, words: object = None
    ) -> None:
        for index, job in enumerate(jobs):
            self.jobs.append(job)
            emitted = 0

            def one(chunk: PcmChunk, index: int = index, job: SynthesisJob = job) -> bool:
                nonlocal emitted
                emitted += 1
                if emitted == 2 and job.text.startswith("Your"):
                    if self.narrows and job.narrowed is not None:
                        job.narrowed()
                    self.finish.wait(WAIT_S)
                return emit(index, chunk)

            self.synthesize(job.text, job.voice, one)


@pytest.mark.parametrize("narrows", [True, False])
def test_a_newcomer_starts_beside_a_lone_call_once_it_narrows(
    make_rig: MakeRig, narrows: bool
) -> None:
    backend = LoneTones(narrows=narrows)
    rig = make_rig(backend)
    rig.open(0)
    rig.open(1)
    rig.scheduler.speak(0, 1, FIRST, True)
    wait_until(lambda: len(backend.jobs) == 1, "the first call began")
    first = backend.jobs[0]
    assert first.alone is True and first.narrowed is not None  # it holds both workers
    rig.scheduler.speak(1, 1, NEWCOMER, True)
    if narrows:  # the freed worker takes the newcomer while the first call runs on
        wait_until(lambda: len(backend.jobs) == 2, "the newcomer began beside it")
        newcomer = backend.jobs[1]
        assert newcomer.text.startswith("Please") and newcomer.alone is False
        assert newcomer.narrowed is None and not backend.finish.is_set()
    else:  # it waits for the lone call to end
        time.sleep(0.2)
        assert len(backend.jobs) == 1
    backend.finish.set()
    first_bytes, _ = rig.say_result(0)
    newcomer_bytes, _ = rig.say_result(1)
    assert len(backend.jobs) == 2 and first_bytes and newcomer_bytes
