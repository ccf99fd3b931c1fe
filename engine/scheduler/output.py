"""The scheduler's output: a stream's audio into its ring (the rest into ``pending``
while the ring is full), utterance boundaries, the events that tell the owner where each
utterance starts and ends and when its words are spoken, and failures. Runs on the
coordinator thread, the rings' only writer."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from engine.backends.base import WordTiming
from engine.ipc.schema import (
    Message,
    UtteranceAudio,
    UtteranceEnd,
    UtteranceFailed,
    UtteranceWords,
    WordTime,
)
from engine.scheduler.state import StatsCounter, Stream, Utterance, held

MAX_WORD_CHARS = 64  # a "word" longer than this (a URL read out) is cut in the event

# Events are routed by the server: (owner token, message).
EventSink = Callable[[object, Message], None]
# A segment's words: (text, start_ms, end_ms) from the segment's start (as cached).
RelativeWords = tuple[tuple[str, int, int], ...]


def relative_words(words: Sequence[WordTiming]) -> RelativeWords:
    """A segment's words in whole ms from its start, each cut to MAX_WORD_CHARS."""
    return tuple(
        (w.text[:MAX_WORD_CHARS], round(w.start_s * 1000), round(w.end_s * 1000)) for w in words
    )


def duration_ms(samples: int, sample_rate: int) -> int:
    """A segment's length in whole ms (its successor's words start that much later)."""
    return round(samples * 1000 / sample_rate)


class OutputWriter:
    def __init__(self, on_event: EventSink, stats: StatsCounter) -> None:
        self._on_event = on_event
        self._stats = stats

    def write(self, stream: Stream, utterance: Utterance, pcm: bytes) -> None:
        """Audio of ``utterance`` (the stream's head), at the stream's rate."""
        if not pcm:
            return
        if utterance.start_pos is None:
            utterance.start_pos = stream.ring.write_pos + len(stream.pending)
        utterance.samples += len(pcm) // 2
        seconds = len(pcm) / stream.bytes_per_second
        self._stats.audio(len(pcm) // 2, seconds)
        if stream.busy:  # a segment in flight heard in pieces: less of it still to come
            stream.busy_audio_s = max(0.0, stream.busy_audio_s - seconds)
            stream.busy_began = True
        if stream.record is not None:
            stream.record.pcm += pcm
        if stream.pending or utterance.held:
            stream.pending += pcm
        else:
            written = self._to_ring(stream, pcm)
            if written < len(pcm):
                stream.pending += pcm[written:]
        self._announce(stream, utterance)

    def flush(self, stream: Stream) -> bool:
        """Move what waits for ring space (boundaries, then audio; not the audio of a head
        utterance held back) into the rings and end every head utterance that is
        complete; True while some still waits."""
        while stream.pending_boundaries and stream.boundaries.append(*stream.pending_boundaries[0]):
            stream.pending_boundaries.popleft()
        if stream.pending and not held(stream):
            written = self._to_ring(stream, stream.pending)
            if written:
                del stream.pending[:written]
        # Several utterances may finish in one pass (empty ones queued behind).
        while stream.utterances:
            utterance = stream.utterances[0]
            self._announce(stream, utterance)
            if not self._maybe_finish(stream, utterance):
                break
        return bool(stream.pending or stream.pending_boundaries)

    def words(
        self,
        stream: Stream,
        utterance: Utterance,
        offset_ms: int,
        words: RelativeWords,
        source: str = "estimate",
    ) -> None:
        """Tell the stream's owner the words of the segment that started at ``offset_ms``
        of the utterance's audio (``words``: ms from the segment's start)."""
        if not words:
            return
        self._on_event(
            stream.owner,
            UtteranceWords(
                stream_id=stream.stream_id,
                utterance=utterance.seq,
                words=tuple(WordTime(t, offset_ms + s, offset_ms + e) for t, s, e in words),
                source=source,
            ),
        )

    def fail(self, stream: Stream, utterance: Utterance, code: str, message: str) -> None:
        """Drop ``utterance``. Audio of it already in the ring ends at ``end_pos``."""
        end_pos: int | None = None
        if stream.utterances and stream.utterances[0] is utterance:
            stream.record = None  # its segment in synthesis is not cached
            stream.pending.clear()  # only the head utterance has output in flight
            stream.renew_resampler()
            if utterance.announced:
                end_pos = stream.ring.write_pos
                self._publish_boundary(stream, utterance.seq, end_pos)
        if utterance in stream.utterances:
            stream.utterances.remove(utterance)
        stream.failed.append(utterance.seq)
        self._on_event(
            stream.owner,
            UtteranceFailed(
                stream_id=stream.stream_id,
                utterance=utterance.seq,
                code=code,
                message=message,
                start_pos=utterance.start_pos if utterance.announced else None,
                end_pos=end_pos,
            ),
        )

    @staticmethod
    def _to_ring(stream: Stream, data: bytes | bytearray) -> int:
        written = stream.ring.write(data)
        if stream.tap is not None and written:
            stream.tap.write(data[:written])
        return written

    def _announce(self, stream: Stream, utterance: Utterance) -> None:
        if (
            not utterance.announced
            and utterance.start_pos is not None
            and stream.ring.write_pos > utterance.start_pos
        ):
            utterance.announced = True
            self._on_event(
                stream.owner,
                UtteranceAudio(
                    stream_id=stream.stream_id,
                    utterance=utterance.seq,
                    start_pos=utterance.start_pos,
                    cache=utterance.cache,
                ),
            )

    def _maybe_finish(self, stream: Stream, utterance: Utterance) -> bool:
        """End the head ``utterance`` if all of it is in the ring; True if it ended."""
        if not utterance.final or utterance.segments or stream.busy:
            return False
        if not utterance.tail_flushed:
            utterance.tail_flushed = True
            self.write(stream, utterance, stream.resampler.flush())
        if stream.pending:
            return False
        self._announce(stream, utterance)
        end = stream.ring.write_pos
        start = utterance.start_pos if utterance.start_pos is not None else end
        if end > start:
            self._publish_boundary(stream, utterance.seq, end)
        stream.utterances.popleft()  # the resampler was cleared by its flush() above
        self._on_event(
            stream.owner,
            UtteranceEnd(
                stream_id=stream.stream_id,
                utterance=utterance.seq,
                start_pos=start,
                end_pos=end,
                samples=utterance.samples,
            ),
        )
        return True

    @staticmethod
    def _publish_boundary(stream: Stream, seq: int, end_pos: int) -> None:
        """Record where ``seq`` ends before any later audio enters the ring."""
        if stream.pending_boundaries or not stream.boundaries.append(seq, end_pos):
            stream.pending_boundaries.append((seq, end_pos))
