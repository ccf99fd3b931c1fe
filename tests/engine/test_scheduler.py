"""Tests for engine.scheduler.Scheduler, driven directly (no server) with real rings."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pytest

from engine.backends.base import (
    Backend,
    BackendError,
    BatchEmit,
    EmitFn,
    PcmChunk,
    SynthesisJob,
    VoiceSettings,
)
from engine.backends.espeak import EspeakBackend
from engine.backends.routing import BackendSet
from engine.backends.synthetic import CHAR_MS, SyntheticBackend
from engine.ipc.boundaries import RECORD, BoundaryReader
from engine.ipc.ring import SpscRing
from engine.ipc.schema import (
    Cancelled,
    Message,
    StreamClosed,
    UtteranceAudio,
    UtteranceEnd,
    UtteranceFailed,
    UtteranceWords,
    VoiceInfo,
)
from engine.ipc.shm import BOUNDARY_CAPACITY
from engine.scheduler import RESERVE_FACTOR, RESERVE_FLOOR_S, START_TIMEOUT_S, Scheduler
from engine.text import SegmentSplitter

NATIVE_RATE = SyntheticBackend.native_sample_rate
SAMPLES_PER_CHAR = CHAR_MS * NATIVE_RATE // 1000  # 960
WAIT_S = 5.0

# --------------------------------------------------------------------------- helpers


@dataclass(frozen=True)
class Event:
    owner: object
    message: Message
    at: float


class EventLog:
    """Thread-safe sink for the scheduler's events (called on its worker thread)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._events: list[Event] = []
        self.words: list[UtteranceWords] = []  # kept apart: most tests follow the audio

    def __call__(self, owner: object, message: Message) -> None:
        with self._cond:
            if isinstance(message, UtteranceWords):
                self.words.append(message)
            else:
                self._events.append(Event(owner, message, time.perf_counter()))
            self._cond.notify_all()

    def events(self, stream_id: int | None = None) -> list[Event]:
        with self._cond:
            return [
                e
                for e in self._events
                if stream_id is None or getattr(e.message, "stream_id", None) == stream_id
            ]

    def messages(self, stream_id: int | None = None) -> list[Message]:
        return [e.message for e in self.events(stream_id)]

    def wait_for(self, predicate: Callable[[Message], bool], timeout: float = WAIT_S) -> Event:
        """The first event whose message satisfies ``predicate`` (waits for it)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for event in self._events:
                    if predicate(event.message):
                        return event
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out; events so far: {self._events}")
                self._cond.wait(left)

    def wait(
        self,
        kind: type[Message],
        stream_id: int,
        utterance: int | None = None,
        timeout: float = WAIT_S,
    ) -> Event:
        def match(message: Message) -> bool:
            return (
                isinstance(message, kind)
                and getattr(message, "stream_id", None) == stream_id
                and (utterance is None or getattr(message, "utterance", None) == utterance)
            )

        return self.wait_for(match, timeout)


def make_ring(capacity: int) -> SpscRing:
    return SpscRing.create(bytearray(SpscRing.region_size(capacity)), capacity)


def segments_for(pieces: Sequence[str]) -> list[str]:
    """The segments the scheduler synthesizes for an utterance fed as ``pieces``."""
    splitter = SegmentSplitter(language="und")  # the synthetic voices' language
    out: list[str] = []
    for piece in pieces:
        out += splitter.feed(piece)
    return out + splitter.flush()


def expected_pcm(pieces: Sequence[str], voice: str = "en-us") -> bytes:
    """What the synthetic backend produces for an utterance, at its native rate."""
    backend = SyntheticBackend()
    handle = backend.resolve_voice(VoiceSettings(voice))
    chunks: list[bytes] = []

    def emit(chunk: PcmChunk) -> bool:
        chunks.append(chunk.tobytes())
        return True

    for segment in segments_for(pieces):
        backend.synthesize(segment, handle, emit)
    return b"".join(chunks)


def drain(ring: SpscRing) -> bytes:
    return ring.read(ring.readable_bytes())


def consume(harness: Harness, slot: int, utterance: int) -> tuple[bytes, UtteranceEnd]:
    """Read ``slot``'s ring as the test's consumer until ``utterance`` has ended and all
    of its bytes were read; returns everything read and the UtteranceEnd."""
    ring = harness.rings[slot]
    received = bytearray()
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        received += ring.read(2048)
        for message in harness.events.messages():
            if (
                isinstance(message, UtteranceEnd)
                and message.utterance == utterance
                and message.stream_id == harness.stream_ids[slot]
                and ring.read_pos >= message.end_pos
            ):
                return bytes(received), message
        time.sleep(0.001)
    raise AssertionError(f"utterance {utterance} did not end: {harness.events.messages()}")


def dominant_frequency(pcm: bytes, rate: int) -> float:
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.fft.rfftfreq(len(samples), 1 / rate)[int(np.argmax(spectrum))])


@dataclass
class Harness:
    scheduler: Scheduler
    backend: Backend
    events: EventLog
    rings: dict[int, SpscRing] = field(default_factory=dict)
    boundaries: dict[int, SpscRing] = field(default_factory=dict)
    stream_ids: dict[int, int] = field(default_factory=dict)

    def records(self, slot: int) -> list[tuple[int, int]]:
        """Drain the boundary records published so far for ``slot``."""
        return BoundaryReader(self.boundaries[slot]).drain()

    def open(
        self,
        slot: int,
        *,
        stream_id: int | None = None,
        capacity: int = 1 << 20,
        sample_rate: int = NATIVE_RATE,
        voice: str = "en-us",
        speed: float = 1.0,
        boundary_capacity: int = BOUNDARY_CAPACITY,
    ) -> SpscRing:
        ring = make_ring(capacity)
        self.rings[slot] = ring
        self.boundaries[slot] = make_ring(boundary_capacity)
        self.stream_ids[slot] = slot + 100 if stream_id is None else stream_id
        self.scheduler.open_stream(
            slot=slot,
            stream_id=self.stream_ids[slot],
            owner=f"owner-{slot}",
            ring=ring,
            boundaries=self.boundaries[slot],
            voice=BackendSet([self.backend]).resolve_voice(VoiceSettings(voice, speed)),
            sample_rate=sample_rate,
        )
        return ring


MakeHarness = Callable[..., Harness]


@pytest.fixture
def make_harness() -> Iterator[MakeHarness]:
    """Build a started scheduler; every one is stopped when the test ends."""
    schedulers: list[Scheduler] = []

    def make(
        backend: Backend | None = None,
        *,
        max_text_chars: int = 5000,
        tap_directory: str | None = None,
        reserve_factor: float = RESERVE_FACTOR,
        reserve_floor_s: float = RESERVE_FLOOR_S,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> Harness:
        backend = SyntheticBackend() if backend is None else backend
        events = EventLog()
        scheduler = Scheduler(
            BackendSet([backend]),
            events,
            max_text_chars=max_text_chars,
            tap_directory=tap_directory,
            reserve_factor=reserve_factor,
            reserve_floor_s=reserve_floor_s,
            start_timeout_s=start_timeout_s,
        )
        schedulers.append(scheduler)
        scheduler.start()
        return Harness(scheduler, backend, events)

    yield make
    for scheduler in schedulers:
        scheduler.stop()
        assert not scheduler._thread.is_alive(), "scheduler thread did not stop"


@pytest.fixture
def harness(make_harness: MakeHarness) -> Harness:
    return make_harness()


@pytest.fixture
def slow_harness(make_harness: MakeHarness, monkeypatch: pytest.MonkeyPatch) -> Harness:
    """Synthetic backend that spends 20 ms of wall time per second of audio."""
    monkeypatch.setenv("ENGINE_SYNTHETIC_RTF", "0.02")
    backend = SyntheticBackend()
    assert backend.rtf == 0.02
    return make_harness(backend)


def long_text(sentences: int) -> str:
    return " ".join(f"This is sentence number {i} of a long prompt." for i in range(sentences))


# ------------------------------------------------------------------------ utterances


def test_utterance_audio_then_end(harness):
    ring = harness.open(0, stream_id=7)
    text = "Hello there. How are you?"
    harness.scheduler.speak(0, 1, text, True)
    end = harness.events.wait(UtteranceEnd, 7, 1).message
    assert isinstance(end, UtteranceEnd)

    chars = sum(len(s) for s in segments_for([text]))
    assert harness.events.messages(7) == [
        UtteranceAudio(stream_id=7, utterance=1, start_pos=0),
        UtteranceEnd(
            stream_id=7, utterance=1, start_pos=0, end_pos=end.end_pos, samples=end.samples
        ),
    ]
    assert end.samples == chars * SAMPLES_PER_CHAR
    assert end.end_pos - end.start_pos == 2 * end.samples
    assert ring.write_pos == end.end_pos
    assert ring.readable_bytes() == end.end_pos
    assert drain(ring) == expected_pcm([text])
    assert [e.owner for e in harness.events.events(7)] == ["owner-0", "owner-0"]


def test_each_segment_s_words_are_timed_from_the_utterance_start(harness):
    """A backend that cannot time words gets an estimate per segment: the segment's
    span shared out by word length, the spans back to back from 0 to the end."""
    harness.open(0, stream_id=7)
    harness.scheduler.speak(0, 1, "Hello there. How are you today?", True)
    end = harness.events.wait(UtteranceEnd, 7, 1).message
    assert isinstance(end, UtteranceEnd)
    words = [w for event in harness.events.words for w in event.words]
    assert [w.text for w in words] == ["Hello", "there.", "How", "are", "you", "today?"]
    assert {event.source for event in harness.events.words} == {"estimate"}
    assert words[0].start_ms == 0
    for before, after in itertools.pairwise(words):
        assert before.end_ms == after.start_ms and before.start_ms < before.end_ms
    total_ms = end.samples * 1000 / NATIVE_RATE
    assert abs(words[-1].end_ms - total_ms) <= 2


def test_stats_are_updated(harness):
    harness.open(0)
    harness.scheduler.speak(0, 1, "One. Two. Three.", True)
    end = harness.events.wait(UtteranceEnd, 100, 1).message
    assert isinstance(end, UtteranceEnd)
    stats = harness.scheduler.stats
    assert stats.segments == 3
    assert stats.audio_samples == end.samples
    assert stats.active_streams == 1


@pytest.mark.parametrize("rate", [8000, 22050, 24000, 48000])
def test_resampling(harness, rate):
    ring = harness.open(0, sample_rate=rate)
    text = "Hello world, this is a resampled prompt."
    harness.scheduler.speak(0, 1, text, True)
    end = harness.events.wait(UtteranceEnd, 100, 1).message
    assert isinstance(end, UtteranceEnd)

    duration_s = sum(len(s) for s in segments_for([text])) * CHAR_MS / 1000
    assert abs(end.samples - duration_s * rate) <= 2
    assert end.end_pos - end.start_pos == 2 * end.samples
    pcm = drain(ring)
    assert len(pcm) == 2 * end.samples
    assert abs(dominant_frequency(pcm, rate) - 220.0) < 3.0  # the en-us tone survives


def test_multiple_utterances_are_contiguous_and_in_order(harness):
    ring = harness.open(0)
    texts = ["First prompt.", "Second, longer prompt here.", "Third!"]
    for seq, text in enumerate(texts, start=1):
        harness.scheduler.speak(0, seq, text, True)
    harness.events.wait(UtteranceEnd, 100, 3)

    messages = harness.events.messages(100)
    assert [(type(m).__name__, getattr(m, "utterance", None)) for m in messages] == [
        ("UtteranceAudio", 1),
        ("UtteranceEnd", 1),
        ("UtteranceAudio", 2),
        ("UtteranceEnd", 2),
        ("UtteranceAudio", 3),
        ("UtteranceEnd", 3),
    ]
    ends = [m for m in messages if isinstance(m, UtteranceEnd)]
    audios = [m for m in messages if isinstance(m, UtteranceAudio)]
    assert ends[0].start_pos == 0
    for previous, following in itertools.pairwise(ends):
        assert following.start_pos == previous.end_pos
    for audio, end in zip(audios, ends, strict=True):
        assert audio.start_pos == end.start_pos
        assert end.end_pos - end.start_pos == 2 * end.samples
    assert drain(ring) == b"".join(expected_pcm([t]) for t in texts)
    # Every utterance end is also published in the slot's boundaries ring.
    assert harness.records(0) == [(e.utterance, e.end_pos) for e in ends]


def test_utterances_of_two_streams_go_to_their_own_rings(harness):
    ring_a = harness.open(0, voice="en-us")
    ring_b = harness.open(1, voice="zh")
    harness.scheduler.speak(0, 1, "Hello there.", True)
    harness.scheduler.speak(1, 1, "你好，欢迎致电。", True)
    harness.events.wait(UtteranceEnd, 100, 1)
    harness.events.wait(UtteranceEnd, 101, 1)
    assert drain(ring_a) == expected_pcm(["Hello there."], "en-us")
    assert drain(ring_b) == expected_pcm(["你好，欢迎致电。"], "zh")


def test_text_fed_in_pieces(harness):
    ring = harness.open(0)
    pieces = ["Hello there. How", " are you", "? Fine, thanks. Bye."]
    harness.scheduler.speak(0, 1, pieces[0], False)
    # The complete first sentence is spoken before the rest of the text arrives.
    harness.events.wait(UtteranceAudio, 100, 1)
    time.sleep(0.05)
    assert not any(isinstance(m, UtteranceEnd) for m in harness.events.messages(100))
    harness.scheduler.speak(0, 1, pieces[1], False)
    time.sleep(0.05)
    assert not any(isinstance(m, UtteranceEnd) for m in harness.events.messages(100))
    harness.scheduler.speak(0, 1, pieces[2], True)
    end = harness.events.wait(UtteranceEnd, 100, 1).message
    assert isinstance(end, UtteranceEnd)

    assert end.samples == sum(len(s) for s in segments_for(pieces)) * SAMPLES_PER_CHAR
    assert drain(ring) == expected_pcm(pieces)
    assert [type(m) for m in harness.events.messages(100)] == [UtteranceAudio, UtteranceEnd]


@pytest.mark.parametrize("text", ["", "  ", "...", "!!! ???", "★★ ~~ **", "。。。", "😀"])
def test_empty_utterance_on_fresh_stream(harness, text):
    ring = harness.open(0)
    harness.scheduler.speak(0, 1, text, True)
    end = harness.events.wait(UtteranceEnd, 100, 1).message
    assert end == UtteranceEnd(stream_id=100, utterance=1, start_pos=0, end_pos=0, samples=0)
    assert harness.events.messages(100) == [end]
    assert ring.write_pos == 0
    assert harness.records(0) == []


def test_empty_utterance_between_others(harness):
    ring = harness.open(0)
    harness.scheduler.speak(0, 1, "Hello.", True)
    harness.scheduler.speak(0, 2, "...", True)
    harness.scheduler.speak(0, 3, "Bye.", True)
    harness.events.wait(UtteranceEnd, 100, 3)

    first, empty, last = (m for m in harness.events.messages(100) if isinstance(m, UtteranceEnd))
    assert empty == UtteranceEnd(
        stream_id=100, utterance=2, start_pos=first.end_pos, end_pos=first.end_pos, samples=0
    )
    assert last.start_pos == first.end_pos
    assert not any(
        isinstance(m, UtteranceAudio) and m.utterance == 2 for m in harness.events.messages(100)
    )
    assert ring.write_pos == last.end_pos
    # No boundary record for the utterance without audio.
    assert harness.records(0) == [(1, first.end_pos), (3, last.end_pos)]


@pytest.mark.realtime  # ends within 0.2 s: runs alone (Makefile)
def test_empty_utterance_behind_another_ends_promptly(harness):
    harness.open(0)
    harness.scheduler.speak(0, 1, "Hello.", True)
    harness.scheduler.speak(0, 2, "...", True)
    first = harness.events.wait(UtteranceEnd, 100, 1)
    empty = harness.events.wait(UtteranceEnd, 100, 2)
    assert empty.at - first.at < 0.2


def test_speak_to_unknown_slot_is_ignored(harness):
    ring = harness.open(0)
    harness.scheduler.speak(5, 1, "Nobody listens.", True)
    harness.scheduler.speak(0, 1, "Hello.", True)
    harness.events.wait(UtteranceEnd, 100, 1)
    assert all(getattr(m, "stream_id", None) == 100 for m in harness.events.messages())
    assert ring.write_pos > 0


# ---------------------------------------------------------------------- back-pressure


def test_full_ring_is_never_overwritten(harness):
    capacity = 4096
    ring = harness.open(0, capacity=capacity)
    text = "One two three. Four five six. Seven eight nine."
    harness.scheduler.speak(0, 1, text, True)
    harness.events.wait(UtteranceAudio, 100, 1)

    deadline = time.monotonic() + WAIT_S
    while ring.write_pos < capacity and time.monotonic() < deadline:
        time.sleep(0.002)
    time.sleep(0.05)  # give the worker time to (wrongly) write more
    assert ring.write_pos == capacity
    assert ring.readable_bytes() == capacity
    assert not any(isinstance(m, UtteranceEnd) for m in harness.events.messages(100))

    # Consume slowly; everything arrives, in order, exactly once.
    received = bytearray()
    end: UtteranceEnd | None = None
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        readable = ring.readable_bytes()
        assert 0 <= readable <= capacity
        received += ring.read(1500)
        if end is None:
            ends = [m for m in harness.events.messages(100) if isinstance(m, UtteranceEnd)]
            end = ends[0] if ends else None
        if end is not None and ring.read_pos == end.end_pos:
            break
        time.sleep(0.001)
    assert end is not None, "utterance did not end"
    assert bytes(received) == expected_pcm([text])
    assert len(received) == 2 * end.samples == end.end_pos
    assert ring.write_pos == end.end_pos


def test_back_pressure_across_utterances(harness):
    capacity = 4096
    ring = harness.open(0, capacity=capacity, sample_rate=8000)
    texts = ["Good morning.", "Please hold, an agent will be with you shortly.", "Bye."]
    for seq, text in enumerate(texts, start=1):
        harness.scheduler.speak(0, seq, text, True)

    received = bytearray()
    records: list[tuple[int, int]] = []
    snapshots: list[tuple[int, int]] = []  # (write_pos, boundary records known)
    deadline = time.monotonic() + WAIT_S
    last: UtteranceEnd | None = None
    while time.monotonic() < deadline:
        # Consumer rule (engine.ipc.boundaries): load write_pos first, then the records.
        write_pos = ring.write_pos
        records += harness.records(0)
        snapshots.append((write_pos, len(records)))
        received += ring.read(700)
        ends = [m for m in harness.events.messages(100) if isinstance(m, UtteranceEnd)]
        if len(ends) == 3 and ring.read_pos == ends[-1].end_pos:
            last = ends[-1]
            break
        time.sleep(0.001)
    assert last is not None
    ends = [m for m in harness.events.messages(100) if isinstance(m, UtteranceEnd)]
    assert [e.utterance for e in ends] == [1, 2, 3]
    assert sum(2 * e.samples for e in ends) == len(received) == last.end_pos
    for previous, following in itertools.pairwise(ends):
        assert following.start_pos == previous.end_pos
    records += harness.records(0)
    assert records == [(e.utterance, e.end_pos) for e in ends]
    # Whenever bytes past an utterance's end were visible, its record was visible too.
    for write_pos, known in snapshots:
        assert sum(1 for e in ends if e.end_pos < write_pos) <= known


def test_stalled_consumer_does_not_block_other_streams(harness):
    stalled = harness.open(0, capacity=4096)
    ring = harness.open(1)
    harness.scheduler.speak(0, 1, long_text(3), True)
    harness.events.wait(UtteranceAudio, 100, 1)
    harness.scheduler.speak(1, 1, "Still working.", True)
    harness.events.wait(UtteranceEnd, 101, 1)
    assert drain(ring) == expected_pcm(["Still working."])
    assert stalled.write_pos == 4096
    assert not any(isinstance(m, UtteranceEnd) for m in harness.events.messages(100))


# ------------------------------------------------------------------------- boundaries


def test_pending_boundary_blocks_later_audio(harness):
    # One record fits: utterance 2's record waits, and with it utterance 3's audio.
    ring = harness.open(0, boundary_capacity=RECORD.size)
    for seq, text in enumerate(["One.", "Two.", "Three."], start=1):
        harness.scheduler.speak(0, seq, text, True)
    end2 = harness.events.wait(UtteranceEnd, 100, 2).message
    assert isinstance(end2, UtteranceEnd)
    time.sleep(0.1)
    assert ring.write_pos == end2.end_pos
    assert len(harness.records(0)) == 1  # utterance 1's; frees the slot for record 2
    harness.events.wait(UtteranceAudio, 100, 3)
    assert harness.records(0) == [(2, end2.end_pos)]
    end3 = harness.events.wait(UtteranceEnd, 100, 3).message
    assert isinstance(end3, UtteranceEnd)
    assert end3.start_pos == end2.end_pos
    assert drain(ring) == b"".join(expected_pcm([t]) for t in ["One.", "Two.", "Three."])


@pytest.mark.realtime  # starts within 0.2 s: runs alone (Makefile)
def test_next_utterance_starts_promptly_once_boundaries_ring_is_drained(harness):
    harness.open(0, boundary_capacity=RECORD.size)
    for seq, text in enumerate(["One.", "Two.", "Three."], start=1):
        harness.scheduler.speak(0, seq, text, True)
    harness.events.wait(UtteranceEnd, 100, 2)
    time.sleep(0.05)  # the worker is now idle, waiting for ring space
    drained_at = time.perf_counter()
    assert len(harness.records(0)) == 1
    started = harness.events.wait(UtteranceAudio, 100, 3)
    assert started.at - drained_at < 0.2


# --------------------------------------------------------------------------- fairness


@pytest.mark.realtime  # first audio within 0.5 s: runs alone (Makefile)
def test_short_prompt_is_not_starved_by_long_text(slow_harness):
    harness = slow_harness
    harness.open(0, capacity=1 << 21)
    harness.open(1)
    harness.scheduler.speak(0, 1, long_text(15), True)
    harness.events.wait(UtteranceAudio, 100, 1)
    spoke_at = time.perf_counter()
    harness.scheduler.speak(1, 1, "Hi there.", True)

    long_end = harness.events.wait(UtteranceEnd, 100, 1, timeout=10)
    short_audio = harness.events.wait(UtteranceAudio, 101, 1)
    short_end = harness.events.wait(UtteranceEnd, 101, 1)
    assert short_audio.at < long_end.at
    assert short_end.at < long_end.at
    # The short prompt waited for about one segment of the long text, not for all 15.
    segment_s = 0.02 * len("This is sentence number 10 of a long prompt.") * CHAR_MS / 1000
    assert short_audio.at - spoke_at < 0.5
    assert long_end.at - short_end.at > 5 * segment_s


def test_a_cancelled_utterance_ends_after_its_segment_and_the_next_follows(slow_harness):
    harness = slow_harness
    harness.open(0, capacity=1 << 22)
    harness.scheduler.speak(0, 1, long_text(15), True)
    harness.scheduler.speak(0, 2, "Hi there.", True)
    harness.events.wait(UtteranceAudio, 100, 1)
    harness.scheduler.cancel_utterance(0, 1)
    harness.scheduler.speak(0, 1, " More text for it.", False)  # ignored: it was cancelled
    cut = harness.events.wait(UtteranceEnd, 100, 1).message
    nxt = harness.events.wait(UtteranceEnd, 100, 2).message
    assert isinstance(cut, UtteranceEnd) and isinstance(nxt, UtteranceEnd)
    full_chars = sum(len(s) for s in segments_for([long_text(15)]))
    assert cut.samples < full_chars * SAMPLES_PER_CHAR / 4  # a segment or two, not 15
    assert nxt.start_pos == cut.end_pos  # the next one follows at once
    assert [m for m in harness.events.messages(100) if isinstance(m, UtteranceEnd)] == [
        cut,
        nxt,
    ]  # and the later text made no new utterance


@pytest.mark.realtime  # starts and ends within 0.2 s of each other: runs alone
def test_streams_take_turns_per_segment(slow_harness):
    harness = slow_harness
    harness.open(0, capacity=1 << 21)
    harness.open(1, capacity=1 << 21)
    harness.scheduler.speak(0, 1, long_text(6), True)
    harness.scheduler.speak(1, 1, long_text(6), True)
    end_a = harness.events.wait(UtteranceEnd, 100, 1)
    end_b = harness.events.wait(UtteranceEnd, 101, 1)
    audio_a = harness.events.wait(UtteranceAudio, 100, 1)
    audio_b = harness.events.wait(UtteranceAudio, 101, 1)
    # Both start within the first round and finish within one segment of each other.
    assert abs(audio_a.at - audio_b.at) < 0.2
    assert abs(end_a.at - end_b.at) < 0.2


@pytest.mark.parametrize("reserve_s", [0.0, 1000.0])
def test_a_playing_stream_below_its_reserve_goes_before_new_utterances(
    make_harness: MakeHarness, monkeypatch: pytest.MonkeyPatch, reserve_s: float
) -> None:
    """Saturated, the engine keeps audio a caller already hears going (the reserve) and
    lets new utterances wait; a stream that is far enough ahead waits for them."""
    monkeypatch.setenv("ENGINE_SYNTHETIC_RTF", "0.02")
    harness = make_harness(SyntheticBackend(), reserve_factor=0.0, reserve_floor_s=reserve_s)
    harness.open(0, capacity=1 << 22)
    harness.open(1)
    harness.scheduler.speak(0, 1, long_text(12), True)
    harness.events.wait(UtteranceAudio, 100, 1)
    harness.scheduler.speak(1, 1, "Hi there.", True)
    long_end = harness.events.wait(UtteranceEnd, 100, 1, timeout=10)
    short_audio = harness.events.wait(UtteranceAudio, 101, 1)
    if reserve_s:  # every second of the long text's audio is short of the reserve
        assert short_audio.at > long_end.at
    else:
        assert short_audio.at < long_end.at


@pytest.mark.realtime
def test_a_new_utterance_the_engine_cannot_start_in_time_fails_with_queue_timeout(
    make_harness: MakeHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Saturated for longer than the start deadline (a playing stream is always short of
    its reserve here), a new utterance fails with ``queue_timeout`` instead of starting
    whenever the engine gets to it; the playing stream is untouched; a prompt queued
    behind its own call's earlier one waits far longer than the deadline and still plays
    (its clock starts when it could start: once the earlier one is done and heard)."""
    monkeypatch.setenv("ENGINE_SYNTHETIC_RTF", "0.02")
    harness = make_harness(
        SyntheticBackend(), reserve_factor=0.0, reserve_floor_s=1000.0, start_timeout_s=0.2
    )
    ring = harness.open(0, capacity=1 << 24)
    harness.open(1)
    listening = threading.Event()

    def listen() -> None:  # stream 0's caller hears everything at once: its ring empties
        while not listening.is_set():
            ring.read(1 << 16)
            time.sleep(0.002)

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    try:
        text = long_text(40)
        queued_at = time.perf_counter()
        harness.scheduler.speak(0, 1, text, True)
        harness.scheduler.speak(0, 2, "Then this.", True)
        harness.events.wait(UtteranceAudio, 100, 1)
        spoke_at = time.perf_counter()
        harness.scheduler.speak(1, 1, "Hi there.", True)

        failed = harness.events.wait(UtteranceFailed, 101, 1, timeout=5)
        long_end = harness.events.wait(UtteranceEnd, 100, 1, timeout=20)
        behind = harness.events.wait(UtteranceAudio, 100, 2, timeout=5)
        harness.events.wait(UtteranceEnd, 100, 2, timeout=5)
    finally:
        listening.set()
        listener.join()
    assert isinstance(failed.message, UtteranceFailed)
    assert failed.message.code == "queue_timeout"
    assert (failed.message.start_pos, failed.message.end_pos) == (None, None)
    assert 0.2 <= failed.at - spoke_at < 1.0
    assert failed.at < long_end.at  # it did not wait for the long text
    end = long_end.message
    assert isinstance(end, UtteranceEnd)
    assert end.samples == sum(len(s) for s in segments_for([text])) * SAMPLES_PER_CHAR
    assert behind.at - queued_at > 1.0  # five times the deadline behind its own call
    assert not [m for m in harness.events.messages(100) if isinstance(m, UtteranceFailed)]


