"""Sans-I/O playback queue: which bytes of the ring go out next, and which events.

A session's output is an ordered queue of utterances and marks. The engine writes each
utterance's PCM contiguously into the stream's outbound ring and reports where it starts
and ends; :class:`Playback` walks the queue, cuts the ring into frames, and emits
``utterance_started`` before an utterance's first frame, ``utterance_done`` after its
last, and each mark once everything queued before it has been sent.

It performs no I/O and never waits: :meth:`Playback.next_frame` is called by the pacer
and returns at most one frame plus the events that go around it, in wire order.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from gateway.errors import ErrorCode
from gateway.events import ErrorEvent, MarkReached, SessionEvent, UtteranceDone, UtteranceStarted


class RingReader(Protocol):
    """The consumer side of :class:`engine.ipc.ring.SpscRing` that playback needs."""

    @property
    def read_pos(self) -> int: ...
    @property
    def write_pos(self) -> int: ...
    def read(self, max_bytes: int) -> bytes: ...
    def discard_until(self, pos: int) -> None: ...


class BoundarySource(Protocol):
    """Consumer side of :class:`engine.ipc.boundaries.BoundaryReader`."""

    def drain(self) -> list[tuple[int, int]]: ...


class FrameStatus(enum.Enum):
    FRAME = "frame"  # a frame was produced
    IDLE = "idle"  # nothing queued
    WAITING = "waiting"  # the next utterance has no audio yet (first-audio latency)
    STARVED = "starved"  # mid-utterance, the engine has not produced the next frame yet


@dataclass
class QueuedUtterance:
    seq: int
    utterance_id: str
    requested_at: float
    head_at: float | None = None  # when it reached the head of the queue
    start_pos: int | None = None
    end_pos: int | None = None
    samples: int | None = None
    audio_ready_at: float | None = None  # engine's first chunk reported
    first_frame_at: float | None = None
    error: ErrorEvent | None = None

    @property
    def ended(self) -> bool:
        return self.end_pos is not None or (self.error is not None and self.start_pos is None)


@dataclass(frozen=True)
class QueuedMark:
    name: str


@dataclass
class FrameResult:
    status: FrameStatus
    frame: bytes | None = None
    before: list[SessionEvent] = field(default_factory=list)
    after: list[SessionEvent] = field(default_factory=list)


class Playback:
    """The queue of one session; see the module docstring.

    ``sample_rate`` and ``frame_bytes`` describe the PCM in the ring (16-bit mono).
    """

    def __init__(
        self,
        *,
        sample_rate: int,
        frame_bytes: int,
        max_items: int = 256,
        boundaries: BoundarySource | None = None,
    ) -> None:
        self.sample_rate = sample_rate
        self._boundaries = boundaries
        self.frame_bytes = frame_bytes
        self.max_items = max_items
        self._queue: deque[QueuedUtterance | QueuedMark] = deque()
        self._by_seq: dict[int, QueuedUtterance] = {}
        self._cancels_outstanding = 0
        # Per-utterance figures of the last finished utterance (for metrics).
        self.finished: list[QueuedUtterance] = []

    # --- queue ------------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        return not self._queue

    @property
    def full(self) -> bool:
        return len(self._queue) >= self.max_items

    def __len__(self) -> int:
        return len(self._queue)

    def enqueue_utterance(self, seq: int, utterance_id: str, now: float) -> None:
        item = QueuedUtterance(seq, utterance_id, requested_at=now)
        if not self._queue:
            item.head_at = now
        self._queue.append(item)
        self._by_seq[seq] = item

    def enqueue_mark(self, name: str) -> None:
        self._queue.append(QueuedMark(name))

    def pending_utterance_ids(self) -> list[str]:
        return [i.utterance_id for i in self._queue if isinstance(i, QueuedUtterance)]

    # --- engine events ----------------------------------------------------------------

    def on_audio(self, seq: int, start_pos: int, now: float) -> None:
        item = self._by_seq.get(seq)
        if item is not None and item.start_pos is None:
            item.start_pos = start_pos
            item.audio_ready_at = now

    def on_end(self, seq: int, start_pos: int, end_pos: int, samples: int) -> None:
        item = self._by_seq.get(seq)
        if item is None:
            return
        if item.start_pos is None and end_pos > start_pos:
            item.start_pos = start_pos
        item.end_pos = end_pos
        item.samples = samples

    def on_failed(
        self, seq: int, code: str, message: str, start_pos: int | None, end_pos: int | None
    ) -> None:
        item = self._by_seq.get(seq)
        if item is None:
            return
        item.error = ErrorEvent(
            code=ErrorCode.from_engine(code), message=message, utterance_id=item.utterance_id
        )
        if start_pos is not None and end_pos is not None:
            item.start_pos = item.start_pos if item.start_pos is not None else start_pos
            item.end_pos = end_pos

    def drop(self, seq: int) -> None:
        """Remove utterance ``seq`` before any of it played (it never reached the engine)."""
        item = self._by_seq.pop(seq, None)
        if item is None or item.first_frame_at is not None:
            return
        was_head = bool(self._queue) and self._queue[0] is item
        self._queue.remove(item)
        if was_head and self._queue:
            nxt = self._queue[0]
            if isinstance(nxt, QueuedUtterance) and nxt.head_at is None:
                nxt.head_at = item.head_at

    # --- clear (barge-in) ---------------------------------------------------------------

    def clear(self) -> list[SessionEvent]:
        """Drop everything queued; marks are reported as cleared, in order.

        Until :meth:`on_cancelled` reports where the cancelled audio ends, no frame is
        produced (the ring may still hold audio of dropped utterances).
        """
        events: list[SessionEvent] = [
            MarkReached(item.name, cleared=True)
            for item in self._queue
            if isinstance(item, QueuedMark)
        ]
        self._queue.clear()
        self._by_seq.clear()
        self._cancels_outstanding += 1
        return events

    def on_cancelled(self, ring: RingReader, write_pos: int) -> None:
        ring.discard_until(write_pos)
        self._cancels_outstanding = max(0, self._cancels_outstanding - 1)

    def cancel_failed(self) -> None:
        self._cancels_outstanding = max(0, self._cancels_outstanding - 1)

    # --- frames -----------------------------------------------------------------------

    def next_frame(self, ring: RingReader, now: float) -> FrameResult:
        """At most one frame of PCM, with the events that precede and follow it."""
        result = FrameResult(FrameStatus.IDLE)
        if self._cancels_outstanding:
            result.status = FrameStatus.WAITING
            return result
        # Before the frame: marks, and utterances that finished without another frame.
        while self._queue:
            head = self._queue[0]
            if isinstance(head, QueuedMark):
                self._pop(now)
                result.before.append(MarkReached(head.name))
                continue
            status = self._frame_from(head, ring, now, result)
            if status is FrameStatus.IDLE:
                self._finish(head, now, result.before)
                continue
            if status is not FrameStatus.FRAME:
                result.status = status
                return result
            break
        else:
            return result
        # After the frame: the utterance it ended, and the marks right behind it.
        result.status = FrameStatus.FRAME
        if head.end_pos is not None and ring.read_pos >= head.end_pos:
            self._finish(head, now, result.after)
            while self._queue and isinstance(self._queue[0], QueuedMark):
                mark = self._queue[0]
                self._pop(now)
                result.after.append(MarkReached(mark.name))
        return result

    def _frame_from(
        self, head: QueuedUtterance, ring: RingReader, now: float, result: FrameResult
    ) -> FrameStatus:
        if head.start_pos is None:
            return FrameStatus.IDLE if head.ended else FrameStatus.WAITING
        if ring.read_pos < head.start_pos:
            ring.discard_until(head.start_pos)  # leftovers of dropped work
        write_pos = ring.write_pos  # before the boundaries: see engine.ipc.boundaries
        if head.end_pos is None:
            self._drain_boundaries()
        # Until its end is known, every byte written belongs to the head utterance.
        limit = write_pos if head.end_pos is None else min(head.end_pos, write_pos)
        available = max(0, limit - ring.read_pos)
        if available >= self.frame_bytes:
            frame = ring.read(self.frame_bytes)
        elif head.end_pos is not None and available > 0:
            frame = ring.read(available) + bytes(self.frame_bytes - available)  # pad the tail
        elif head.end_pos is not None:
            return FrameStatus.IDLE
        else:
            return FrameStatus.STARVED if head.first_frame_at is not None else FrameStatus.WAITING
        if head.first_frame_at is None:
            head.first_frame_at = now
            result.before.append(UtteranceStarted(head.utterance_id))
        result.frame = frame
        return FrameStatus.FRAME

    def _drain_boundaries(self) -> None:
        if self._boundaries is None:
            return
        for seq, end_pos in self._boundaries.drain():
            item = self._by_seq.get(seq)
            if item is not None and item.end_pos is None:
                item.end_pos = end_pos

    def _finish(self, head: QueuedUtterance, now: float, events: list[SessionEvent]) -> None:
        # Read the boundary records once per utterance even when the engine's UtteranceEnd
        # told us the end first (the usual case for a short prompt): the ring is bounded,
        # and an engine that cannot publish a boundary stops writing the stream's audio.
        self._drain_boundaries()
        self._pop(now)
        if head.error is not None:
            events.append(head.error)
        samples = head.samples
        if samples is None:  # ended by a boundary record or a failure: count the bytes
            span = (head.end_pos or 0) - (head.start_pos or 0)
            samples = max(0, span) // 2
        first_audio_ms = None
        if head.first_frame_at is not None:
            since = head.head_at if head.head_at is not None else head.requested_at
            first_audio_ms = round((head.first_frame_at - max(since, head.requested_at)) * 1000)
        events.append(
            UtteranceDone(
                utterance_id=head.utterance_id,
                audio_ms=round(samples * 1000 / self.sample_rate),
                first_audio_ms=first_audio_ms,
            )
        )
        self.finished.append(head)

    def _pop(self, now: float) -> None:
        item = self._queue.popleft()
        if isinstance(item, QueuedUtterance):
            self._by_seq.pop(item.seq, None)
        if self._queue:
            nxt = self._queue[0]
            if isinstance(nxt, QueuedUtterance) and nxt.head_at is None:
                nxt.head_at = now
