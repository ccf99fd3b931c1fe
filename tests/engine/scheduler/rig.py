"""The scheduler driven directly, for the speech-cache and flight tests: real rings, a
real SpeechCache and the synthetic backend (tests/engine/scheduler/test_speech_cache.py,
test_flights.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engine.backends.base import (
    Backend,
    BackendError,
    BatchEmit,
    CacheIdentity,
    EmitFn,
    PcmChunk,
    SynthesisJob,
    VoiceSettings,
)
from engine.backends.routing import BackendSet
from engine.backends.synthetic import SyntheticBackend
from engine.ipc.ring import SpscRing
from engine.ipc.schema import (
    Message,
    UtteranceAudio,
    UtteranceEnd,
    UtteranceWords,
    WordTime,
)
from engine.ipc.shm import BOUNDARY_CAPACITY
from engine.scheduler import Scheduler
from engine.scheduler.cache_keys import key_maker, prompt_segments
from engine.scheduler.warm import WarmOutcome, WarmRequest
from engine.speech_cache import (
    SpeechCache,
    SpeechCacheSettings,
    open_speech_cache,
    tenant_scope,
)
from tests.engine.speech_cache.conftest import TEST_SECRET

WAIT_S = 10.0
RATE = 8000  # the ring's rate: the synthetic voices' 16 kHz resampled, per segment
GREETING = "Welcome to Acme Bank. Your call is important to us."


# --------------------------------------------------------------------------- helpers


class Events:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.log: list[tuple[float, object, Message]] = []

    def __call__(self, owner: object, message: Message) -> None:
        with self._cond:
            self.log.append((time.perf_counter(), owner, message))
            self._cond.notify_all()

    def of(self, stream_id: int) -> list[Message]:
        with self._cond:
            return [m for _, _, m in self.log if getattr(m, "stream_id", None) == stream_id]

    def wait(
        self, match: Callable[[Message], bool], timeout: float = WAIT_S
    ) -> tuple[float, Message]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for at, _, message in self.log:
                    if match(message):
                        return at, message
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out; events: {[m for _, _, m in self.log]}")
                self._cond.wait(left)

    def wait_kind(
        self, kind: type[Message], stream_id: int, utterance: int = 1
    ) -> tuple[float, Message]:
        return self.wait(
            lambda m: (
                isinstance(m, kind)
                and getattr(m, "stream_id", None) == stream_id
                and getattr(m, "utterance", None) == utterance
            )
        )


def ring_of(capacity: int) -> SpscRing:
    return SpscRing.create(bytearray(SpscRing.region_size(capacity)), capacity)


@dataclass
class Rig:
    scheduler: Scheduler
    backends: BackendSet
    events: Events
    cache: SpeechCache
    rings: dict[int, SpscRing] = field(default_factory=dict)
    outcomes: list[WarmOutcome] = field(default_factory=list)  # of warm jobs

    def open(
        self,
        slot: int,
        *,
        voice: str = "en-us",
        profile: bytes | None = None,
        rate: int = RATE,
        capacity: int = 1 << 20,
        tenant: str = "",
        retain: bool = True,
    ) -> SpscRing:
        ring = ring_of(capacity)
        self.rings[slot] = ring
        self.scheduler.open_stream(
            slot=slot,
            stream_id=slot,
            owner=f"owner-{slot}",
            ring=ring,
            boundaries=ring_of(BOUNDARY_CAPACITY),
            voice=self.backends.resolve_voice(VoiceSettings(voice, profile=profile)),
            sample_rate=rate,
            scope=tenant_scope(tenant),
            retain=retain,
        )
        return ring

    def say(
        self, slot: int, text: str, utterance: int = 1, retain: bool | None = None
    ) -> tuple[bytes, UtteranceAudio]:
        """Speak ``text`` on ``slot`` and read its ring to the end: (bytes, UtteranceAudio)."""
        self.scheduler.speak(slot, utterance, text, True, retain=retain)
        return self.say_result(slot, utterance)

    def say_result(self, slot: int, utterance: int = 1) -> tuple[bytes, UtteranceAudio]:
        """Read ``slot``'s ring until ``utterance`` has ended: (bytes, UtteranceAudio)."""
        ring = self.rings[slot]
        got = bytearray()
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            got += ring.read(ring.readable_bytes())
            for message in self.events.of(slot):
                if (
                    isinstance(message, UtteranceEnd)
                    and message.utterance == utterance
                    and ring.read_pos >= message.end_pos
                ):
                    audio = next(
                        m
                        for m in self.events.of(slot)
                        if isinstance(m, UtteranceAudio) and m.utterance == utterance
                    )
                    assert isinstance(audio, UtteranceAudio)
                    return bytes(got), audio
            time.sleep(0.002)
        raise AssertionError(
            f"utterance {utterance} of slot {slot} did not end: {self.events.of(slot)}"
        )

    def words(self, slot: int, utterance: int = 1) -> list[WordTime]:
        return [
            w
            for m in self.events.of(slot)
            if isinstance(m, UtteranceWords) and m.utterance == utterance
            for w in m.words
        ]

    def word_events(self, slot: int) -> list[tuple[tuple[WordTime, ...], str]]:
        return [(m.words, m.source) for m in self.events.of(slot) if isinstance(m, UtteranceWords)]


