"""One synthesis per segment in flight (engine/scheduler/flights.py), driven through the
real scheduler with real rings and a real speech cache: streams asking for a segment
another stream's synthesis is producing join it (the same bytes and words, one
synthesis, the cache filled once); a joiner's cancel, the first caller's cancel, a
failure; a warm-up joined by a call and a warm-up waiting for a call's synthesis; never
across tenants, never for ``cache: false``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import pytest

from engine.backends.base import BackendError, BatchEmit, PcmChunk, SynthesisJob, VoiceSettings
from engine.backends.synthetic import SyntheticBackend
from engine.ipc.schema import Cancelled, UtteranceAudio, UtteranceEnd, UtteranceFailed
from engine.scheduler.cache_keys import key_maker
from engine.speech_cache import SHARED_SCOPE, tenant_scope
from tests.engine.scheduler.rig import GREETING, RATE, WAIT_S, MakeRig, Rig, level, warm

TEXT = "Welcome to Acme Bank."  # one segment
OPEN_CHUNKS = 5


class GatedTones(SyntheticBackend):
    """The synthetic tones as a batch lane of ``threads`` workers that emit their first
    :data:`OPEN_CHUNKS` chunks at once (more than the resampler holds back), then wait
    for ``go`` before the rest; counts the syntheses begun, and fails on texts with
    "FAIL" where it would go on."""

    max_batch = 1

    def __init__(self, threads: int = 2) -> None:
        super().__init__()
        self.threads = threads
        self.go = threading.Event()
        self.started = threading.Event()
        self.texts: list[str] = []

    def batch_key(self, voice: object) -> object:
        return "tones"

    def synthesize_batch(
        self, jobs: Sequence[SynthesisJob], emit: BatchEmit, words: object = None
    ) -> None:
        for index, job in enumerate(jobs):
            self.texts.append(job.text)
            emitted = 0

            def gated(chunk: PcmChunk, index: int = index, job: SynthesisJob = job) -> bool:
                nonlocal emitted
                if not self.before_chunk(job, emitted):
                    return False
                emitted += 1
                return emit(index, chunk)

            self.synthesize(job.text, job.voice, gated)

    def before_chunk(self, job: SynthesisJob, emitted: int) -> bool:
        """Called before each chunk of ``job`` (``emitted`` went before it): after the
        opening chunks, waits for ``go``; False stops the job."""
        if emitted == OPEN_CHUNKS:
            self.started.set()
            self.go.wait(WAIT_S)
            if "FAIL" in job.text:
                raise BackendError("model_crashed", "fell over")
        return True


def wait_until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def first_audio(rig: Rig, slot: int) -> UtteranceAudio:
    _, message = rig.events.wait_kind(UtteranceAudio, slot)
    assert isinstance(message, UtteranceAudio)
    return message


def test_callers_of_one_segment_in_flight_hear_one_synthesis(make_rig: MakeRig) -> None:
    """Five callers ask for the same new sentence while its synthesis is under way: one
    synthesis, five identical renderings with identical words, each starting at once
    with what was produced so far; the cache is filled once, and the lane counted one
    batch."""
    backend = GatedTones()
    rig = make_rig(backend)
    for slot in range(1, 6):
        rig.open(slot)
    rig.scheduler.speak(1, 1, TEXT, True)
    assert backend.started.wait(WAIT_S)
    for slot in range(2, 6):
        rig.scheduler.speak(slot, 1, TEXT, True)
    wait_until(lambda: all(rig.rings[s].write_pos > 0 for s in range(2, 6)), "joiners heard")
    lane = next(iter(rig.scheduler._lanes.values()))
    assert lane.in_flight == 1 and backend.texts == [TEXT]
    backend.go.set()
    heard = {}
    for slot in range(1, 6):
        pcm, audio = rig.say_result(slot)
        heard[slot] = (pcm, audio.cache)
    assert {pcm for pcm, _ in heard.values()} == {heard[1][0]} and len(heard[1][0]) > 0
    assert heard[1][1] == "miss" and all(heard[s][1] == "join" for s in range(2, 6))
    assert all(rig.word_events(s) == rig.word_events(1) for s in range(2, 6))
    assert backend.texts == [TEXT]  # one synthesis
    stats = rig.scheduler.stats
    assert stats.joined_segments == 4 and stats.joined_audio_s > 0
    rig.open(9)
    assert rig.say(9, TEXT)[1].cache == "hit"  # stored once, whole
    assert level(rig.cache, "memory")[0] == 1


def test_a_joiners_cancel_leaves_the_others_playing(make_rig: MakeRig) -> None:
    backend = GatedTones()
    rig = make_rig(backend)
    for slot in (1, 2, 3):
        rig.open(slot)
    rig.scheduler.speak(1, 1, TEXT, True)
    assert backend.started.wait(WAIT_S)
    rig.scheduler.speak(2, 1, TEXT, True)
    rig.scheduler.speak(3, 1, TEXT, True)
    wait_until(lambda: rig.rings[3].write_pos > 0, "joiner heard")
    rig.scheduler.cancel(2)
    rig.events.wait(lambda m: isinstance(m, Cancelled) and m.stream_id == 2)
    backend.go.set()
    one, _ = rig.say_result(1)
    three, _ = rig.say_result(3)
    assert one == three and len(one) > 0
    assert backend.texts == [TEXT]
    rig.scheduler.speak(2, 2, "Something else.", True)  # the cancelled stream goes on
    rig.events.wait_kind(UtteranceEnd, 2, utterance=2)


def test_the_first_callers_cancel_does_not_stop_the_synthesis_others_hear(
    make_rig: MakeRig,
) -> None:
    backend = GatedTones()
    rig = make_rig(backend)
    for slot in (1, 2):
        rig.open(slot)
    rig.scheduler.speak(1, 1, TEXT, True)
    assert backend.started.wait(WAIT_S)
    rig.scheduler.speak(2, 1, TEXT, True)
    wait_until(lambda: rig.rings[2].write_pos > 0, "joiner heard")
    rig.scheduler.cancel(1)
    rig.events.wait(lambda m: isinstance(m, Cancelled) and m.stream_id == 1)
    backend.go.set()
    two, audio = rig.say_result(2)
    assert audio.cache == "join" and len(two) == len(TEXT) * 960 // 2 * 2  # whole
    rig.open(3)
    assert rig.say(3, TEXT)[1].cache == "hit"  # and stored whole
    assert backend.texts == [TEXT]


def test_when_every_listener_leaves_the_synthesis_stops_and_is_not_stored(
    make_rig: MakeRig,
) -> None:
    backend = GatedTones()
    rig = make_rig(backend)
    for slot in (1, 2):
        rig.open(slot)
    rig.scheduler.speak(1, 1, TEXT, True)
    assert backend.started.wait(WAIT_S)
    rig.scheduler.speak(2, 1, TEXT, True)
    wait_until(lambda: rig.rings[2].write_pos > 0, "joiner heard")
    rig.scheduler.cancel(1)
    rig.scheduler.cancel(2)
    rig.events.wait(lambda m: isinstance(m, Cancelled) and m.stream_id == 2)
    backend.go.set()
    lane = next(iter(rig.scheduler._lanes.values()))
    wait_until(lambda: lane.in_flight == 0, "the worker stopped")
    rig.open(3)
    backend.go.set()
    assert rig.say(3, TEXT)[1].cache == "miss"  # nothing cut short was stored
    assert backend.texts == [TEXT, TEXT]


def test_a_failure_reaches_every_listener_as_the_same_error(make_rig: MakeRig) -> None:
    backend = GatedTones()
    rig = make_rig(backend)
    text = "Please FAIL now."
    for slot in (1, 2, 3):
        rig.open(slot)
    rig.scheduler.speak(1, 1, text, True)
    assert backend.started.wait(WAIT_S)
    rig.scheduler.speak(2, 1, text, True)
    rig.scheduler.speak(3, 1, text, True)
    wait_until(lambda: rig.rings[3].write_pos > 0, "joiners heard")
    backend.go.set()
    codes = set()
    for slot in (1, 2, 3):
        _, failed = rig.events.wait_kind(UtteranceFailed, slot)
        assert isinstance(failed, UtteranceFailed)
        codes.add((failed.code, failed.message))
    assert codes == {("model_crashed", "fell over")}
    assert backend.texts == [text]


def test_no_join_across_tenants_or_for_zero_retention(make_rig: MakeRig) -> None:
    backend = GatedTones(threads=3)
    rig = make_rig(backend)
    rig.open(1, tenant="acme")
    rig.open(2, tenant="other")  # another tenant: its own synthesis
    rig.open(3, tenant="acme", retain=False)  # cache: false: neither joins nor is joined
    rig.scheduler.speak(1, 1, TEXT, True)
    assert backend.started.wait(WAIT_S)
    rig.scheduler.speak(2, 1, TEXT, True)
    rig.scheduler.speak(3, 1, TEXT, True)
    wait_until(lambda: len(backend.texts) == 3, "three syntheses")
    backend.go.set()
    for slot in (1, 2, 3):
        assert rig.say_result(slot)[1].cache == "miss"
    assert rig.scheduler.stats.joined_segments == 0


def test_a_call_joins_a_warm_up_and_a_warm_up_waits_for_a_call(make_rig: MakeRig) -> None:
    backend = GatedTones(threads=2)
    rig = make_rig(backend)
    ended = warm(rig, TEXT)
    assert backend.started.wait(WAIT_S)  # the warm-up is synthesizing it
    rig.open(1)
    rig.scheduler.speak(1, 1, TEXT, True)
    wait_until(lambda: rig.rings[1].write_pos > 0, "the call heard the warm-up")
    backend.go.set()
    assert rig.say_result(1)[1].cache == "join"
    assert ended.wait(WAIT_S) and rig.outcomes[0].error is None
    assert backend.texts == [TEXT]
    # A call's synthesis first, then a warm-up of the same text: it waits for that one.
    backend.go.clear()
    backend.started.clear()
    other = "Thank you for holding."
    rig.open(2)
    rig.scheduler.speak(2, 1, other, True)
    assert backend.started.wait(WAIT_S)
    ended = warm(rig, other)
    time.sleep(0.2)
    assert not ended.is_set()
    backend.go.set()
    assert ended.wait(WAIT_S) and rig.outcomes[0].error is None
    assert backend.texts == [TEXT, other]


def test_a_declared_shared_prompt_in_flight_is_joined_by_every_tenant(make_rig: MakeRig) -> None:
    backend = GatedTones(threads=2)
    rig = make_rig(backend)
    routed = rig.backends.resolve_voice(VoiceSettings("en-us"))
    keys = key_maker(routed, routed.handle, None, RATE, scope=SHARED_SCOPE)
    assert keys is not None
    rig.cache.declare(keys.key(TEXT))  # the operator's prompt
    rig.open(1, tenant="acme")
    rig.open(2, tenant="other")
    rig.scheduler.speak(1, 1, TEXT, True)
    assert backend.started.wait(WAIT_S)
    rig.scheduler.speak(2, 1, TEXT, True)
    wait_until(lambda: rig.rings[2].write_pos > 0, "the other tenant joined")
    backend.go.set()
    assert [rig.say_result(s)[1].cache for s in (1, 2)] == ["miss", "join"]
    assert backend.texts == [TEXT]
    assert rig.cache.contains_local(keys.key(TEXT))
    own = key_maker(routed, routed.handle, None, RATE, scope=tenant_scope("acme"))
    assert own is not None and not rig.cache.contains_local(own.key(TEXT))


@pytest.mark.parametrize("callers", [30])
def test_a_burst_on_a_new_prompt_is_one_synthesis(make_rig: MakeRig, callers: int) -> None:
    """A new announcement goes live at peak: every caller asks for it within the same
    moment; its two segments are synthesized once each."""
    backend = GatedTones(threads=2)
    backend.go.set()
    rig = make_rig(backend)
    for slot in range(callers):
        rig.open(slot)
    for slot in range(callers):
        rig.scheduler.speak(slot, 1, GREETING, True)
    results = [rig.say_result(slot) for slot in range(callers)]
    assert len({pcm for pcm, _ in results}) == 1
    assert sorted(backend.texts) == sorted(set(backend.texts)) and len(backend.texts) == 2


class OneGatedWorker(GatedTones):
    """The gated tones as Piper's lane: one worker, new utterances admitted by capacity."""

    independent_calls = True

    def __init__(self) -> None:
        super().__init__(threads=1)