# ----------------------------------------------------------------------------- cancel


def test_cancel_while_synthesizing(slow_harness):
    harness = slow_harness
    ring = harness.open(0, capacity=1 << 21)
    harness.scheduler.speak(0, 1, long_text(20), True)
    harness.events.wait(UtteranceAudio, 100, 1)
    harness.scheduler.cancel(0)
    cancelled = harness.events.wait(Cancelled, 100).message
    assert isinstance(cancelled, Cancelled)
    assert cancelled.write_pos == ring.write_pos
    assert cancelled.write_pos > 0

    time.sleep(0.15)
    assert ring.write_pos == cancelled.write_pos, "written after Cancelled"
    kinds = [type(m) for m in harness.events.messages(100)]
    assert kinds == [UtteranceAudio, Cancelled]

    # The stream is usable again; new audio starts where the cancelled audio ended.
    harness.scheduler.speak(0, 2, "Next.", True)
    end = harness.events.wait(UtteranceEnd, 100, 2).message
    assert isinstance(end, UtteranceEnd)
    assert end.start_pos == cancelled.write_pos
    ring.discard_until(cancelled.write_pos)
    assert drain(ring) == expected_pcm(["Next."])
    assert harness.records(0) == [(2, end.end_pos)]  # none for the cancelled utterance


