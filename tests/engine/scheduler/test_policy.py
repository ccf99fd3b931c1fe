"""The scheduler's rules (engine/scheduler/policy.py) on hand-built state: no threads, no
clock (``now`` is passed), real rings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from engine.backends.base import BatchEmit, BatchWords, SynthesisJob, VoiceSettings
from engine.backends.routing import BackendSet
from engine.backends.synthetic import SyntheticBackend, ToneVoice
from engine.ipc.boundaries import BoundaryWriter
from engine.ipc.ring import SpscRing
from engine.scheduler import policy
from engine.scheduler.output import OutputWriter
from engine.scheduler.policy import AUDIO_PER_CHAR_PRIOR, Policy, segment_chars
from engine.scheduler.state import Lane, RunningBatch, StatsCounter, Stream, Utterance
from engine.text import MIN_FIT_CHARS
from telephony.codecs.resample import StreamingResampler

RATE = 16000
BYTES_PER_SECOND = 2 * RATE


class TwoModels(SyntheticBackend):
    """A batch backend whose voices "en-us" and "zh" are two models (two batch keys)."""

    max_batch = 3
    threads = 2

    def batch_key(self, voice: object) -> object:
        assert isinstance(voice, ToneVoice)
        return voice.frequency

    def synthesize_batch(
        self, jobs: Sequence[SynthesisJob], emit: BatchEmit, words: BatchWords | None = None
    ) -> None:
        raise AssertionError("policy tests synthesize nothing")


def make_ring(capacity: int = 1 << 20) -> SpscRing:
    return SpscRing.create(bytearray(SpscRing.region_size(capacity)), capacity)


def make_lane(*, gated: bool = False, threads: int = 2, max_batch: int = 3) -> Lane:
    backend = TwoModels()
    return Lane(backend, backend, threads=threads, max_batch=max_batch, gated=gated)


def make_stream(
    lane: Lane,
    slot: int,
    segments: Sequence[str],
    *,
    voice: str = "en-us",
    playing_s: float = 0.0,
    arrived_at: float = 0.0,
) -> Stream:
    """A stream whose head utterance has ``segments`` to do; with ``playing_s`` it has
    begun and holds that much unplayed audio in its ring."""
    routed = BackendSet([lane.backend]).resolve_voice(VoiceSettings(voice))
    ring = make_ring()
    stream = Stream(
        slot, slot + 100, f"owner-{slot}", ring, BoundaryWriter(make_ring(4096)), routed,
        lane, StreamingResampler(RATE, RATE), BYTES_PER_SECOND, RATE,
    )  # fmt: skip
    utterance = Utterance(1, arrived_at=arrived_at)
    utterance.segments.extend(segments)
    if playing_s:
        utterance.start_pos = 0
        assert ring.write(b"\0" * (int(playing_s * BYTES_PER_SECOND) // 2 * 2))
    stream.utterances.append(utterance)
    lane.streams[slot] = stream
    return stream


def test_smoothed_starts_at_the_first_value_then_weighs_the_newest_a_fifth() -> None:
    assert policy.smoothed(0.0, 0.5) == 0.5
    assert policy.smoothed(1.0, 2.0) == pytest.approx(1.2)


def test_a_stream_is_ready_only_with_a_segment_no_backlog_and_nothing_in_flight() -> None:
    lane = make_lane()
    stream = make_stream(lane, 0, ["Hello."])
    assert policy.ready(stream)
    stream.pending += b"\0\0"
    assert not policy.ready(stream)
    stream.pending.clear()
    stream.busy = True
    assert not policy.ready(stream)
    stream.busy = False
    stream.utterances[0].segments.clear()
    assert not policy.ready(stream)


def test_urgency_tiers_at_risk_then_new_then_comfortable() -> None:
    lane = make_lane()
    lane.seconds_per_char = 0.01  # 10 chars: 0.1 s expected; reserve 3 * 0.1 + 0.2 = 0.5 s
    rules = Policy()
    at_risk = make_stream(lane, 0, ["0123456789"], playing_s=0.4)
    new = make_stream(lane, 1, ["0123456789"], arrived_at=7.0)
    comfortable = make_stream(lane, 2, ["0123456789"], playing_s=2.0)
    assert rules.urgency(at_risk) == pytest.approx((0, 0.3))
    assert rules.urgency(new) == (1, 7.0)
    assert rules.urgency(comfortable) == pytest.approx((2, 1.9))
    # An inline lane's choice among them, and a batch lane has none to offer inline.
    inline = Lane(SyntheticBackend(), None)
    for stream in (at_risk, new, comfortable):
        stream.lane = inline
    inline.seconds_per_char = 0.01
    assert rules.most_urgent([new, comfortable, at_risk], inline=True) is at_risk
    assert rules.most_urgent([new, comfortable, at_risk], inline=False) is None
    at_risk.pending += b"\0\0"  # its ring is full: skipped
    assert rules.most_urgent([new, comfortable, at_risk], inline=True) is new


def test_a_bigger_reserve_puts_a_playing_stream_first_sooner() -> None:
    lane = make_lane()
    lane.seconds_per_char = 0.01
    stream = make_stream(lane, 0, ["0123456789"], playing_s=1.0)
    assert Policy().urgency(stream)[0] == 2
    assert Policy(reserve_factor=10.0).urgency(stream)[0] == 0


def test_a_batch_takes_the_most_urgent_of_one_model_up_to_max_batch() -> None:
    lane = make_lane(max_batch=2)
    lane.seconds_per_char = 0.01
    first = make_stream(lane, 0, ["Hello there."], playing_s=0.1)
    other_model = make_stream(lane, 1, ["你好。"], voice="zh", playing_s=0.1)
    second = make_stream(lane, 2, ["Good day."], playing_s=0.2)
    third = make_stream(lane, 3, ["And you."], playing_s=0.3)
    rules = Policy(cost_factor=2.0)
    batch = lane.batch
    assert batch is not None
    chosen = rules.choose(lane, batch, [first, other_model, second, third], now=100.0)
    assert chosen == [first, second]
    assert first.busy and second.busy and not other_model.busy and not third.busy
    assert first.busy_until == pytest.approx(100.0 + 0.01 * len("Hello there.") * 2.0)
    assert first.busy_audio_s == pytest.approx(AUDIO_PER_CHAR_PRIOR * len("Hello there."))


def test_without_a_pace_a_gated_lane_starts_one_new_utterance_per_worker() -> None:
    lane = make_lane(gated=True, threads=2, max_batch=1)
    busy = make_stream(lane, 0, ["More to say."], playing_s=1.0)
    busy.busy = True
    new = make_stream(lane, 1, ["Hello."])
    assert Policy().can_start(lane, new, [], now=0.0)
    other = make_stream(lane, 2, ["Again."], playing_s=1.0)
    other.busy = True
    assert not Policy().can_start(lane, new, [], now=0.0)


def test_a_gated_lane_holds_back_a_newcomer_that_would_make_a_call_stutter() -> None:
    lane = make_lane(gated=True, threads=1, max_batch=1)
    lane.seconds_per_char = 0.02  # 50 characters a second on its one worker
    lane.audio_per_char = 0.07
    # A call that has 1 s of audio left and a 20-character segment to do (0.5 s of work
    # with the replay's safety): a 40-character newcomer first would make it run dry.
    playing = make_stream(lane, 0, ["x" * 20], playing_s=1.0)
    new = make_stream(lane, 1, ["y" * 40], arrived_at=1.0)
    rules = Policy()
    assert not rules.can_start(lane, new, [], now=0.0)
    assert lane.batch is not None
    assert rules.choose(lane, lane.batch, [playing, new], now=0.0) == [playing]
    # With audio to spare, it fits.
    lane.streams.clear()
    roomy = make_stream(lane, 0, ["x" * 20], playing_s=30.0)
    new = make_stream(lane, 1, ["y" * 40], arrived_at=1.0)
    assert rules.can_start(lane, new, [], now=0.0)
    assert roomy in lane.streams.values()


def test_a_playing_streams_segment_that_would_come_late_is_cut_to_fit() -> None:
    lane = make_lane(gated=True)
    lane.seconds_per_char = 0.01
    text = "Your call matters to us, so please stay on the line and wait for the agent."
    stream = make_stream(lane, 0, [text], playing_s=0.35)
    Policy().fit_next_segment(lane, stream)
    segments = list(stream.utterances[0].segments)
    assert len(segments) == 2 and " ".join(segments) == text
    # (0.35 s - 0.1 s margin) / (0.01 s * 1.25) = 20 characters fit now; a piece is never
    # shorter than MIN_FIT_CHARS
    assert len(segments[0]) <= max(20, MIN_FIT_CHARS) < len(text)
    # Plenty of audio, or no pace yet: left whole.
    whole = make_stream(lane, 1, [text], playing_s=5.0)
    Policy().fit_next_segment(lane, whole)
    assert list(whole.utterances[0].segments) == [text]


def test_observed_paces_are_smoothed_per_lane_and_per_stream() -> None:
    lane = make_lane()
    stream = make_stream(lane, 0, ["Hello."])
    policy.observe_pace(lane, 0.5, 10)
    policy.observe_pace(lane, 1.0, 0)  # nothing learnt from an empty segment
    assert lane.seconds_per_char == pytest.approx(0.05)
    policy.observe_audio(lane, stream, 0.7, 10)
    policy.observe_audio(lane, stream, 0.0, 10)  # no audio: nothing learnt
    assert lane.audio_per_char == stream.audio_per_char == pytest.approx(0.07)


def test_segments_the_speech_cache_holds_are_no_work_for_the_capacity_fit() -> None:
    lane = make_lane(gated=True, threads=1, max_batch=1)
    lane.seconds_per_char = 0.02
    lane.audio_per_char = 0.07
    # The same call as above, its next segment a cached one: it needs nothing from the
    # worker, so the newcomer fits (before, cached segments counted as synthesis).
    playing = make_stream(lane, 0, ["x" * 20], playing_s=1.0)
    new = make_stream(lane, 1, ["y" * 40], arrived_at=1.0)
    rules = Policy()
    assert not rules.can_start(lane, new, [], now=0.0)
    playing.utterances[0].cached_texts.add("x" * 20)
    assert segment_chars(playing) == ()
    assert rules.can_start(lane, new, [], now=0.0)


def test_a_cached_start_waits_until_the_rest_can_follow_in_time() -> None:
    """A new utterance whose first segment is cached (a hit, or the words before an
    amount) and whose rest must be synthesized starts only when that rest can follow the
    cached audio in time: once its first frame is heard, no gap. It waits while the lane
    is busy, and is spoken whole when even a free lane could not follow. Cached whole,
    already playing, or in a lane that is not gated, it plays at once."""
    lane = make_lane(gated=True, threads=1, max_batch=1)
    lane.seconds_per_char = 0.02
    lane.audio_per_char = 0.07
    prefix, amount = "Your current balance is", "one thousand two hundred dollars."
    new = make_stream(lane, 1, [prefix, amount], arrived_at=1.0)
    new.utterances[0].cached_texts.add(prefix)
    # (the times below are set against this margin and wait)
    rules = Policy(margin_s=0.25, cached_wait_s=0.5)
    assert rules.cached_start(lane, new, 1.3, now=0.0) == "play"  # an idle worker
    # The worker is busy for 3 s more: the amount could not follow 1.3 s of cached audio.
    lane.running[1] = RunningBatch(3.0)
    assert rules.cached_start(lane, new, 1.3, now=0.0) == "wait"
    new.utterances[0].startable_since = 0.0  # waiting since then, for room
    assert rules.cached_start(lane, new, 1.3, now=0.4) == "wait"
    assert rules.cached_start(lane, new, 1.3, now=0.5) == "whole"  # no longer
    new.utterances[0].startable_since = None
    assert rules.cached_start(lane, new, 6.0, now=0.0) == "play"  # a long cached start
    assert rules.cached_start(lane, new, 1.3, now=2.8) == "play"  # the worker nearly free
    # 0.1 s of cached words: not even a free worker has the amount's first piece by then.
    assert rules.cached_start(lane, new, 0.1, now=0.0) == "whole"
    whole = make_stream(lane, 2, [prefix], arrived_at=1.0)
    whole.utterances[0].cached_texts.add(prefix)
    assert rules.cached_start(lane, whole, 1.3, now=0.0) == "play"  # nothing to synthesize
    playing = make_stream(lane, 3, [prefix, amount], playing_s=1.0)
    assert rules.cached_start(lane, playing, 1.3, now=0.0) == "play"  # heard: not new
    free = make_lane(gated=False, threads=1, max_batch=1)
    inline = make_stream(free, 4, [prefix, amount])
    assert rules.cached_start(free, inline, 1.3, now=0.0) == "play"


def test_a_join_starts_as_a_cached_start_from_when_the_flight_is_due() -> None:
    """A new utterance that would join a synthesis in flight of its first segment, its
    rest to be synthesized for it alone, is weighed as a cached start whose audio comes
    when the flight is due (the stream hears the flight until it ends, and its rest
    begins no earlier)."""
    lane = make_lane(gated=True, threads=1, max_batch=1)
    lane.seconds_per_char = 0.02
    lane.audio_per_char = 0.07
    prefix, amount = "Your current balance is", "one thousand two hundred dollars."
    new = make_stream(lane, 1, [prefix, amount], arrived_at=1.0)
    rules = Policy(margin_s=0.25)
    lane.running[1] = RunningBatch(3.0)  # the worker is busy for 3 s more
    # 1.3 s of words in the cache now: the amount (0.83 s with the replay's safety)
    # could not begin before 3 s, long after they end: it waits.
    assert rules.cached_start(lane, new, 1.3, now=0.0) == "wait"
    # The same words from a flight due in 2.9 s play from 2.9 s to 4.2 s; the amount,
    # begun at 3 s, is in at 3.83 s, before 4.2 - 0.25: it joins.
    assert rules.cached_start(lane, new, 1.3, now=0.0, arrives_in_s=2.9) == "play"
    # Due at once, they are the cached start again.
    assert rules.cached_start(lane, new, 1.3, now=0.0, arrives_in_s=0.0) == "wait"


def test_a_segment_heard_in_pieces_counts_only_its_rest_as_still_to_come() -> None:
    """A segment in flight whose first pieces are already written (Kokoro's leading
    segment) adds only the audio still to come when it ends: that already written is in
    the ring, counted once (before, both: a call's slack looked a piece longer than it
    was, and the lane admitted the next caller into a hole)."""
    lane = make_lane(gated=True, threads=1, max_batch=1)
    lane.seconds_per_char = 0.02
    stream = make_stream(lane, 1, ["x" * 40])
    Policy().mark_busy(lane, stream, now=0.0)
    stream.busy_audio_s = 3.0
    writer = OutputWriter(lambda _owner, _message: None, StatsCounter())
    writer.write(stream, stream.utterances[0], b"\0" * BYTES_PER_SECOND)  # a 1 s piece
    work = policy.remaining_work(stream, now=0.5)
    assert work.unplayed_s == pytest.approx(1.0)
    assert work.in_flight_audio_s == pytest.approx(2.0)
    assert work.heard


def test_a_kokoro_lane_refuses_a_mandarin_newcomer_it_cannot_pace() -> None:
    """Kokoro's lane at its measured Mandarin pace (two workers, about 0.06 s of a worker
    and 0.2 s of audio per character): while both calls in progress need a worker each
    for their next sentence before their 2 s in hand run out, a new Mandarin utterance is
    held back (taking a worker, it would leave one of them with a hole: it waits, then
    queue_timeout); once they have audio in hand it starts. Deterministic: the replay,
    no clock."""
    lane = make_lane(gated=True, threads=2, max_batch=1)
    lane.seconds_per_char = 0.06
    lane.audio_per_char = 0.2
    sentence = "您好，欢迎致电客服中心，您的订单已发货。"  # 20 characters, about 4 s of speech
    # 2 s in hand each; their next sentences take 1.5 s of a worker (with the margin)
    calls = [make_stream(lane, slot, [sentence], voice="zh", playing_s=2.0) for slot in (1, 2)]
    new = make_stream(lane, 3, [sentence], voice="zh", arrived_at=1.0)
    rules = Policy()
    assert not rules.can_start(lane, new, [], now=0.0)
    for call in calls:  # their next sentences are in: 6 s of audio each, nothing left to do
        call.utterances[0].segments.clear()
        assert call.ring.write(b"\0" * (4 * BYTES_PER_SECOND))
    assert rules.can_start(lane, new, [], now=0.0)


def held_with_its_clause_heard(
    lane: Lane, texts: list[str], heard_s: float
) -> tuple[Stream, Policy, OutputWriter]:
    """A new utterance of ``texts`` chosen on ``lane`` (held back: more than one segment),
    its first segment done and ``heard_s`` of its audio made (kept back)."""
    stream = make_stream(lane, 1, texts, voice="zh")
    rules = Policy()
    assert lane.batch is not None
    assert rules.choose(lane, lane.batch, [stream], now=0.0) == [stream]
    head = stream.utterances[0]
    assert head.held
    head.segments.popleft()
    stream.busy = False
    writer = OutputWriter(lambda _owner, _message: None, StatsCounter())
    writer.write(stream, head, b"\0" * int(heard_s * BYTES_PER_SECOND))
    return stream, rules, writer


def test_a_new_utterance_is_held_back_until_its_rest_can_follow() -> None:
    """One call alone on a lane whose worker is barely faster than real time (Kokoro's
    Mandarin on a slow CPU): its short first clause is kept back from the ring until the
    next sentence would arrive before that audio runs out; then it all goes at once.
    Deterministic: the replay, no clock."""
    lane = make_lane(gated=True, threads=1, max_batch=1)
    lane.seconds_per_char = 0.18  # a worker's seconds per character
    lane.audio_per_char = 0.2  # ... for 0.2 s of audio: just faster than real time
    clause, sentence = "所有客服人员正忙，", "您的来电对我们非常重要。"
    # the clause's 1.8 s arrives; the 12-character sentence needs 2.7 s of the worker
    stream, rules, writer = held_with_its_clause_heard(lane, [clause, sentence], 1.8)
    head = stream.utterances[0]
    assert lane.batch is not None
    assert writer.flush(stream) and stream.ring.readable_bytes() == 0  # kept back
    assert not rules.may_release(lane, stream, now=0.0)
    # the sentence in flight, done in 0.3 s: the clause can go
    rules.mark_busy(lane, stream, now=0.0)
    head.segments.popleft()
    stream.busy_until = 0.3
    assert rules.may_release(lane, stream, now=0.0)
    head.held = False
    writer.flush(stream)
    assert stream.ring.readable_bytes() == int(1.8 * BYTES_PER_SECOND)
    # nothing left to synthesize: released whatever the pace
    stream.busy = False
    head.held = True
    assert rules.may_release(lane, stream, now=0.0)
    # a long utterance on a lane that cannot keep up: released once it holds the bound
    long = make_stream(lane, 3, [clause, *[sentence] * 40], voice="zh")
    lane.streams = {3: long}
    assert rules.choose(lane, lane.batch, [long], now=0.0) == [long]
    long.utterances[0].segments.popleft()
    long.busy = False
    writer.write(long, long.utterances[0], b"\0" * int(5 * BYTES_PER_SECOND))
    assert not rules.may_release(lane, long, now=0.0)
    writer.write(long, long.utterances[0], b"\0" * int(policy.MAX_HELD_S * BYTES_PER_SECOND))
    assert rules.may_release(lane, long, now=0.0)
    # one segment only, or no pace yet: never held
    lone = make_stream(lane, 2, [sentence], voice="zh")
    lane.streams = {2: lone}
    assert rules.choose(lane, lane.batch, [lone], now=0.0) == [lone]
    assert not lone.utterances[0].held


def test_a_paced_first_segment_lets_the_held_utterance_go_before_it_is_done() -> None:
    """A backend that paces its leading segment (``paced_leading``: Kokoro in pieces,
    first audio only once the rest of the segment can follow) has the whole segment's
    audio counted from its first piece: the utterance goes as soon as its next segment
    can follow that audio, not once the first segment is done. Deterministic."""
    opening, rest = "查询话费请按二，办理业务请按三", "余额。"  # 15 and 3 characters
    writer = OutputWriter(lambda _owner, _message: None, StatsCounter())
    verdicts = []
    for paced in (False, True):
        lane = make_lane(gated=True, threads=1, max_batch=1)
        lane.paced_leading = paced
        lane.seconds_per_char = 0.1  # a worker's seconds per character
        lane.audio_per_char = 0.2  # the opening: 3 s of audio in 1.5 s (x 1.25)
        stream = make_stream(lane, 1, [opening, rest], voice="zh")
        rules = Policy()
        assert lane.batch is not None
        assert rules.choose(lane, lane.batch, [stream], now=0.0) == [stream]
        head = stream.utterances[0]
        assert head.held and stream.busy_paced is paced
        head.segments.popleft()  # the opening with the worker
        writer.write(stream, head, b"\0" * int(1.0 * BYTES_PER_SECOND))  # its first piece
        assert stream.busy_began
        # 1 s in hand, 2 s more of the opening to come, done in 1.875 s: the rest (3
        # characters, 0.375 s) arrives at 2.25 s, before the 3 s of audio runs out
        verdicts.append(rules.may_release(lane, stream, now=0.0))
    assert verdicts == [False, True]


def test_before_its_lane_has_a_pace_a_new_utterance_waits_to_be_released() -> None:
    """A lane that has timed no call cannot tell whether an utterance's later segments
    can follow its first: a new utterance with more than one segment is held until the
    lane has a pace (then the replay decides) or nothing of it is left to do (a fresh
    engine's first Kokoro utterance on a slow CPU played its clause, then a hole)."""
    lane = make_lane(gated=True, threads=1, max_batch=1)
    assert lane.seconds_per_char == 0.0
    texts = ["所有客服人员正忙，", "您的来电对我们非常重要。"]
    stream, rules, _writer = held_with_its_clause_heard(lane, texts, 1.8)
    assert not rules.may_release(lane, stream, now=0.0)  # no pace: it waits
    policy.observe_pace(lane, 0.4, 9)  # the clause took 0.4 s: 12 characters take 0.53 s
    assert rules.may_release(lane, stream, now=0.0)


def test_a_held_utterance_is_weighed_again_on_its_progress_or_after_the_recheck_time() -> None:
    """The coordinator polls a stream whose audio waits every few milliseconds, and a held
    one waits: its release is weighed again (a replay of the whole lane) only when its
    own utterance moved on (a segment done, audio made) or RELEASE_RECHECK_S after the
    last time, so the lane's other changes reach it within that. Deterministic: no clock."""
    lane = make_lane(gated=True, threads=1, max_batch=1)
    lane.seconds_per_char = 0.18
    lane.audio_per_char = 0.2
    clause, sentence = "所有客服人员正忙，", "您的来电对我们非常重要。"
    stream = make_stream(lane, 1, [clause, sentence], voice="zh")
    weighed: list[float] = []

    class Counting(Policy):
        def may_release(self, lane: Any, stream: Any, now: float) -> bool:
            weighed.append(now)
            return super().may_release(lane, stream, now)

    rules = Counting()
    assert lane.batch is not None
    assert rules.choose(lane, lane.batch, [stream], now=0.0) == [stream]
    head = stream.utterances[0]
    head.segments.popleft()
    stream.busy = False
    writer = OutputWriter(lambda _owner, _message: None, StatsCounter())
    writer.write(stream, head, b"\0" * int(1.8 * BYTES_PER_SECOND))
    rules.recheck_release(stream, now=0.0)
    assert weighed == [0.0] and head.held
    step = policy.RELEASE_RECHECK_S / 10
    for poll in range(1, 10):  # nothing moved: the polls within the recheck time skip it
        rules.recheck_release(stream, now=poll * step)
    assert weighed == [0.0] and head.held
    rules.recheck_release(stream, now=policy.RELEASE_RECHECK_S)  # the recheck time is up
    assert weighed == [0.0, policy.RELEASE_RECHECK_S] and head.held
    # the sentence goes to a worker (its progress changed): weighed at once, and released
    rules.mark_busy(lane, stream, now=0.06)
    head.segments.popleft()
    stream.busy_until = 0.3
    rules.recheck_release(stream, now=0.06)
    assert weighed[-1] == 0.06 and not head.held
    rules.recheck_release(stream, now=1.0)  # not held: nothing to weigh
    assert len(weighed) == 3


def keyed_new_streams(lane: Lane, texts: Sequence[str]) -> list[Stream]:
    """New utterances of ``texts`` (slots 1, 2, ..., arriving in that order), each looked
    up in the speech cache and missed."""
    from engine.scheduler.cache_keys import key_maker
    from engine.speech_cache import tenant_scope

    streams = [make_stream(lane, slot, [text], arrived_at=slot) for slot, text in
               enumerate(texts, start=1)]  # fmt: skip
    for stream in streams:
        keys = key_maker(stream.voice, stream.voice.handle, None, RATE, scope=tenant_scope(""))
        assert keys is not None
        stream.utterances[0].keys = keys
        stream.utterances[0].checked = True
    return streams


@pytest.mark.parametrize(
    ("texts", "first"),
    [
        (["An amount for one caller.", "Welcome.", "Welcome.", "Welcome."], 2),
        (["An amount for one caller.", "Welcome.", "Goodbye."], 1),  # one each: arrival
    ],
)
def test_the_new_sentence_most_callers_wait_for_goes_first(texts: list[str], first: int) -> None:
    """Among new utterances, the one whose first segment most callers wait for is taken
    first (one synthesis serves them all: the others join it), then arrival order."""
    from engine.scheduler.dispatch import next_batch

    lane = make_lane(threads=1, max_batch=1)
    streams = keyed_new_streams(lane, texts)
    assert lane.batch is not None
    formed = next_batch(lane, lane.batch, streams, Policy(), lambda s: False, now=0.0)
    assert formed is not None and [s.slot for s in formed.streams] == [first]
