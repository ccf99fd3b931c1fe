"""A lone call (docs/architecture.md, "A lone call takes every worker"), driven through
the real scheduler: it holds every worker of its lane, so a newcomer waits for it, until
its backend says it goes on with one core (``SynthesisJob.narrowed``, Kokoro once its
first audio is out); then the newcomer starts at once on the freed worker."""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest
from msgspec.structs import replace

from engine.backends.base import BatchEmit, PcmChunk, SynthesisJob
from engine.ipc.schema import Capabilities
from tests.engine.scheduler.rig import MakeRig
from tests.engine.scheduler.test_flights import GatedTones, wait_until

FIRST = "Your account is ready for you now."
NEWCOMER = "Please hold the line."


class LoneTones(GatedTones):
    """The gated tones (test_flights.py: each job emits its first chunks, then waits for
    ``go``) as a two-worker lane whose lone calls take both cores (``lone_calls``, as
    Kokoro declares); a job given ``narrowed`` calls it after its first audio when
    ``narrows`` (as Kokoro does after its first piece). Records every job it was given."""

    independent_calls = True

    def __init__(self, *, narrows: bool) -> None:
        super().__init__(threads=2)
        self.narrows = narrows
        self.jobs: list[SynthesisJob] = []

    @property
    def capabilities(self) -> Capabilities:
        return replace(super().capabilities, lone_calls=True)

    def synthesize_batch(
        self, jobs: Sequence[SynthesisJob], emit: BatchEmit, words: object = None
    ) -> None:
        self.jobs.extend(jobs)
        told: set[int] = set()

        def emit_then_narrow(index: int, chunk: PcmChunk) -> bool:
            wanted = emit(index, chunk)
            narrowed = jobs[index].narrowed
            if self.narrows and narrowed is not None and index not in told:
                told.add(index)
                narrowed()
            return wanted

        super().synthesize_batch(jobs, emit_then_narrow, words)


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
        assert newcomer.narrowed is None and not backend.go.is_set()
    else:  # it waits for the lone call to end
        time.sleep(0.2)
        assert len(backend.jobs) == 1
    backend.go.set()
    first_bytes, _ = rig.say_result(0)
    newcomer_bytes, _ = rig.say_result(1)
    assert len(backend.jobs) == 2 and first_bytes and newcomer_bytes