MakeRig = Callable[..., Rig]


def memory_cache() -> SpeechCache:
    return open_speech_cache(SpeechCacheSettings(shared="off"))


def directory_cache(directory: Path, timeout_ms: int = 50) -> SpeechCache:
    return open_speech_cache(
        SpeechCacheSettings(
            shared="directory", directory=str(directory), timeout_ms=timeout_ms,
            secret=TEST_SECRET,
        )
    )  # fmt: skip


def rigs() -> Iterator[MakeRig]:
    """Make rigs (the ``make_rig`` fixture); each is stopped and its cache closed after."""
    made: list[Rig] = []

    def make(
        backend: Backend | None = None,
        cache: SpeechCache | None = None,
        **options: object,
    ) -> Rig:
        backends = BackendSet([SyntheticBackend() if backend is None else backend])
        events = Events()
        cache = memory_cache() if cache is None else cache
        scheduler = Scheduler(
            backends,
            events,
            max_text_chars=5000,
            speech_cache=cache,
            **options,  # type: ignore[arg-type]
        )
        scheduler.start()
        rig = Rig(scheduler, backends, events, cache)
        made.append(rig)
        return rig

    yield make
    for rig in made:
        rig.scheduler.stop()
        rig.cache.close()


def level(cache: SpeechCache, name: str) -> tuple[int, int]:
    """(hits, misses) of a level, all backends together."""
    for stats in cache.stats().levels:
        if stats.level == name:
            return sum(stats.hits.values()), sum(stats.misses.values())
    raise AssertionError(f"no level {name}")


class BatchTones(SyntheticBackend):
    """The synthetic tones as a one-worker batch backend (a lane of workers, like Piper:
    the coordinator is free while it synthesizes)."""

    max_batch = 1
    threads = 1

    def batch_key(self, voice: object) -> object:
        return "tones"

    def synthesize_batch(
        self, jobs: Sequence[SynthesisJob], emit: BatchEmit, words: object = None
    ) -> None:
        for index, job in enumerate(jobs):

            def one(chunk: PcmChunk, index: int = index) -> bool:
                return emit(index, chunk)

            self.synthesize(job.text, job.voice, one)


class Uncached(SyntheticBackend):
    """A backend that declares no cache identity for its voices."""

    def cache_identity(self, voice: object) -> CacheIdentity | None:
        return None


class FailsOn(SyntheticBackend):
    """Fails on segments with "FAIL" in them."""

    def synthesize(self, text: str, voice: object, emit: EmitFn) -> None:
        if "FAIL" in text:
            raise BackendError("model_crashed", "fell over")
        super().synthesize(text, voice, emit)


def warm(
    rig: Rig, text: str, *, voice: str = "en-us", rate: int = RATE, scope: str | None = None
) -> threading.Event:
    """Start a warm job (in ``scope``, by default the anonymous tenant's, as the rig's
    streams); the returned event is set (with ``rig.outcome``) when it ends. Its keys are
    declared, as the engine's prompt service does."""
    routed = rig.backends.resolve_voice(VoiceSettings(voice))
    keys = key_maker(routed, routed.handle, None, rate, scope=scope or tenant_scope(""))
    assert keys is not None
    texts = tuple(prompt_segments(text, routed.language)[0])
    for t in texts:
        rig.cache.declare(keys.key(t))
    ended = threading.Event()
    outcomes = rig.outcomes = []

    def done(outcome: WarmOutcome) -> None:
        outcomes.append(outcome)
        ended.set()

    request = WarmRequest(1, "warm", routed, texts, tuple(keys.key(t) for t in texts), done)
    assert rig.scheduler.warm_prompt(request)
    return ended