def test_cancel_drops_audio_waiting_for_ring_space(harness):
    ring = harness.open(0, capacity=4096)
    harness.scheduler.speak(0, 1, long_text(2), True)
    harness.scheduler.speak(0, 2, "Queued too.", True)
    deadline = time.monotonic() + WAIT_S
    while ring.write_pos < 4096 and time.monotonic() < deadline:
        time.sleep(0.002)
    harness.scheduler.cancel(0)
    cancelled = harness.events.wait(Cancelled, 100).message
    assert cancelled == Cancelled(stream_id=100, write_pos=4096)

    assert len(drain(ring)) == 4096
    time.sleep(0.1)  # the pending backlog must not be flushed into the freed space
    assert ring.write_pos == 4096
    assert ring.readable_bytes() == 0
    assert not any(isinstance(m, UtteranceEnd) for m in harness.events.messages(100))

    harness.scheduler.speak(0, 3, "After.", True)
    received, end = consume(harness, 0, 3)
    assert end.start_pos == 4096
    assert received == expected_pcm(["After."])


def test_cancel_idle_stream(harness):
    ring = harness.open(0)
    harness.scheduler.speak(0, 1, "Hello.", True)
    end = harness.events.wait(UtteranceEnd, 100, 1).message
    assert isinstance(end, UtteranceEnd)
    harness.scheduler.cancel(0)
    cancelled = harness.events.wait(Cancelled, 100).message
    assert cancelled == Cancelled(stream_id=100, write_pos=end.end_pos)
    assert ring.write_pos == end.end_pos


