"""A lane's cores given between pieces (engine/scheduler/cores.py), driven through the
real scheduler and rings: with both cores held by calls whose first audio is out and
whose audio lasts, a newcomer's first audio comes before either of them ends (one steps
aside at its checkpoint); a backend that never calls the checkpoint keeps its core, and
the newcomer waits for a call to end, as before."""

from __future__ import annotations

import threading
import time

import pytest
from msgspec.structs import replace

from engine.backends.base import SynthesisJob
from engine.ipc.schema import Capabilities
from tests.engine.scheduler.rig import WAIT_S, MakeRig
from tests.engine.scheduler.test_flights import OPEN_CHUNKS, GatedTones, first_audio, wait_until

RUNNING = ("Your account is ready for you now.", "Your card has been renewed today.")
NEWCOMER = "Please hold the line."
AUDIO_OUT_S = 20.0  # what a running call says it has out: plenty to step aside for
NEXT_PIECE_S = 0.2


class PiecedTones(GatedTones):
    """The synthetic tones as a two-worker lane whose leading segments come in pieces
    (``paced_leading``, as Kokoro declares): each job emits its first chunks, passes its
    ``checkpoint`` (when ``checkpoints``: the gate learns its audio in hand), emits up to
    :data:`OPEN_CHUNKS`, waits for ``between``, passes its checkpoint again, then waits
    for ``go`` before the rest."""

    def __init__(self, *, checkpoints: bool) -> None:
        super().__init__(threads=2)
        self.checkpoints = checkpoints
        self.between = threading.Event()

    @property
    def capabilities(self) -> Capabilities:
        return replace(super().capabilities, paced_leading=True)

    def before_chunk(self, job: SynthesisJob, emitted: int) -> bool:
        checkpoint = job.checkpoint if self.checkpoints else None
        if emitted == OPEN_CHUNKS:
            self.between.wait(WAIT_S)
        if (
            checkpoint is not None
            and emitted in (OPEN_CHUNKS - 2, OPEN_CHUNKS)
            and not checkpoint(AUDIO_OUT_S, NEXT_PIECE_S)
        ):
            return False
        if emitted == OPEN_CHUNKS:
            self.go.wait(WAIT_S)
        return True


@pytest.mark.parametrize("checkpoints", [True, False])
def test_a_newcomer_s_first_audio_comes_while_both_cores_run_long_calls(
    make_rig: MakeRig, checkpoints: bool
) -> None:
    backend = PiecedTones(checkpoints=checkpoints)
    rig = make_rig(backend)
    for slot in range(3):
        rig.open(slot)
    for slot, text in enumerate(RUNNING):
        rig.scheduler.speak(slot, 1, text, True)
    for slot in range(2):
        first_audio(rig, slot)  # both cores run a call whose first audio is out
    wait_until(lambda: len(backend.texts) == 2, "both calls began")
    gate = next(iter(rig.scheduler._lanes.values())).gate
    if checkpoints:  # (their first audio can be out before their first checkpoint)
        wait_until(gate.could_step_aside, "a running call told the gate its audio in hand")
    rig.scheduler.speak(2, 1, NEWCOMER, True)
    if checkpoints:  # their audio in hand is known: the newcomer waits on a spare worker
        wait_until(lambda: gate.waiting == (1, 1), "the newcomer waits for a core")
    else:  # nothing is known of their audio: it waits in the coordinator's queue
        time.sleep(0.2)
    backend.between.set()  # the running calls come to their checkpoints
    if checkpoints:  # a running call steps aside: the newcomer's first audio comes now
        first_audio(rig, 2)
        assert NEWCOMER in backend.texts and not backend.go.is_set()
    else:  # nothing gives up a core: it waits for a call to end
        time.sleep(0.3)
        assert NEWCOMER not in backend.texts
    backend.go.set()
    for slot in range(3):
        audio, _ = rig.say_result(slot)
        assert audio  # every call complete (the one that stepped aside resumed)
    assert sorted(backend.texts) == sorted([*RUNNING, NEWCOMER])