def test_a_joiner_whose_rest_is_personal_starts_only_when_its_rest_can_follow(
    make_rig: MakeRig,
) -> None:
    """The words before an amount are in flight for one caller when another caller's
    new sentence starts with them: its amount is its own work, so it does not join while
    the lane could not follow those words with its amount in time (here: the one worker
    is busy with the flight, and the lane has no pace yet). It waits, and starts from the
    cache once the words are stored; they were synthesized once. A caller of the same
    words with nothing personal after them still joins at once."""
    backend = OneGatedWorker()
    rig = make_rig(backend)
    for slot in (1, 2, 3):
        rig.open(slot)
    prefix = "Your current balance is"
    rig.scheduler.speak(1, 1, f"{prefix} $5.", True)
    assert backend.started.wait(WAIT_S)
    rig.scheduler.speak(2, 1, f"{prefix} $1,234.56.", True)
    rig.scheduler.speak(3, 1, prefix, True)
    wait_until(lambda: rig.rings[3].write_pos > 0, "the caller with nothing personal joined")
    time.sleep(0.2)  # (the coordinator has weighed the amount's caller many times by now)
    assert rig.rings[2].write_pos == 0 and not rig.events.of(2)
    backend.go.set()
    assert rig.say_result(3)[1].cache == "join"
    assert rig.say_result(1)[1].cache == "miss"
    pcm, audio = rig.say_result(2)
    assert audio.cache == "hit" and len(pcm) > 0  # the stored words, then its amount
    assert backend.texts.count(prefix) == 1
    assert rig.scheduler.stats.joined_segments == 1