def test_cancel_only_affects_its_stream(slow_harness):
    harness = slow_harness
    harness.open(0, capacity=1 << 21)
    ring_b = harness.open(1, capacity=1 << 21)
    harness.scheduler.speak(0, 1, long_text(4), True)
    harness.scheduler.speak(1, 1, long_text(2), True)
    harness.events.wait(UtteranceAudio, 100, 1)
    harness.scheduler.cancel(0)
    harness.events.wait(Cancelled, 100)
    end_b = harness.events.wait(UtteranceEnd, 101, 1).message
    assert isinstance(end_b, UtteranceEnd)
    assert drain(ring_b) == expected_pcm([long_text(2)])
    assert not any(isinstance(m, Cancelled) for m in harness.events.messages(101))


class StreamingBatchBackend(SyntheticBackend):
    """A batch backend that streams each segment out over many emits (an autoregressive
    model's chunks), so a cancel arrives while its batch still runs."""

    max_batch = 4
    threads = 1

    def batch_key(self, voice: object) -> object:
        return "one"

    def synthesize_batch(self, jobs: Sequence[SynthesisJob], emit: BatchEmit) -> None:
        wanted = [True] * len(jobs)
        for _ in range(40):
            time.sleep(0.01)
            for index in range(len(jobs)):
                if wanted[index]:
                    wanted[index] = emit(index, np.full(320, 1000, dtype=np.int16))
            if not any(wanted):
                return


