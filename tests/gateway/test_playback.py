"""Tests for gateway.playback.Playback over a real engine.ipc.ring.SpscRing."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.ipc.boundaries import BoundaryReader, BoundaryWriter
from engine.ipc.ring import SpscRing
from gateway.errors import ErrorCode
from gateway.events import (
    ErrorEvent,
    Flushed,
    MarkReached,
    Played,
    SessionEvent,
    UtteranceDone,
    UtteranceStarted,
    Word,
    Words,
)
from gateway.playback import FrameResult, FrameStatus, Playback

RATE = 8000
FRAME = 320  # 20 ms of 16-bit mono PCM at 8 kHz

# --------------------------------------------------------------------------- helpers


def make_ring(capacity: int = 1 << 16) -> SpscRing:
    return SpscRing.create(bytearray(SpscRing.region_size(capacity)), capacity)


def pcm(n: int, seed: int = 1) -> bytes:
    """``n`` bytes of recognisable, never-zero "audio"."""
    return bytes(1 + (seed * 31 + i * 7) % 251 for i in range(n))


def padded(data: bytes, frame: int = FRAME) -> bytes:
    return data + bytes(-len(data) % frame)


@dataclass(frozen=True)
class Frame:
    data: bytes


Item = Frame | SessionEvent


def flatten(result: FrameResult) -> list[Item]:
    """One result in wire order: events before, the frame, events after."""
    items: list[Item] = list(result.before)
    if result.frame is not None:
        items.append(Frame(result.frame))
    items.extend(result.after)
    return items


def drain(pb: Playback, ring: SpscRing, now: float = 0.0, limit: int = 10_000) -> list[Item]:
    """Call next_frame until it stops producing frames; everything in wire order."""
    items: list[Item] = []
    for _ in range(limit):
        result = pb.next_frame(ring, now)
        items.extend(flatten(result))
        if result.status is not FrameStatus.FRAME:
            return items
    raise AssertionError("playback never stopped producing frames")


def frames_of(items: list[Item]) -> list[bytes]:
    return [i.data for i in items if isinstance(i, Frame)]


def events_of(items: list[Item]) -> list[SessionEvent]:
    return [i for i in items if not isinstance(i, Frame)]


def speak(pb: Playback, ring: SpscRing, seq: int, data: bytes, now: float = 0.0) -> None:
    """The engine writes one whole utterance and reports it (audio, then end)."""
    start = ring.write_pos
    assert ring.write(data) == len(data)
    if data:
        pb.on_audio(seq, start, now)
    pb.on_end(seq, start, ring.write_pos, len(data) // 2)


# ------------------------------------------------------------------ one utterance


def test_one_utterance_frames_and_events():
    ring = make_ring()
    pb = Playback(sample_rate=RATE, frame_bytes=FRAME)
    pb.enqueue_utterance(1, "u1", now=10.0)
    audio = pcm(3 * FRAME + 100)
    assert ring.write(audio) == len(audio)
    pb.on_audio(1, 0, now=10.05)
    pb.on_end(1, 0, len(audio), len(audio) // 2)

    first = pb.next_frame(ring, now=10.1)
    assert first.status is FrameStatus.FRAME
    assert first.before == [UtteranceStarted("u1")]
    assert first.frame == audio[:FRAME]
    assert first.after == []

    for k in (1, 2):
        mid = pb.next_frame(ring, now=10.2)
        assert mid.status is FrameStatus.FRAME
        assert (mid.before, mid.after) == ([], [])
        assert mid.frame == audio[k * FRAME : (k + 1) * FRAME]

    last = pb.next_frame(ring, now=10.3)
    assert last.status is FrameStatus.FRAME
    assert last.before == []
    # The 100-byte tail is zero-padded to a whole frame.
    assert last.frame == audio[3 * FRAME :] + bytes(FRAME - 100)
    assert len(last.frame) == FRAME
    # 530 samples at 8 kHz = 66.25 ms; first frame 100 ms after the request.
    assert last.after == [UtteranceDone("u1", audio_ms=66, first_audio_ms=100)]

    done = pb.next_frame(ring, now=10.4)
    assert done.status is FrameStatus.IDLE
    assert (done.frame, done.before, done.after) == (None, [], [])
    assert pb.idle
    assert [u.utterance_id for u in pb.finished] == ["u1"]


def test_every_frame_is_exactly_frame_bytes():
    ring = make_ring()
    pb = Playback(sample_rate=RATE, frame_bytes=FRAME)
    pb.enqueue_utterance(1, "u1", 0.0)
    audio = pcm(5 * FRAME + 2)
    speak(pb, ring, 1, audio)
    frames = frames_of(drain(pb, ring))
    assert len(frames) == 6
    assert all(len(f) == FRAME for f in frames)
    assert b"".join(frames) == padded(audio)


def test_exact_frame_multiple_has_no_padding_frame():
    ring = make_ring()
    pb = Playback(sample_rate=RATE, frame_bytes=FRAME)
    pb.enqueue_utterance(1, "u1", 0.0)
    audio = pcm(2 * FRAME)
    speak(pb, ring, 1, audio)
    items = drain(pb, ring)
    assert items == [
        UtteranceStarted("u1"),
        Frame(audio[:FRAME]),
        Frame(audio[FRAME:]),
        UtteranceDone("u1", audio_ms=40, first_audio_ms=0),
    ]


def test_first_audio_ms_counts_from_reaching_the_head_of_the_queue():
    ring = make_ring()
    pb = Playback(sample_rate=RATE, frame_bytes=FRAME)
    pb.enqueue_utterance(1, "u1", now=0.0)
    pb.enqueue_utterance(2, "u2", now=1.0)
    speak(pb, ring, 1, pcm(FRAME, 1), now=0.1)
    one = pb.next_frame(ring, now=5.0)
    assert one.after == [UtteranceDone("u1", audio_ms=20, first_audio_ms=5000)]
    # u2 reached the head at 5.0 (when u1 finished), not when it was requested.
    speak(pb, ring, 2, pcm(FRAME, 2), now=5.1)
    two = pb.next_frame(ring, now=5.3)
    assert two.before == [UtteranceStarted("u2")]
    assert two.after == [UtteranceDone("u2", audio_ms=20, first_audio_ms=300)]


def test_utterance_end_reported_after_its_last_full_frame_was_read():
    ring = make_ring()
    pb = Playback(sample_rate=RATE, frame_bytes=FRAME)
    pb.enqueue_utterance(1, "u1", 0.0)
    pb.enqueue_mark("m1")
    audio = pcm(FRAME)
    ring.write(audio)
    pb.on_audio(1, 0, 0.0)
    assert flatten(pb.next_frame(ring, 0.0)) == [UtteranceStarted("u1"), Frame(audio)]
    assert pb.next_frame(ring, 0.0).status is FrameStatus.STARVED
    pb.on_end(1, 0, FRAME, FRAME // 2)
    # Done and the mark behind it come out on the next call, without a frame.
    result = pb.next_frame(ring, 0.0)
    assert result.status is FrameStatus.IDLE
    assert result.frame is None
    assert result.before == [
        UtteranceDone("u1", audio_ms=20, first_audio_ms=0),
        MarkReached("m1"),
    ]


# ------------------------------------------------------------------------ statuses


def test_status_idle_waiting_starved():
    ring = make_ring()
    pb = Playback(sample_rate=RATE, frame_bytes=FRAME)
    assert pb.next_frame(ring, 0.0).status is FrameStatus.IDLE

    pb.enqueue_utterance(1, "u1", 0.0)
    assert pb.next_frame(ring, 0.0).status is FrameStatus.WAITING  # no audio reported

    ring.write(pcm(FRAME // 2))
    pb.on_audio(1, 0, 0.0)
    # Less than a frame and the end is not known: still waiting for first audio.
    assert pb.next_frame(ring, 0.0).status is FrameStatus.WAITING

    ring.write(pcm(FRAME))
    assert pb.next_frame(ring, 0.0).status is FrameStatus.FRAME
    # Half a frame left, the engine has not finished: mid-utterance starvation.
    starved = pb.next_frame(ring, 0.0)
    assert starved.status is FrameStatus.STARVED
    assert (starved.frame, starved.before, starved.after) == (None, [], [])

    pb.on_end(1, 0, ring.write_pos, ring.write_pos // 2)
    last = pb.next_frame(ring, 0.0)
    assert last.status is FrameStatus.FRAME
    assert isinstance(last.after[0], UtteranceDone)
    assert pb.next_frame(ring, 0.0).status is FrameStatus.IDLE


def test_audio_reported_but_not_yet_visible_is_waiting():
    ring = make_ring()
    pb = Playback(sample_rate=RATE, frame_bytes=FRAME)
    pb.enqueue_utterance(1, "u1", 0.0)
    pb.on_audio(1, 0, 0.0)
    assert pb.next_frame(ring, 0.0).status is FrameStatus.WAITING


def test_bytes_before_start_pos_are_skipped():
    ring = make_ring()
    pb = Playback(sample_rate=RATE, frame_bytes=FRAME)
    ring.write(b"\x55" * 1000)  # leftovers of dropped work
    pb.enqueue_utterance(1, "u1", 0.0)
    audio = pcm(FRAME)
    speak(pb, ring, 1, audio)
    assert frames_of(drain(pb, ring)) == [audio]
    assert ring.read_pos == ring.write_pos


def test_events_for_unknown_utterances_are_ignored():
    ring = make_ring()
    pb = Playback(sample_rate=RATE, frame_bytes=FRAME)
    pb.on_audio(7, 0, 0.0)
    pb.on_end(7, 0, 10, 5)
    pb.on_failed(7, "x", "y", None, None)
    assert pb.idle
    assert pb.next_frame(ring, 0.0).status is FrameStatus.IDLE


def test_queue_size_and_full():
    pb = Playback(sample_rate=RATE, frame_bytes=FRAME, max_items=3)
    pb.enqueue_utterance(1, "a", 0.0)
    pb.enqueue_mark("m")
    assert len(pb) == 2
    assert not pb.full
    pb.enqueue_utterance(2, "b", 0.0)
    assert pb.full
    assert pb.pending_utterance_ids() == ["a", "b"]


# --------------------------------------------------------------------------- marks


def test_mark_on_an_empty_queue_is_emitted_at_once():
    ring = make_ring()
    pb = Playback(sample_rate=RATE, frame_bytes=FRAME)
    pb.enqueue_mark("m0")
    result = pb.next_frame(ring, 0.0)
    assert result.status is FrameStatus.IDLE
    assert result.frame is None
    assert result.before == [MarkReached("m0")]
    assert result.after == []
    assert pb.idle


def test_mark_after_an_utterance_follows_its_last_frame():
    ring = make_ring()
    pb = Playback(sample_rate=RATE, frame_bytes=FRAME)
    pb.enqueue_utterance(1, "u1", 0.0)
    pb.enqueue_mark("m1")
    audio = pcm(FRAME + 10)
    speak(pb, ring, 1, audio)
    first = pb.next_frame(ring, 0.0)
    assert first.after == []  # the mark must not come before the audio it follows
    last = pb.next_frame(ring, 0.0)
    assert last.frame == padded(audio[FRAME:])
    assert last.after == [
        UtteranceDone("u1", audio_ms=21, first_audio_ms=0),
        MarkReached("m1"),
    ]


def test_mark_waits_for_an_utterance_without_audio_yet():
    ring = make_ring()
    pb = Playback(sample_rate=RATE, frame_bytes=FRAME)
    pb.enqueue_utterance(1, "u1", 0.0)
    pb.enqueue_mark("m1")
    for _ in range(3):
        result = pb.next_frame(ring, 0.0)
        assert result.status is FrameStatus.WAITING
        assert result.before == []


def test_two_utterances_and_marks_keep_order():
    ring = make_ring()
    pb = Playback(sample_rate=RATE, frame_bytes=FRAME)
    pb.enqueue_mark("m0")
    pb.enqueue_utterance(1, "u1", 0.0)
    pb.enqueue_mark("m1")
    pb.enqueue_mark("m1b")
    pb.enqueue_utterance(2, "u2", 0.0)
    pb.enqueue_mark("m2")
    a1, a2 = pcm(FRAME + 4, 1), pcm(2 * FRAME, 2)
    speak(pb, ring, 1, a1)
    speak(pb, ring, 2, a2)
    items = drain(pb, ring)
    assert items == [
        MarkReached("m0"),
        UtteranceStarted("u1"),
        Frame(a1[:FRAME]),
        Frame(padded(a1[FRAME:])),
        UtteranceDone("u1", audio_ms=20, first_audio_ms=0),
        MarkReached("m1"),
        MarkReached("m1b"),
        UtteranceStarted("u2"),
        Frame(a2[:FRAME]),
        Frame(a2[FRAME:]),
        UtteranceDone("u2", audio_ms=40, first_audio_ms=0),
        MarkReached("m2"),
    ]


# --------------------------------------------------------------------------- clear


def test_clear_reports_queued_marks_as_cleared_in_order():
    pb = Playback(sample_rate=RATE, frame_bytes=FRAME)
    pb.enqueue_utterance(1, "u1", 0.0)
    pb.enqueue_mark("a")
    pb.enqueue_utterance(2, "u2", 0.0)
    pb.enqueue_mark("b")
    pb.enqueue_mark("c")
    assert pb.clear() == [
        MarkReached("a", cleared=True),
        MarkReached("b", cleared=True),
        MarkReached("c", cleared=True),
    ]
    assert pb.idle
    assert pb.pending_utterance_ids() == []
    assert pb.clear() == []  # nothing left to report


def test_clear_blocks_frames_until_cancelled_and_discards_old_audio():
    ring = make_ring()
    pb = Playback(sample_rate=RATE, frame_bytes=FRAME)
    pb.enqueue_utterance(1, "u1", 0.0)
    old = pcm(4 * FRAME, 1)
    ring.write(old[: 2 * FRAME])
    pb.on_audio(1, 0, 0.0)
    assert pb.next_frame(ring, 0.0).frame == old[:FRAME]

    assert pb.clear() == []
    # The ring still holds old audio, and the engine keeps writing until it cancels.
    ring.write(old[2 * FRAME :])
    for _ in range(3):
        blocked = pb.next_frame(ring, 0.0)
        assert blocked.status is FrameStatus.WAITING
        assert blocked.frame is None
    # A speak right after the clear is queued but waits too.
    pb.enqueue_utterance(2, "u2", 0.0)
    assert pb.next_frame(ring, 0.0).status is FrameStatus.WAITING
    # Late engine events of the dropped utterance are ignored.
    pb.on_end(1, 0, len(old), len(old) // 2)

    cancel_pos = ring.write_pos
    pb.on_cancelled(ring, cancel_pos)
    assert ring.read_pos == cancel_pos  # every byte before write_pos is discarded
    assert pb.next_frame(ring, 0.0).status is FrameStatus.WAITING  # u2 has no audio yet

    new = pcm(FRAME + 6, 9)
    speak(pb, ring, 2, new)
    items = drain(pb, ring)
    assert items == [
        UtteranceStarted("u2"),
        Frame(new[:FRAME]),
        Frame(padded(new[FRAME:])),
        UtteranceDone("u2", audio_ms=20, first_audio_ms=0),
    ]


def test_two_clears_need_two_cancellations():
    ring = make_ring()
    pb = Playback(sample_rate=RATE, frame_bytes=FRAME)
    pb.clear()
    pb.clear()
    pb.on_cancelled(ring, 0)
    pb.enqueue_mark("m")
    assert pb.next_frame(ring, 0.0).before == []
    pb.on_cancelled(ring, 0)
    assert pb.next_frame(ring, 0.0).before == [MarkReached("m")]


def test_cancel_failed_unblocks_and_start_pos_skips_old_audio():
    ring = make_ring()
    pb = Playback(sample_rate=RATE, frame_bytes=FRAME)
    pb.enqueue_utterance(1, "u1", 0.0)
    ring.write(pcm(3 * FRAME, 1))
    pb.on_audio(1, 0, 0.0)
    pb.clear()
    pb.cancel_failed()
    pb.enqueue_utterance(2, "u2", 0.0)
    new = pcm(FRAME, 2)
    speak(pb, ring, 2, new)
    assert frames_of(drain(pb, ring)) == [new]


# ------------------------------------------------------------------------ failures


def test_failed_without_audio_reports_error_then_done():
    ring = make_ring()
    pb = Playback(sample_rate=RATE, frame_bytes=FRAME)
    pb.enqueue_utterance(1, "u1", 0.0)
    pb.enqueue_mark("m1")
    pb.on_failed(1, "engine_error", "synthesis failed", None, None)
    result = pb.next_frame(ring, 0.0)
    assert result.frame is None
    assert result.status is FrameStatus.IDLE
    assert result.before == [
        ErrorEvent(ErrorCode.ENGINE_ERROR, "synthesis failed", "u1"),
        UtteranceDone("u1", audio_ms=0, first_audio_ms=None),
        MarkReached("m1"),
    ]


def test_failed_with_audio_plays_it_then_reports_error_then_done():
    ring = make_ring()
    pb = Playback(sample_rate=RATE, frame_bytes=FRAME)
    pb.enqueue_utterance(1, "u1", 0.0)
    pb.enqueue_utterance(2, "u2", 0.0)
    audio = pcm(FRAME + 50)
    ring.write(audio)
    pb.on_audio(1, 0, 0.0)
    pb.on_failed(1, "engine_error", "boom", 0, len(audio))
    items = drain(pb, ring)
    assert frames_of(items) == [audio[:FRAME], padded(audio[FRAME:])]
    events = events_of(items)
    assert events[0] == UtteranceStarted("u1")
    assert events[1] == ErrorEvent(ErrorCode.ENGINE_ERROR, "boom", "u1")
    done = events[2]
    assert isinstance(done, UtteranceDone)
    assert done.utterance_id == "u1"
    assert done.first_audio_ms == 0
    # The error and done come right after the last frame of the failed utterance.
    assert items.index(events[1]) == items.index(Frame(padded(audio[FRAME:]))) + 1
    assert pb.pending_utterance_ids() == ["u2"]


def test_utterance_with_zero_audio_is_done_without_a_frame():
    ring = make_ring()
    pb = Playback(sample_rate=RATE, frame_bytes=FRAME)
    ring.write(pcm(100))
    ring.read(100)
    pb.enqueue_utterance(1, "u1", 0.0)
    pb.enqueue_mark("after")
    pb.on_end(1, 100, 100, 0)
    result = pb.next_frame(ring, 0.0)
    assert result.status is FrameStatus.IDLE
    assert result.frame is None
    assert result.before == [
        UtteranceDone("u1", audio_ms=0, first_audio_ms=None),
        MarkReached("after"),
    ]
    assert pb.idle


# ----------------------------------------------------------------- known problems


def test_next_utterance_audio_visible_before_end_is_not_mixed_in():
    """The engine publishes u1's end in the boundaries ring before writing u2's bytes,
    so the gateway never reads u2 as part of u1, even before UtteranceEnd arrives."""
    ring = make_ring()
    bnd = make_ring(4096)
    pb = Playback(sample_rate=RATE, frame_bytes=FRAME, boundaries=BoundaryReader(bnd))
    pb.enqueue_utterance(1, "u1", 0.0)
    pb.enqueue_mark("between")
    pb.enqueue_utterance(2, "u2", 0.0)
    a1, a2 = pcm(FRAME + FRAME // 2, 1), pcm(2 * FRAME, 2)
    ring.write(a1)
    pb.on_audio(1, 0, 0.0)
    # The engine sent UtteranceEnd(u1) and already wrote u2's first bytes to the ring;
    # the gateway reads the ring before it has processed that control message.
    assert BoundaryWriter(bnd).append(1, len(a1))
    ring.write(a2)
    items = [*flatten(pb.next_frame(ring, 0.0)), *flatten(pb.next_frame(ring, 0.0))]
    pb.on_end(1, 0, len(a1), len(a1) // 2)
    pb.on_audio(2, len(a1), 0.0)
    pb.on_end(2, len(a1), len(a1) + len(a2), len(a2) // 2)
    items += drain(pb, ring)
    assert items == [
        UtteranceStarted("u1"),
        Frame(a1[:FRAME]),
        Frame(padded(a1[FRAME:])),
        UtteranceDone("u1", audio_ms=30, first_audio_ms=0),
        MarkReached("between"),
        UtteranceStarted("u2"),
        Frame(a2[:FRAME]),
        Frame(a2[FRAME:]),
        UtteranceDone("u2", audio_ms=40, first_audio_ms=0),
    ]


# ---------------------------------------------------------------------- property

SMALL_FRAME = 8  # 4 samples: 20 ms at 200 Hz keeps the examples small
SMALL_RATE = 200


class _Engine:
    """Writes utterances into the ring in chunks, as the engine does, and queues the
    control events it would send; ``deliver`` hands the oldest one to playback.

    Contract kept: UtteranceAudio after the first bytes of an utterance are in the ring,
    UtteranceEnd once all of them are, and the next utterance's bytes only after the
    gateway has processed that UtteranceEnd.
    """

    def __init__(self, pb: Playback, ring: SpscRing, audio: list[bytes]) -> None:
        self.pb = pb
        self.ring = ring
        self.audio = audio
        self.index = 0
        self.offset = 0
        self.start = 0
        self.events: deque[tuple[str, int, int, int, int]] = deque()

    @property
    def finished(self) -> bool:
        return self.index >= len(self.audio) and not self.events

    def write(self, size: int) -> None:
        if self.index >= len(self.audio) or any(e[0] == "end" for e in self.events):
            return
        seq, data = self.index + 1, self.audio[self.index]
        if self.offset == 0:
            self.start = self.ring.write_pos
        if data:
            n = self.ring.write(data[self.offset : self.offset + size])
            if n and self.offset == 0:
                self.events.append(("audio", seq, self.start, 0, 0))
            self.offset += n
        if self.offset == len(data):
            end = self.ring.write_pos
            self.events.append(("end", seq, self.start, end, len(data) // 2))
            self.index += 1
            self.offset = 0

    def deliver(self, now: float) -> None:
        if not self.events:
            return
        kind, seq, start, end, samples = self.events.popleft()
        if kind == "audio":
            self.pb.on_audio(seq, start, now)
        else:
            self.pb.on_end(seq, start, end, samples)


def _check_timeline(items: list[Item], audio: list[bytes], marks: list[bool]) -> None:
    expected_events: list[SessionEvent] = []
    for i, data in enumerate(audio):
        uid = f"u{i + 1}"
        if data:
            expected_events.append(UtteranceStarted(uid))
        ms = round(len(data) // 2 * 1000 / SMALL_RATE)
        expected_events.append(UtteranceDone(uid, ms, None))  # first_audio_ms checked apart
        if marks[i]:
            expected_events.append(MarkReached(f"m{i + 1}"))

    got_events = [
        UtteranceDone(e.utterance_id, e.audio_ms, None) if isinstance(e, UtteranceDone) else e
        for e in events_of(items)
    ]
    assert got_events == expected_events

    # Started/Done bracket exactly each utterance's frames; nothing plays outside them.
    current: str | None = None
    frames: dict[str, list[bytes]] = {}
    for item in items:
        if isinstance(item, UtteranceStarted):
            assert current is None
            current = item.utterance_id
            frames[current] = []
        elif isinstance(item, Frame):
            assert current is not None, "frame outside any utterance"
            frames[current].append(item.data)
        elif isinstance(item, UtteranceDone):
            assert current in (item.utterance_id, None)
            assert (current is None) == (item.utterance_id not in frames)
            current = None
        else:
            assert current is None, f"{item} inside an utterance"
    assert current is None
    for i, data in enumerate(audio):
        uid = f"u{i + 1}"
        assert b"".join(frames.get(uid, [])) == padded(data, SMALL_FRAME)
    assert b"".join(frames_of(items)) == b"".join(padded(d, SMALL_FRAME) for d in audio)


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=5),
    marks=st.lists(st.booleans(), min_size=5, max_size=5),
    extra_capacity=st.integers(0, 3 * SMALL_FRAME),
    script=st.lists(
        st.tuples(st.sampled_from(("write", "read", "deliver")), st.integers(1, 24)),
        max_size=120,
    ),
)
def test_frames_are_the_written_pcm_padded_per_utterance(
    sizes: list[int],
    marks: list[bool],
    extra_capacity: int,
    script: list[tuple[str, int]],
) -> None:
    audio = [pcm(2 * n, seed=i + 1) for i, n in enumerate(sizes)]
    ring = make_ring(SMALL_FRAME + extra_capacity)
    pb = Playback(sample_rate=SMALL_RATE, frame_bytes=SMALL_FRAME)
    for i in range(len(audio)):
        pb.enqueue_utterance(i + 1, f"u{i + 1}", 0.0)
        if marks[i]:
            pb.enqueue_mark(f"m{i + 1}")
    engine = _Engine(pb, ring, audio)
    items: list[Item] = []
    now = 0.0
    for action, size in script:
        now += 0.001
        if action == "write":
            engine.write(size)
        elif action == "deliver":
            engine.deliver(now)
        else:
            result = pb.next_frame(ring, now)
            assert len(result.frame or bytes(SMALL_FRAME)) == SMALL_FRAME
            items += flatten(result)
    for _ in range(10_000):
        if engine.finished and pb.idle:
            break
        now += 0.001
        engine.write(SMALL_FRAME)
        while engine.events:
            engine.deliver(now)
        result = pb.next_frame(ring, now)
        assert len(result.frame or bytes(SMALL_FRAME)) == SMALL_FRAME
        items += flatten(result)
    else:
        raise AssertionError("playback did not drain")
    assert pb.next_frame(ring, now).status is FrameStatus.IDLE
    _check_timeline(items, audio, marks)


def test_boundary_records_are_drained_even_when_the_end_is_already_known():
    """The engine publishes a boundary for every utterance; when UtteranceEnd arrives
    first (the usual case for a short prompt), the record must still be read, or the
    bounded boundary ring fills up after a few hundred utterances and the engine stops
    writing the stream's audio (the session goes silent)."""
    ring = make_ring()
    bnd = make_ring(64 * 16)  # room for 64 records
    writer = BoundaryWriter(bnd)
    pb = Playback(sample_rate=RATE, frame_bytes=FRAME, boundaries=BoundaryReader(bnd))
    for seq in range(1, 301):
        pb.enqueue_utterance(seq, f"u{seq}", 0.0)
        data = pcm(2 * FRAME, seq)
        start = ring.write_pos
        ring.write(data)
        assert writer.append(seq, ring.write_pos), f"boundary ring full at utterance {seq}"
        pb.on_audio(seq, start, 0.0)
        pb.on_end(seq, start, ring.write_pos, len(data) // 2)
        items = drain(pb, ring)
        assert frames_of(items) == [data[:FRAME], data[FRAME:]]
        assert bnd.readable_bytes() == 0


# --------------------------------------------------------------------- cancel, flush


def test_cancelling_a_queued_utterance_skips_its_audio_and_keeps_the_others():
    ring = make_ring()
    pb = Playback(sample_rate=RATE, frame_bytes=FRAME)
    for seq in (1, 2, 3):
        pb.enqueue_utterance(seq, f"u{seq}", 0.0)
    a1, a2, a3 = pcm(2 * FRAME, 1), pcm(3 * FRAME, 2), pcm(FRAME, 3)
    speak(pb, ring, 1, a1)
    speak(pb, ring, 2, a2)  # synthesized already: its audio sits in the ring
    speak(pb, ring, 3, a3)
    assert pb.cancel("u2") == (
        2,
        [UtteranceDone("u2", audio_ms=0, first_audio_ms=None, cancelled=True)],
    )
    assert frames_of(drain(pb, ring)) == [a1[:FRAME], a1[FRAME:], a3]
    assert pb.cancel("u2") is None  # gone
    assert pb.idle


def test_cancelling_the_playing_utterance_stops_it_and_the_next_one_plays():
    ring = make_ring()
    pb = Playback(sample_rate=RATE, frame_bytes=FRAME)
    pb.enqueue_utterance(1, "u1", 0.0)
    pb.enqueue_mark("after-u1")
    pb.enqueue_utterance(2, "u2", 0.0)
    a1 = pcm(10 * FRAME, 1)
    start = ring.write_pos
    ring.write(a1[: 4 * FRAME])  # the engine is still writing u1
    pb.on_audio(1, start, 0.0)
    played = [pb.next_frame(ring, 0.1).frame for _ in range(2)]
    assert played == [a1[:FRAME], a1[FRAME : 2 * FRAME]]
    seq, events = pb.cancel("u1") or (0, [])
    assert seq == 1
    assert events == [UtteranceDone("u1", audio_ms=40, first_audio_ms=100, cancelled=True)]
    ring.write(a1[4 * FRAME :])  # the engine finishes u1 regardless
    assert events_of(drain(pb, ring)) == [MarkReached("after-u1")]  # then waits for u2
    a2 = pcm(FRAME, 2)
    speak(pb, ring, 2, a2)
    assert frames_of(drain(pb, ring)) == [a2]  # nothing of u1's rest


def test_a_flush_is_answered_after_what_precedes_it_and_by_a_clear():
    ring = make_ring()
    pb = Playback(sample_rate=RATE, frame_bytes=FRAME)
    pb.enqueue_utterance(1, "u1", 0.0)
    pb.enqueue_flush("f1")
    a1 = pcm(FRAME, 1)
    speak(pb, ring, 1, a1)
    items = drain(pb, ring)
    assert items[-2:] == [UtteranceDone("u1", audio_ms=20, first_audio_ms=0), Flushed("f1")]
    pb.enqueue_utterance(2, "u2", 0.0)
    pb.enqueue_flush(None)
    pb.enqueue_mark("m")
    assert pb.clear() == [Flushed(None), MarkReached("m", cleared=True)]


def test_a_cancelled_utterance_is_read_past_as_the_engine_writes_it():
    """The engine writes a cancelled utterance's audio regardless: it is read past as it
    comes (else the ring fills and the engine stalls on this stream), and a boundary
    record of the next utterance, visible before its first-audio message, does not end
    that utterance early."""
    ring = make_ring(8 * FRAME)  # smaller than the cancelled utterance
    bnd = make_ring(64 * 16)
    writer = BoundaryWriter(bnd)
    pb = Playback(sample_rate=RATE, frame_bytes=FRAME, boundaries=BoundaryReader(bnd))
    pb.enqueue_utterance(1, "long", 0.0)
    pb.enqueue_utterance(2, "next", 0.0)
    assert pb.cancel("long") is not None
    long_audio = pcm(40 * FRAME, 1)
    pb.on_audio(1, 0, 0.0)
    written = 0
    while written < len(long_audio):  # the engine writes what fits; the gateway reads past
        written += ring.write(long_audio[written : written + 4 * FRAME])
        assert drain(pb, ring) == [] and pb.skipping
    assert writer.append(1, ring.write_pos)
    nxt = pcm(2 * FRAME, 2)
    start = ring.write_pos
    ring.write(nxt)
    assert writer.append(2, ring.write_pos)  # visible before on_audio(2)
    assert drain(pb, ring) == []  # waits for "next"'s first audio; not ended early
    pb.on_audio(2, start, 0.0)
    pb.on_end(2, start, ring.write_pos, len(nxt) // 2)
    assert frames_of(drain(pb, ring)) == [nxt[:FRAME], nxt[FRAME:]]
    assert not pb.skipping


# ---------------------------------------------------------------------------- words


def test_words_go_out_with_the_frame_their_audio_starts_in_and_played_follows_them():
    ring = make_ring()
    pb = Playback(sample_rate=RATE, frame_bytes=FRAME, emit_words=True)
    pb.enqueue_utterance(1, "u1", 0.0)
    audio = pcm(5 * FRAME)  # 100 ms
    speak(pb, ring, 1, audio)
    pb.on_words(1, [Word("one", 0, 30), Word("two", 30, 70), Word("three", 70, 100)])
    results = [pb.next_frame(ring, 0.0) for _ in range(5)]
    words = [
        (i, [w.text for w in e.words])
        for i, r in enumerate(results)
        for e in r.before
        if isinstance(e, Words)
    ]
    assert words == [(0, ["one"]), (1, ["two"]), (3, ["three"])]  # frames 0-20, 20-40, 60-80
    done = results[-1].after[0]
    assert isinstance(done, UtteranceDone) and done.played is not None
    assert (done.played.played_ms, done.played.played_text) == (100, "one two three")


def test_what_a_barge_in_or_cancel_interrupts_is_reported_played_so_far():
    ring = make_ring()
    pb = Playback(sample_rate=RATE, frame_bytes=FRAME)  # no Words events, played_text still
    pb.enqueue_utterance(1, "u1", 0.0)
    speak(pb, ring, 1, pcm(10 * FRAME))
    pb.on_words(1, [Word("press", 0, 50), Word("one", 50, 120), Word("now", 120, 200)])
    assert pb.playing() is None  # nothing went out yet
    for _ in range(3):
        assert not any(isinstance(e, Words) for e in pb.next_frame(ring, 0.0).before)
    assert pb.playing() == Played("u1", 60, "press one")
    _seq, events = pb.cancel("u1") or (0, [])
    done = events[0]
    assert isinstance(done, UtteranceDone) and done.played == Played("u1", 60, "press one")


def test_words_timed_after_their_audio_went_out_come_before_the_end():
    ring = make_ring()
    pb = Playback(sample_rate=RATE, frame_bytes=FRAME, emit_words=True)
    pb.enqueue_utterance(1, "u1", 0.0)
    speak(pb, ring, 1, pcm(2 * FRAME))
    first = pb.next_frame(ring, 0.0)
    pb.on_words(1, [Word("late", 0, 40)])  # the engine timed it after the audio left
    last = pb.next_frame(ring, 0.0)
    assert not any(isinstance(e, Words) for e in first.before)
    assert [e for e in last.before if isinstance(e, Words)] == [Words("u1", (Word("late", 0, 40),))]


def test_a_cancelled_utterance_that_fails_before_any_audio_is_not_skipped_for_ever():
    ring = make_ring()
    pb = Playback(sample_rate=RATE, frame_bytes=FRAME, max_items=3)
    for seq in (1, 2):
        pb.enqueue_utterance(seq, f"u{seq}", 0.0)
    assert pb.cancel("u1") is not None
    assert pb.skipping and len(pb) == 1
    pb.enqueue_utterance(3, "u3", 0.0)
    assert pb.full  # the cancelled one still counts while the engine works on it
    pb.on_failed(1, "backend_error", "boom", None, None)  # no audio: nothing to skip
    assert not pb.skipping and not pb.full
    a2 = pcm(FRAME, 2)
    start = ring.write_pos
    ring.write(a2)  # its bytes are visible before its first-audio message
    assert frames_of(drain(pb, ring)) == []
    pb.on_audio(2, start, 0.0)
    pb.on_end(2, start, ring.write_pos, len(a2) // 2)
    assert frames_of(drain(pb, ring)) == [a2]  # not read past


def test_with_words_an_utterance_ends_only_after_the_engine_s_end_message():
    """The boundary record can show the end before the last words arrive on the socket:
    the utterance waits for the end message, which follows them."""
    ring = make_ring()
    bnd = make_ring(64 * 16)
    pb = Playback(
        sample_rate=RATE, frame_bytes=FRAME, boundaries=BoundaryReader(bnd), emit_words=True
    )
    pb.enqueue_utterance(1, "u1", 0.0)
    audio = pcm(2 * FRAME)
    ring.write(audio)
    pb.on_audio(1, 0, 0.0)
    assert BoundaryWriter(bnd).append(1, ring.write_pos)
    items = drain(pb, ring)
    assert len(frames_of(items)) == 2
    assert not any(isinstance(e, UtteranceDone) for e in events_of(items))
    pb.on_words(1, [Word("last", 0, 40)])
    pb.on_end(1, 0, ring.write_pos, len(audio) // 2)
    words, done = events_of(drain(pb, ring))
    assert words == Words("u1", (Word("last", 0, 40),))
    assert isinstance(done, UtteranceDone) and done.played is not None
    assert done.played.played_text == "last"


def test_a_cancelled_utterance_without_announced_audio_skips_nothing_of_the_next():
    """The engine may end a cancelled utterance with no audio and no boundary record: until
    its first audio is announced nothing may be read past, or the next one loses its
    start."""
    ring = make_ring()
    pb = Playback(sample_rate=RATE, frame_bytes=FRAME)
    pb.enqueue_utterance(1, "cut", 0.0)
    pb.enqueue_utterance(2, "next", 0.0)
    assert pb.cancel("cut") is not None
    nxt = pcm(2 * FRAME, 2)
    start = ring.write_pos
    ring.write(nxt)  # the next one's bytes, before any message about either
    assert drain(pb, ring) == [] and ring.read_pos == 0
    pb.on_end(1, start, start, 0)  # the cut one ended empty
    pb.on_audio(2, start, 0.0)
    pb.on_end(2, start, ring.write_pos, len(nxt) // 2)
    assert frames_of(drain(pb, ring)) == [nxt[:FRAME], nxt[FRAME:]]
    assert not pb.skipping
