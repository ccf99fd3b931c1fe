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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

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
    #: Where its first segment came from: "hit" (the engine's speech cache), "miss"
    #: (synthesized), "" (the engine has no cache).
    cache: str = ""
    error: ErrorEvent | None = None
    frames_sent: int = 0
    words: list[Word] = field(default_factory=list)  # timed by the engine, in order
    words_sent: int = 0  # of ``words``, already in a Words event

    @property
    def ended(self) -> bool:
        """Its end is known: the engine said so, or a boundary record did once its start
        is known too (a record can be visible before the first-audio message arrives)."""
        if self.error is not None and self.start_pos is None:
            return True
        return self.end_pos is not None and (self.samples is not None or self.start_pos is not None)


@dataclass(frozen=True)
class QueuedMark:
    name: str

    def reached(self, *, cleared: bool = False) -> SessionEvent:
        return MarkReached(self.name, cleared=cleared)


@dataclass(frozen=True)
class QueuedFlush:
    """A ``flush``: answered once everything queued before it was sent (or cleared)."""

    flush_id: str | None

    def reached(self, *, cleared: bool = False) -> SessionEvent:
        return Flushed(self.flush_id)


QueuedMarker = QueuedMark | QueuedFlush


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
        emit_words: bool = False,
    ) -> None:
        self.sample_rate = sample_rate
        self.frame_ms = frame_bytes * 1000 // (2 * sample_rate)
        self.emit_words = emit_words  # ``start.timestamps: "word"``
        self._boundaries = boundaries
        self.frame_bytes = frame_bytes
        self.max_items = max_items
        self._queue: deque[QueuedUtterance | QueuedMarker] = deque()
        self._by_seq: dict[int, QueuedUtterance] = {}
        # Cancelled utterances whose audio the engine writes (or wrote) to the ring: read
        # past it as it comes, or the ring fills and the engine stalls on this stream.
        self._skipped: dict[int, QueuedUtterance] = {}
        self._cancels_outstanding = 0
        # Per-utterance figures of the last finished utterance (for metrics).
        self.finished: list[QueuedUtterance] = []

    # --- queue ------------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        return not self._queue

    @property
    def skipping(self) -> bool:
        """Audio of cancelled utterances is still to be read past."""
        return bool(self._skipped)

    @property
    def full(self) -> bool:
        """No room: cancelled utterances the engine still works on count too, so that a
        speak-and-cancel loop cannot queue engine work without bound."""
        return len(self._queue) + len(self._skipped) >= self.max_items

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

    def enqueue_flush(self, flush_id: str | None) -> None:
        self._queue.append(QueuedFlush(flush_id))

    def seq_of(self, utterance_id: str) -> int | None:
        """The ``seq`` of the queued utterance ``utterance_id``, if any."""
        return next(
            (
                i.seq
                for i in self._queue
                if isinstance(i, QueuedUtterance) and i.utterance_id == utterance_id
            ),
            None,
        )

    def pending_utterance_ids(self) -> list[str]:
        return [i.utterance_id for i in self._queue if isinstance(i, QueuedUtterance)]

    # --- engine events ----------------------------------------------------------------

    def _item(self, seq: int) -> QueuedUtterance | None:
        return self._by_seq.get(seq) or self._skipped.get(seq)

    def on_audio(self, seq: int, start_pos: int, now: float, cache: str = "") -> None:
        item = self._item(seq)
        if item is not None and item.start_pos is None:
            item.start_pos = start_pos
            item.audio_ready_at = now
            item.cache = cache

    def on_words(self, seq: int, words: Sequence[Word]) -> None:
        """The engine timed the words of one segment of ``seq`` (ms from its start)."""
        item = self._item(seq)
        if item is not None:
            item.words.extend(words)

    def played(self, item: QueuedUtterance) -> Played:
        """What of ``item`` went out: its frames, and the words begun within them."""
        played_ms = item.frames_sent * self.frame_ms
        text = (
            " ".join(w.text for w in item.words if w.start_ms < played_ms) if item.words else None
        )
        return Played(item.utterance_id, played_ms, text)

    def playing(self) -> Played | None:
        """The utterance at the head, if some of it went out (for a barge-in or clear)."""
        head = self._queue[0] if self._queue else None
        if isinstance(head, QueuedUtterance) and head.first_frame_at is not None:
            return self.played(head)
        return None

    def head_source(self) -> str:
        """Where the utterance at the head got its first audio: "hit" (the engine's speech
        cache), "join" (a synthesis in flight for another call), "miss" (its own
        synthesis); "" when not known."""
        head = self._queue[0] if self._queue else None
        return head.cache if isinstance(head, QueuedUtterance) else ""

    def _words_begun(self, item: QueuedUtterance, events: list[SessionEvent]) -> None:
        """A Words event for the words whose audio has started going out."""
        if not self.emit_words:
            return
        sent_ms = item.frames_sent * self.frame_ms
        begun = item.words_sent
        while begun < len(item.words) and item.words[begun].start_ms < sent_ms:
            begun += 1
        if begun > item.words_sent:
            events.append(Words(item.utterance_id, tuple(item.words[item.words_sent : begun])))
            item.words_sent = begun

    def on_end(self, seq: int, start_pos: int, end_pos: int, samples: int) -> None:
        item = self._item(seq)
        if item is None:
            return
        if item.start_pos is None and end_pos > start_pos:
            item.start_pos = start_pos
        item.end_pos = end_pos
        item.samples = samples

    def on_failed(
        self, seq: int, code: str, message: str, start_pos: int | None, end_pos: int | None
    ) -> None:
        item = self._item(seq)
        if item is None:
            return
        item.error = ErrorEvent(
            code=ErrorCode.from_engine(code), message=message, utterance_id=item.utterance_id
        )
        if start_pos is not None and end_pos is not None:
            item.start_pos = item.start_pos if item.start_pos is not None else start_pos
            item.end_pos = end_pos
        elif item.start_pos is None and self._skipped.get(seq) is item:
            del self._skipped[seq]  # cancelled, then failed before any audio: nothing to skip

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

    def cancel(
        self, utterance_id: str, *, in_engine: bool = True, now: float = 0.0
    ) -> tuple[int, list[SessionEvent]] | None:
        """Drop one queued or playing utterance; None when no such utterance is queued.

        Returns its ``seq`` and the events that end it: ``utterance_done`` with
        ``cancelled`` and the audio sent of it so far. ``in_engine``: its text reached the
        engine, which writes its audio to the ring regardless; that audio is read past as
        it arrives, once no live utterance comes before it (:meth:`_skip_cancelled`).
        """
        item = next(
            (
                i
                for i in self._queue
                if isinstance(i, QueuedUtterance) and i.utterance_id == utterance_id
            ),
            None,
        )
        if item is None:
            return None
        was_head = self._queue[0] is item
        self._queue.remove(item)
        self._by_seq.pop(item.seq, None)
        if in_engine and not (item.ended and item.start_pos is None):
            self._skipped[item.seq] = item
        if was_head and self._queue:
            nxt = self._queue[0]
            if isinstance(nxt, QueuedUtterance) and nxt.head_at is None:
                # it waited behind a prompt that played: its wait starts now
                nxt.head_at = now if item.first_frame_at is not None else item.head_at
        first_audio_ms = None
        if item.first_frame_at is not None:
            since = max(item.head_at or item.requested_at, item.requested_at)
            first_audio_ms = round((item.first_frame_at - since) * 1000)
        done = UtteranceDone(
            utterance_id=item.utterance_id,
            audio_ms=item.frames_sent * self.frame_ms,
            first_audio_ms=first_audio_ms,
            cancelled=True,
            played=self.played(item),
        )
        return item.seq, [done]

    # --- clear (barge-in) ---------------------------------------------------------------

    def clear(self) -> list[SessionEvent]:
        """Drop everything queued; marks are reported as cleared (and flushes as done),
        in order.

        Until :meth:`on_cancelled` reports where the cancelled audio ends, no frame is
        produced (the ring may still hold audio of dropped utterances).
        """
        events: list[SessionEvent] = [
            item.reached(cleared=True)
            for item in self._queue
            if isinstance(item, QueuedMark | QueuedFlush)
        ]
        self._queue.clear()
        self._by_seq.clear()
        self._skipped.clear()  # the engine's cancel confirms where all of it ends
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
        if self._skipped:
            self._skip_cancelled(ring)
        # Before the frame: marks, and utterances that finished without another frame.
        while self._queue:
            head = self._queue[0]
            if isinstance(head, QueuedMark | QueuedFlush):
                self._pop(now)
                result.before.append(head.reached())
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
        if head.end_pos is not None and ring.read_pos >= head.end_pos and self._complete(head):
            self._finish(head, now, result.after)
            while self._queue and isinstance(self._queue[0], QueuedMark | QueuedFlush):
                marker = self._queue[0]
                self._pop(now)
                result.after.append(marker.reached())
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
            return FrameStatus.IDLE if self._complete(head) else FrameStatus.WAITING
        else:
            return FrameStatus.STARVED if head.first_frame_at is not None else FrameStatus.WAITING
        if head.first_frame_at is None:
            head.first_frame_at = now
            result.before.append(UtteranceStarted(head.utterance_id))
        head.frames_sent += 1
        self._words_begun(head, result.before)
        result.frame = frame
        return FrameStatus.FRAME

    def _complete(self, head: QueuedUtterance) -> bool:
        """All of ``head``'s audio is out, and, when words are wanted, the engine's end
        message has come too: it follows the utterance's last words on the socket, while
        the boundary record that told us the end may be visible before them."""
        return not self.emit_words or head.samples is not None or head.error is not None

    def _skip_cancelled(self, ring: RingReader) -> None:
        """Read past the audio of cancelled utterances that precede every live one in
        the ring (the engine writes a stream's utterances in order). Until a cancelled
        utterance's end is known, everything written belongs to it or to an earlier
        cancelled one (the boundary protocol: ``write_pos`` is read before the
        boundaries, see :mod:`engine.ipc.boundaries`)."""
        live = [i for i in self._queue if isinstance(i, QueuedUtterance)]
        first_live = min(live, key=lambda i: i.seq) if live else None
        write_pos = ring.write_pos
        self._drain_boundaries()
        if first_live is not None and first_live.start_pos is not None:
            write_pos = min(write_pos, first_live.start_pos)  # never past live audio
        for seq in sorted(self._skipped):
            if first_live is not None and seq > first_live.seq:
                return  # its audio comes after a live utterance's
            item = self._skipped[seq]
            if item.start_pos is None:
                if item.samples is not None or item.error is not None:
                    del self._skipped[seq]  # it ended without audio: nothing to skip
                    continue
                return  # its audio (if any) is not announced yet: read nothing
            if item.end_pos is None:
                ring.discard_until(max(ring.read_pos, write_pos))
                return
            if ring.read_pos < item.end_pos:
                ring.discard_until(min(item.end_pos, write_pos))
                if ring.read_pos < item.end_pos:
                    return
            del self._skipped[seq]

    def _drain_boundaries(self) -> None:
        if self._boundaries is None:
            return
        for seq, end_pos in self._boundaries.drain():
            item = self._item(seq)
            if item is not None and item.end_pos is None:
                item.end_pos = end_pos

    def _finish(self, head: QueuedUtterance, now: float, events: list[SessionEvent]) -> None:
        # Read the boundary records once per utterance even when the engine's UtteranceEnd
        # told us the end first (the usual case for a short prompt): the ring is bounded,
        # and an engine that cannot publish a boundary stops writing the stream's audio.
        self._drain_boundaries()
        self._pop(now)
        self._words_begun(head, events)  # words timed only after their audio went out
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
                played=self.played(head),
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