def test_a_stream_cancelled_while_its_batch_streams_speaks_again(make_harness):
    harness = make_harness(StreamingBatchBackend())
    harness.open(0, stream_id=5, capacity=1 << 21)
    harness.scheduler.speak(0, 1, "A long opening prompt.", True)
    harness.events.wait(UtteranceAudio, 5, 1)
    harness.scheduler.cancel(0)
    harness.events.wait(Cancelled, 5)
    harness.scheduler.speak(0, 2, "Next.", True)
    end = harness.events.wait(UtteranceEnd, 5, 2).message
    assert isinstance(end, UtteranceEnd)


# ------------------------------------------------------------------------------ close


def test_close_stream(harness):
    ring = harness.open(3, stream_id=9)
    harness.scheduler.speak(3, 1, "Hello.", True)
    harness.events.wait(UtteranceEnd, 9, 1)
    harness.scheduler.close_stream(3)
    closed = harness.events.wait(StreamClosed, 9)
    assert closed.message == StreamClosed(stream_id=9, slot=3)
    assert closed.owner == "owner-3"
    assert harness.scheduler.stats.active_streams == 0

    position = ring.write_pos
    harness.scheduler.speak(3, 2, "Too late.", True)
    time.sleep(0.05)
    assert ring.write_pos == position
    assert [type(m) for m in harness.events.messages(9)] == [
        UtteranceAudio,
        UtteranceEnd,
        StreamClosed,
    ]


