"""The speech cache as the coordinator's streams meet it: a segment becoming a stream's
next work is looked up (the memory level, then a synthesis of it in flight, then the
shared level) before any capacity cut, and a completed segment is stored if it may be.
Coordinator thread only (the shared level's answers come back as
:class:`~engine.scheduler.commands.Fetched` results).

- **Memory hit**: written to the stream's ring at once, through the same output path as
  synthesized audio; it never enters a lane (docs/speech-cache.md "Scheduling").
- **Join**: the segment is being synthesized for another stream of the same key (the
  same scope: engine/scheduler/flights.py): this stream hears that synthesis, from what
  was produced so far on, instead of another one.
- **Shared level**: one lookup per key at a time; streams asking for a key being looked
  up wait on that lookup (a burst of callers of one prompt costs one lookup).
- **Store**: a complete segment is put only if it may be kept
  (engine/scheduler/retention.py); a segment the capacity fit cut is stored whole once
  its last piece has played (``CutSegment``).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import islice
from typing import Literal

from engine.backends.base import estimate_words
from engine.scheduler import policy
from engine.scheduler.commands import Fetched
from engine.scheduler.flights import Flight, FlightTable, Listener
from engine.scheduler.lanes import Segment, take_segment
from engine.scheduler.output import OutputWriter, RelativeWords, duration_ms, relative_words
from engine.scheduler.retention import may_keep
from engine.scheduler.state import StatsCounter, Stream, Utterance
from engine.speech_cache import CachedSegment, SegmentKey, SpeechCache

Put = Callable[[Fetched], None]
Touch = Callable[[int], None]  # a stream's slot needs the coordinator's attention
#: How a stream's new utterance may start with this many seconds of cached audio, due
#: when (monotonic: a flight's, joined; None: it is in the cache): its later segments
#: must then follow in time (Policy.cached_start).
MayStart = Callable[[Stream, float, float | None], policy.CachedStart]
#: What :meth:`CachePath.join` did with a stream whose next segment is in flight for
#: another: "joined" it, or the stream "waits" to (its start is not admitted yet), or
#: "no" flight of it may be joined.
JoinOutcome = Literal["joined", "waits", "no"]


class CachePath:
    def __init__(
        self,
        cache: SpeechCache,
        flights: FlightTable,
        output: OutputWriter,
        counters: StatsCounter,
        put: Put,
        touch: Touch,
        may_start: MayStart,
    ) -> None:
        self._cache = cache
        self._may_start = may_start
        self._flights = flights
        self._output = output
        self._counters = counters
        self._put = put
        self._touch = touch
        self._tokens = 0  # the last shared-level lookup's token
        self._looking: dict[str, int] = {}  # key digest -> the token of its lookup out
        self._waiting: dict[int, list[Stream]] = {}  # token -> the streams it answers

    # --- lookups ---------------------------------------------------------------------

    def serve(self, streams: list[Stream]) -> bool:
        """Look up the next segment of every stream that has one to look up; True if
        one was played from memory or joined a flight (more may be done at once)."""
        if not self._cache.enabled:
            return False
        served = False
        for stream in streams:
            while policy.lookup_ready(stream):
                if not self._look_up(stream):
                    break
                served = True
        return served

    def _look_up(self, stream: Stream) -> bool:
        """Look up the next segment of ``stream``; True if it plays now (memory, join)."""
        head = stream.utterances[0]
        assert head.keys is not None
        key = head.keys.key(head.segments[0])
        held = self._cache.peek_local(key)
        if held is not None and not self._may_play(stream, head, held):
            if head.segments[0] in head.private and head.keys.key(head.segments[0]) != key:
                return self._look_up(stream)  # spoken whole: that is looked up
            return False  # it waits, or goes to synthesis
        segment = self._cache.get_local(key)
        if segment is not None:
            self.play_cached(stream, head, segment)
            return True
        joined = self.join(stream)
        if joined != "no":
            return joined == "joined"
        if not self._cache.has_shared:
            head.checked = True
            return False
        digest = key.digest()
        token = self._looking.get(digest)
        if token is None:
            self._tokens += 1
            token = self._looking[digest] = self._tokens
            self._waiting[token] = []
            put = self._put

            def answer(found_key: SegmentKey, found: CachedSegment | None) -> None:
                put(Fetched(token, found_key, found))

            self._cache.fetch(key, answer)
        stream.fetching = token
        self._waiting[token].append(stream)
        return False

    def take_fetched(self, fetched: Fetched) -> None:
        """A shared-level answer: played by every stream still waiting for it (not
        cancelled, closed or moved on meanwhile), else their segment goes to synthesis."""
        self._looking.pop(fetched.key.digest(), None)
        for stream in self._waiting.pop(fetched.token, []):
            if stream.fetching != fetched.token:
                continue  # cancelled meanwhile: its answer is dropped
            stream.fetching = 0
            self._touch(stream.slot)
            head = stream.utterances[0] if stream.utterances else None
            if head is None or not head.segments or head.keys is None:
                continue
            if head.keys.key(head.segments[0]) != fetched.key:
                continue  # its next segment changed meanwhile: looked up again
            if fetched.segment is None:
                head.checked = True
            elif self._may_play(stream, head, fetched.segment):
                self.play_cached(stream, head, fetched.segment)
            # else it waits (in memory now, looked up again when it may play), or it is
            # spoken whole

    def _may_play(self, stream: Stream, head: Utterance, segment: CachedSegment) -> bool:
        """Whether the cached next segment of ``stream`` may play now. A new utterance
        starts with it only when the rest can follow in time (Policy.cached_start):
        otherwise it waits; when even a free lane could not follow it, the cached words
        and the personal rest after them are joined back into the one segment they were
        cut from (not to be kept: it carries the rest's data), to be looked up and
        synthesized as any new segment, or, not cut from one, it is synthesized as if it
        were not cached (``head.checked``)."""
        start = self._may_start(stream, len(segment.pcm) / stream.bytes_per_second, None)
        if start == "whole":
            self._speak_whole(stream, head)
        return start == "play"

    def _speak_whole(self, stream: Stream, head: Utterance) -> None:
        """``head`` (``stream``'s new utterance) is not to start with its next segment
        alone (Policy.cached_start said "whole"): that segment and the personal rest
        after it become the one segment they were cut from (not to be kept: it carries
        the rest's data), or, not cut from one, the next segment goes to synthesis
        (``head.checked``)."""
        pair = (head.segments[0], head.segments[1]) if len(head.segments) > 1 else None
        whole = head.wholes.get(pair) if pair is not None else None
        if whole is None:
            head.checked = True
        else:
            head.segments.popleft()
            head.segments[0] = whole
            head.private.add(whole)
        self._touch(stream.slot)

    def play_cached(self, stream: Stream, utterance: Utterance, segment: CachedSegment) -> None:
        """Play the next segment of ``utterance`` (the stream's head) from the cache: its
        audio into the ring (or ``pending``), its words, as its synthesis gave them."""
        text = utterance.segments.popleft()
        utterance.checked = False
        if not utterance.cache:
            utterance.cache = "hit"
        offset_ms = utterance.words_ms
        self._output.write(stream, utterance, segment.pcm)
        source = "engine" if stream.lane.times_words else "estimate"
        self._output.words(stream, utterance, offset_ms, segment.words, source)
        utterance.words_ms = offset_ms + duration_ms(len(segment.pcm) // 2, stream.sample_rate)
        self.add_to_cut(stream, utterance, segment)
        seconds = len(segment.pcm) / stream.bytes_per_second
        self._counters.cached(1, seconds)
        if text in utterance.prefixes:
            self._counters.prefix_hit(seconds)
        self._touch(stream.slot)

    # --- flights ---------------------------------------------------------------------

    def joins(self, stream: Stream) -> bool:
        """Whether ``stream``'s next segment is left to a synthesis in flight for another
        (:meth:`join`: joined, or it waits to): not to be synthesized for it."""
        return self.join(stream) != "no"

    def join(self, stream: Stream, *, admitted: bool = False) -> JoinOutcome:
        """Let ``stream`` hear the synthesis in flight of its next segment, if there is
        one it may join (the same key; never for ``cache: false``): what was produced so
        far at once, the rest as it comes. A new utterance whose rest is personal (never
        anyone else's synthesis) joins only as it would start from the cache
        (Policy.cached_start, its audio due when the flight is): it "waits" until its rest
        can follow without a gap, or is spoken whole; ``admitted``: its start was weighed
        already (the scheduler's choice, Policy.can_start)."""
        head = stream.utterances[0]
        if head.keys is None or not head.retain:
            return "no"
        flight = self._flights.joinable(head.keys.key(head.segments[0]))
        if flight is None:
            return "no"
        if not admitted and _rest_is_personal(head) and policy.is_new(stream):
            start = self._may_start(stream, flight.expected_audio_s, flight.expected_end)
            if start == "whole":
                self._speak_whole(stream, head)
            if start != "play":
                return "waits"
        segment = take_segment(stream, record=False)
        if not head.cache:
            head.cache = "join"
        self.listen(flight, stream, head, segment, joined=True)
        if flight.pcm:
            self._output.write(stream, head, bytes(flight.pcm))
        if flight.words is not None:
            self._tell(flight.listeners[-1], flight.words)
        return "joined"

    def listen(
        self,
        flight: Flight,
        stream: Stream,
        utterance: Utterance,
        segment: Segment,
        *,
        joined: bool,
    ) -> None:
        """``stream`` hears ``flight`` as ``segment`` of ``utterance``: it is in flight
        (busy) until the flight ends, as the lane expects the flight to end."""
        flight.listeners.append(Listener(stream, utterance, segment, stream.generation, joined))
        flight.joins += joined
        stream.flight = flight
        stream.busy = True
        if joined:
            stream.busy_until = flight.expected_end
            stream.busy_audio_s = flight.expected_audio_s
            stream.busy_paced, stream.busy_began = flight.paced, False
        self._touch(stream.slot)

    def flight_audio(self, flight: Flight, pcm: bytes) -> bool:
        """A worker's audio of ``flight``: to every listener; False when nobody wants it
        any more (the caller stops the flight)."""
        flight.pcm += pcm
        for listener in flight.live():
            self._output.write(listener.stream, listener.utterance, pcm)
            self._touch(listener.stream.slot)
        return flight.wanted

    def flight_words(self, flight: Flight, words: RelativeWords) -> None:
        flight.words = words
        for listener in flight.live():
            self._tell(listener, words)

    def _tell(self, listener: Listener, words: RelativeWords) -> None:
        listener.told = True
        self._output.words(listener.stream, listener.utterance, listener.segment.offset_ms,
                           words, "engine")  # fmt: skip

    def flight_ended(self, flight: Flight, complete: bool) -> CachedSegment | None:
        """``flight``'s batch ended, ``complete`` (not failed, not stopped): stored once
        if every listener may keep it (and the warm-ups waiting, which declared it); each
        current listener's segment then completes. The stored segment, or None."""
        for listener in flight.listeners:
            if listener.stream.flight is flight:
                listener.stream.flight = None
                listener.stream.busy = False
                self._touch(listener.stream.slot)
        if not complete:
            return None
        key = flight.key
        samples = len(flight.pcm) // 2
        words = flight.words
        if words is None:
            words = relative_words(estimate_words(flight.text, samples / key.sample_rate))
        cached = CachedSegment(bytes(flight.pcm), words)
        keep = all(
            self.may_keep(listener.utterance, key, listener.segment.text)
            for listener in flight.listeners
        )
        if keep:
            since = min((listener.stream.cache_epoch for listener in flight.listeners),
                        default=None)  # fmt: skip
            epochs = [job.request.epoch for job in flight.warm if job.request.epoch is not None]
            if epochs:
                since = min([*epochs, *([since] if since is not None else [])])
            self._cache.put(key, cached, since=since)
        audio_s = samples / key.sample_rate
        for listener in flight.live():
            stream = listener.stream
            if listener.joined:
                self._counters.joined(audio_s)
            policy.observe_audio(stream.lane, stream, audio_s, len(flight.text))
            self.segment_done(stream, listener.utterance, listener.segment, words,
                              told=listener.told, piece=cached if keep else None,
                              store=False)  # fmt: skip
        return cached if keep else None

    # --- completion and storing --------------------------------------------------------

    def record_done(
        self,
        stream: Stream,
        utterance: Utterance,
        segment: Segment,
        timed: RelativeWords | None,
        *,
        told: bool,
        cancelled: bool,
    ) -> None:
        """``segment``, synthesized for ``stream`` alone, is complete and wanted: what its
        ring got (the stream's record) is stored unless it was cut short. A cancel bumps
        the slot's generation before its command comes (``cancelled``): a worker that saw
        the bump stopped mid-segment, and its batch may end before the command is
        applied; such a segment is never stored."""
        record, stream.record = stream.record, None
        whole = record is not None and record.key == segment.key and not cancelled
        piece = CachedSegment(bytes(record.pcm)) if whole and record is not None else None
        self.segment_done(stream, utterance, segment, timed, told=told, piece=piece, store=True)

    def segment_done(
        self,
        stream: Stream,
        utterance: Utterance,
        segment: Segment,
        timed: RelativeWords | None,
        *,
        told: bool,
        piece: CachedSegment | None,
        store: bool,
    ) -> None:
        """``segment`` of ``utterance`` (the stream's head) is complete: its words
        (``timed`` by the backend, already ``told`` to the owner, else estimated now),
        where the next segment's words start; ``piece``: its audio as it may be cached
        (None: cut short, or not to be kept), put in the cache when ``store`` and it may
        be kept, and added to the segment the capacity fit cut, if it is a piece of one."""
        samples = utterance.samples - segment.start_samples
        if timed is None:
            words = relative_words(estimate_words(segment.text, samples / stream.sample_rate))
            self._output.words(stream, utterance, segment.offset_ms, words)
        else:
            words = timed
            if not told:
                self._output.words(stream, utterance, segment.offset_ms, words, "engine")
        utterance.words_ms = segment.offset_ms + duration_ms(samples, stream.sample_rate)
        if piece is None or segment.key is None:
            self.add_to_cut(stream, utterance, None)
            return
        cached = CachedSegment(piece.pcm, words)
        if store and self.may_keep(utterance, segment.key, segment.text):
            self._cache.put(segment.key, cached, since=stream.cache_epoch)
        self.add_to_cut(stream, utterance, cached)

    def may_keep(self, utterance: Utterance, key: SegmentKey, text: str) -> bool:
        """Whether ``text`` of ``utterance``, synthesized under ``key``, may be stored
        (engine/scheduler/retention.py)."""
        return may_keep(
            retain=utterance.retain,
            declared=self._cache.is_declared(key),
            personal=text in utterance.private,
        )

    def add_to_cut(self, stream: Stream, utterance: Utterance, piece: CachedSegment | None) -> None:
        """``piece`` (synthesized or from the cache; None: one that cannot be stored)
        just played: if it is a piece of a segment the capacity fit cut, add it to the
        whole, and store the whole once its last piece has played (its words as they were
        told: each piece's rounded on its own; a segment after it may start 1 ms apart on
        a later hit, from rounding)."""
        cut = utterance.cut
        if cut is None:
            return
        if piece is None:
            utterance.cut = None  # a piece that cannot be stored: nor can the whole
            return
        cut.pcm += piece.pcm
        shift = cut.played_ms
        cut.words.extend((word, start + shift, end + shift) for word, start, end in piece.words)
        cut.played_ms += duration_ms(len(piece.pcm) // 2, stream.sample_rate)
        cut.pieces_left -= 1
        if cut.pieces_left > 0:
            return
        utterance.cut = None
        if utterance.keys is not None:
            key = utterance.keys.key(cut.text)
            if self.may_keep(utterance, key, cut.text):
                whole = CachedSegment(bytes(cut.pcm), tuple(cut.words))
                self._cache.put(key, whole, since=stream.cache_epoch)


def _rest_is_personal(head: Utterance) -> bool:
    """Whether a segment after ``head``'s next one carries personal data: it is
    synthesized for this stream alone (no flight or cache entry serves it)."""
    return any(text in head.private for text in islice(head.segments, 1, None))