def test_close_while_synthesizing_stops_writing(slow_harness):
    harness = slow_harness
    ring = harness.open(0, capacity=1 << 21)
    harness.scheduler.speak(0, 1, long_text(20), True)
    harness.events.wait(UtteranceAudio, 100, 1)
    harness.scheduler.close_stream(0)
    harness.events.wait(StreamClosed, 100)
    position = ring.write_pos
    time.sleep(0.15)
    assert ring.write_pos == position
    assert [type(m) for m in harness.events.messages(100)] == [UtteranceAudio, StreamClosed]


def test_slot_reopened_after_close(harness):
    harness.open(0, stream_id=1)
    harness.scheduler.speak(0, 1, "Old stream.", True)
    harness.events.wait(UtteranceEnd, 1, 1)
    harness.scheduler.close_stream(0)
    harness.events.wait(StreamClosed, 1)

    ring = harness.open(0, stream_id=2)
    harness.scheduler.speak(0, 1, "New stream.", True)
    end = harness.events.wait(UtteranceEnd, 2, 1).message
    assert isinstance(end, UtteranceEnd)
    assert end.start_pos == 0
    assert drain(ring) == expected_pcm(["New stream."])


# ------------------------------------------------------------------------- failures


def test_text_too_long(make_harness):
    harness = make_harness(max_text_chars=50)
    ring = harness.open(0)
    harness.scheduler.speak(0, 1, "x" * 51, True)
    failed = harness.events.wait(UtteranceFailed, 100, 1).message
    assert isinstance(failed, UtteranceFailed)
    assert failed.code == "text_too_long"
    assert failed.start_pos is None
    assert ring.write_pos == 0

    harness.scheduler.speak(0, 2, "y" * 50, True)  # exactly at the limit is fine
    end = harness.events.wait(UtteranceEnd, 100, 2).message
    assert isinstance(end, UtteranceEnd)
    assert end.samples == 50 * SAMPLES_PER_CHAR


def test_text_too_long_counts_all_pieces(make_harness):
    harness = make_harness(max_text_chars=50)
    harness.open(0)
    harness.scheduler.speak(0, 1, "a" * 30, False)
    harness.scheduler.speak(0, 1, "b" * 30, False)
    failed = harness.events.wait(UtteranceFailed, 100, 1).message
    assert isinstance(failed, UtteranceFailed)
    assert failed.code == "text_too_long"
    assert not any(isinstance(m, UtteranceAudio) for m in harness.events.messages(100))


def test_failed_utterance_without_audio_has_no_positions(make_harness):
    harness = make_harness(max_text_chars=50)
    harness.open(0)
    harness.scheduler.speak(0, 1, "Hello.", True)
    harness.events.wait(UtteranceEnd, 100, 1)
    harness.scheduler.speak(0, 2, "x" * 51, True)
    failed = harness.events.wait(UtteranceFailed, 100, 2).message
    assert isinstance(failed, UtteranceFailed)
    assert (failed.start_pos, failed.end_pos) == (None, None)


def test_failed_utterance_is_not_resurrected_by_later_pieces(make_harness):
    harness = make_harness(max_text_chars=50)
    harness.open(0)
    harness.scheduler.speak(0, 1, "a" * 40, False)
    harness.scheduler.speak(0, 1, "b" * 40, False)  # over the limit: utterance 1 fails
    harness.scheduler.speak(0, 1, "The rest.", True)  # rest of utterance 1
    harness.scheduler.speak(0, 2, "Next.", True)
    harness.events.wait(UtteranceEnd, 100, 2)
    utterance1 = [m for m in harness.events.messages(100) if getattr(m, "utterance", 0) == 1]
    assert [type(m) for m in utterance1] == [UtteranceFailed]


class FlakyBackend:
    """Synthetic tones, but fails on segments containing "FAIL" (after emitting a bit
    when the segment also contains "LATE") and crashes on "CRASH"."""

    name = "flaky"
    native_sample_rate = NATIVE_RATE
    max_text_chars = 5000

    def __init__(self) -> None:
        self._inner = SyntheticBackend()

    def voices(self) -> Sequence[VoiceInfo]:
        return self._inner.voices()

    def resolve_voice(self, settings: VoiceSettings) -> object:
        return self._inner.resolve_voice(settings)

    def voice_sample_rate(self, voice: object) -> int:
        return NATIVE_RATE

    def synthesize(self, text: str, voice: object, emit: EmitFn) -> None:
        if "CRASH" in text:
            raise RuntimeError("segfault-ish")
        if "FAIL" in text:
            if "LATE" in text:
                emit(np.zeros(800, dtype=np.int16))
            raise BackendError("model_crashed", "the model fell over")
        self._inner.synthesize(text, voice, emit)

    def close(self) -> None:
        pass


def test_backend_error_yields_utterance_failed(make_harness):
    harness = make_harness(FlakyBackend())
    ring = harness.open(0)
    harness.scheduler.speak(0, 1, "FAIL now.", True)
    failed = harness.events.wait(UtteranceFailed, 100, 1).message
    assert isinstance(failed, UtteranceFailed)
    assert failed.code == "model_crashed"
    assert failed.message == "the model fell over"
    assert failed.start_pos is None
    assert ring.write_pos == 0

    harness.scheduler.speak(0, 2, "Recovered.", True)
    end = harness.events.wait(UtteranceEnd, 100, 2).message
    assert isinstance(end, UtteranceEnd)
    assert end.start_pos == 0
    assert not any(
        isinstance(m, UtteranceEnd) and m.utterance == 1 for m in harness.events.messages(100)
    )


def test_backend_error_after_some_audio(make_harness):
    harness = make_harness(FlakyBackend())
    ring = harness.open(0)
    harness.scheduler.speak(0, 1, "Hello there. FAIL LATE here. Never spoken.", True)
    failed = harness.events.wait(UtteranceFailed, 100, 1).message
    assert isinstance(failed, UtteranceFailed)
    assert failed.code == "model_crashed"
    assert failed.start_pos == 0
    assert failed.end_pos == ring.write_pos
    # The first sentence and the part emitted before the failure reached the ring.
    assert ring.write_pos == len(expected_pcm(["Hello there."])) + 1600
    kinds = [type(m) for m in harness.events.messages(100)]
    assert kinds == [UtteranceAudio, UtteranceFailed]
    assert harness.records(0) == [(1, failed.end_pos)]


def test_unexpected_backend_exception_is_engine_error(make_harness):
    harness = make_harness(FlakyBackend())
    harness.open(0)
    harness.scheduler.speak(0, 1, "CRASH.", True)
    failed = harness.events.wait(UtteranceFailed, 100, 1).message
    assert isinstance(failed, UtteranceFailed)
    assert failed.code == "engine_error"
    harness.scheduler.speak(0, 2, "Still alive.", True)
    harness.events.wait(UtteranceEnd, 100, 2)


# ------------------------------------------------------------------------- PCM tap


def test_pcm_tap_holds_what_went_into_the_ring(make_harness, tmp_path):
    harness = make_harness(tap_directory=str(tmp_path))
    ring = harness.open(0, sample_rate=8000)
    harness.scheduler.speak(0, 1, "Hello there.", True)
    harness.scheduler.speak(0, 2, "Goodbye.", True)
    harness.events.wait(UtteranceEnd, 100, 2)
    harness.scheduler.close_stream(0)  # closes the tap file
    harness.events.wait(StreamClosed, 100)
    (tap,) = tmp_path.iterdir()
    assert tap.name.endswith("-slot0-stream100-8000hz.pcm")
    assert tap.read_bytes() == drain(ring)


def test_pcm_tap_excludes_audio_dropped_before_reaching_the_ring(make_harness, tmp_path):
    harness = make_harness(tap_directory=str(tmp_path))
    ring = harness.open(0, capacity=4096)
    harness.scheduler.speak(0, 1, long_text(1), True)
    deadline = time.monotonic() + WAIT_S
    while ring.write_pos < 4096 and time.monotonic() < deadline:
        time.sleep(0.002)
    harness.scheduler.cancel(0)
    harness.events.wait(Cancelled, 100)
    in_ring = drain(ring)
    harness.scheduler.close_stream(0)
    harness.events.wait(StreamClosed, 100)
    (tap,) = tmp_path.iterdir()
    assert tap.read_bytes() == in_ring


# ------------------------------------------------------------------------ real espeak


def test_scheduler_with_espeak(make_harness, espeak_backend: EspeakBackend):
    harness = make_harness(espeak_backend)
    ring = harness.open(0, sample_rate=8000)
    harness.scheduler.speak(0, 1, "Hello, welcome to Acme. Please hold.", True)
    end = harness.events.wait(UtteranceEnd, 100, 1).message
    assert isinstance(end, UtteranceEnd)
    assert [type(m) for m in harness.events.messages(100)] == [UtteranceAudio, UtteranceEnd]
    assert end.end_pos - end.start_pos == 2 * end.samples
    assert 0.8 * 8000 < end.samples < 6 * 8000
    pcm = np.frombuffer(drain(ring), dtype="<i2")
    assert len(pcm) == end.samples
    assert np.abs(pcm).max() > 1000


def test_an_utterance_s_instruction_is_refused_by_a_backend_that_takes_none(harness):
    harness.open(0, stream_id=6)
    harness.scheduler.speak(0, 1, "Hello.", True, instruct="用粤语说这句话")
    failed = harness.events.wait(UtteranceFailed, 6, 1).message
    assert isinstance(failed, UtteranceFailed) and failed.code == "instruct_unsupported"
    harness.scheduler.speak(0, 2, "Hello.", True)  # the stream goes on
    assert isinstance(harness.events.wait(UtteranceEnd, 6, 2).message, UtteranceEnd)


# -------------------------------------------------- capacity: starts held back, long cuts


class PacedBatchBackend(SyntheticBackend):
    """Tones at a fixed worker cost per character, one call per worker thread (as
    Piper): the scheduler holds new utterances back when they do not fit
    (engine/capacity.py). Records each job's text."""

    independent_calls = True
    max_batch = 1

    def __init__(self, seconds_per_char: float, threads: int = 1) -> None:
        super().__init__()
        self.seconds_per_char = seconds_per_char
        self.threads = threads
        self.texts: list[str] = []

    def batch_key(self, voice: object) -> object:
        return "one"

    def synthesize_batch(self, jobs: Sequence[SynthesisJob], emit: BatchEmit) -> None:
        for index, job in enumerate(jobs):
            self.texts.append(job.text)
            time.sleep(self.seconds_per_char * len(job.text))
            emit(index, np.full(len(job.text) * SAMPLES_PER_CHAR, 1000, dtype=np.int16))


def play_in_real_time(harness: Harness, slots: Sequence[int], timeout: float) -> dict[int, float]:
    """Read each slot's ring as a telephone would, 20 ms a tick from its first audio on,
    until its utterance 1 has ended and been read. Returns per slot the seconds its
    playback was short of audio (a stutter) after it began."""
    frame = 2 * NATIVE_RATE // 50
    began: dict[int, float] = {}
    short = dict.fromkeys(slots, 0.0)
    done: set[int] = set()
    deadline = time.monotonic() + timeout
    tick = time.monotonic()
    while len(done) < len(slots) and time.monotonic() < deadline:
        tick += 0.02
        time.sleep(max(0.0, tick - time.monotonic()))
        ends = {
            m.stream_id: m.end_pos for m in harness.events.messages() if isinstance(m, UtteranceEnd)
        }
        for slot in slots:
            ring = harness.rings[slot]
            if slot in done:
                continue
            if slot not in began:
                if ring.readable_bytes() == 0:
                    continue
                began[slot] = tick
            end = ends.get(harness.stream_ids[slot])
            got = len(ring.read(frame))
            if end is not None and ring.read_pos >= end:
                done.add(slot)
            elif got < frame:
                short[slot] += 0.02 * (frame - got) / frame
    assert done == set(slots), f"not finished: {set(slots) - done}"
    return short


@pytest.mark.realtime
def test_past_capacity_new_utterances_wait_and_none_that_started_stutters(make_harness):
    # 10 ms of work per character (60 ms of audio): one worker keeps about 6 calls
    # going; 12 ask at once, three sentences each. Without the capacity check they all
    # start, their later segments pile up, and every call stutters (0.02-0.42 s here).
    # The last one waits about 11 s to start: no start deadline here (tested above).
    backend = PacedBatchBackend(seconds_per_char=0.01)
    harness = make_harness(backend, start_timeout_s=60.0)
    slots = range(12)
    text = (
        "This is the first part of it all, you see. Here comes the second part of it now. "
        "And this is the end of all of it."
    )
    for slot in slots:
        harness.open(slot)
        harness.scheduler.speak(slot, 1, text, True)
    short = play_in_real_time(harness, slots, timeout=30.0)
    assert max(short.values()) == 0.0, short
    starts = sorted(e.at for e in harness.events.events() if isinstance(e.message, UtteranceAudio))
    # Not all at once: the last start waited for earlier calls to finish synthesizing.
    assert starts[-1] - starts[0] > 1.0, starts


@pytest.mark.realtime
def test_a_long_segment_is_cut_when_it_would_come_too_late(make_harness):
    # A short opening (1.7 s of audio) and a 130-character sentence that takes 1.95 s at
    # this pace: whole, it would end after the opening has played; it goes in pieces.
    backend = PacedBatchBackend(seconds_per_char=0.015)
    harness = make_harness(backend)
    harness.open(0)
    opening = "Good morning, caller."
    rest = (
        "Your call matters to us, so please stay on the line and the next available "
        "agent will be with you very shortly, thank you for waiting."
    )
    harness.scheduler.speak(0, 1, f"{opening} {rest}", True)
    short = play_in_real_time(harness, [0], timeout=15.0)
    assert short[0] == 0.0
    whole = SegmentSplitter().feed(f"{opening} {rest}")
    assert len(backend.texts) > len(whole) and all(len(t) < len(rest) for t in backend.texts)
    assert " ".join(backend.texts).replace(",", "") == f"{opening} {rest}".replace(",", "")


def test_a_failing_coordinator_is_reported_not_silent(monkeypatch):
    failures: list[BaseException] = []
    scheduler = Scheduler(
        BackendSet([SyntheticBackend()]),
        EventLog(),
        max_text_chars=100,
        on_fatal=failures.append,
    )

    def broken() -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(scheduler, "_flush_all", broken)
    scheduler.start()
    scheduler._thread.join(WAIT_S)
    scheduler.stop()
    assert [str(f) for f in failures] == ["a bug"]
