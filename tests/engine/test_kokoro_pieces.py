"""Kokoro decoded in pieces: the schedule, the phase, the joins, the words, cancellation.

The schedule tests need no model; the rest run the installed model (split in two, the
graph the backend chooses) once for the module. Pieces are checked against one decoder
run over the whole segment with the statistics the backend serves with (the whole
segment's: docs/kokoro.md), so what is tested is the piece machinery itself: context,
phase, joins, offsets."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from engine.backends.base import SynthesisJob, VoiceSettings, WordTiming
from engine.backends.kokoro import assets, pieces
from engine.backends.kokoro.backend import KokoroBackend, declared, installed, leading_cut
from engine.backends.kokoro.model import tokenize
from engine.ipc.schema import Capabilities
from tests.bench import joins

SENTENCE = "您好，欢迎致电客服中心，您的订单已发货，请注意查收。"
# Pieces given the whole segment's statistics against the whole decode, float graph:
# measured 26-34 dB over the bench's 38 segments (tests/bench/kokoro_joins.py,
# docs/kokoro.md); what remains is the decoder's edge at each piece's context, through a
# decoder that amplifies rounding.
PIECES_SNR_DB = 20.0

needs_model = pytest.mark.skipif(
    not installed(), reason="kokoro assets not installed (make kokoro-voices)"
)


# --------------------------------------------------------------------------- schedule


def covers(plan: list[pieces.Piece], begin: int, frames: int) -> bool:
    return (
        plan[0].start == begin
        and plan[-1].end == frames
        and all(a.end == b.start for a, b in itertools.pairwise(plan))
        and all(p.lo <= p.start < p.end <= p.hi for p in plan)
    )


def test_the_schedule_covers_the_segment_from_the_cut_first_piece_short() -> None:
    plan = pieces.schedule(200, 12, 16, 3.0)
    assert covers(plan, 12, 200) and len(plan) > 2
    assert plan[0].end - plan[0].start == 16
    assert plan[0].lo == 12 - pieces.LEFT_CONTEXT  # the pad before the cut: context only
    assert [p.end - p.start for p in plan[1:-1]] == sorted(p.end - p.start for p in plan[1:-1])
    assert pieces.schedule(200, 12, 16, 3.0) == plan  # deterministic


def test_each_piece_is_decoded_before_the_audio_before_it_runs_out() -> None:
    for pace in (2.0, 3.0, 5.0):
        plan = pieces.schedule(400, 10, 40, pace)
        assert covers(plan, 10, 400) and len(plan) >= 3
        buffered = float(plan[0].end - plan[0].start)
        for piece in plan[1:]:
            cost = (piece.hi - piece.lo) / pace
            assert cost <= buffered, (pace, piece)  # a short tail merged in too
            buffered = buffered - cost + piece.end - piece.start
    # too slow to keep ahead of a 0.4 s first piece: no whole rest, the first audio held
    plan = pieces.schedule(400, 10, 16, 1.2)
    assert covers(plan, 10, 400) and len(plan) > 2
    assert pieces.release_after(plan, 1.2) > 0
    # slower than real time: steady pieces
    plan = pieces.schedule(400, 10, 16, 0.8)
    assert {p.end - p.start for p in plan[1:-1]} == {pieces.STEADY_PIECE}


def test_a_worker_that_keeps_ahead_releases_the_first_piece_at_once() -> None:
    """At two audio-s per second and more, whatever the segment's length and wherever
    its pauses fall, the first audio goes after the first piece: no piece sized by the
    pace grows past its room to take a short rest (at 3.0, 140 frames held the first
    audio for a second piece of 100 frames), and a piece sized to its room exactly is in
    time (no float rounding holds it)."""
    rng = np.random.default_rng(7)
    for pace in (2.0, 2.5, 3.0, 4.0, 5.0):
        for frames in range(60, 320, 3):
            for quiet in (None, rng.random(frames + 1)):
                plan = pieces.schedule(frames, 8, pieces.FIRST_PIECE, pace, quiet=quiet)
                assert covers(plan, 8, frames)
                assert pieces.release_after(plan, pace) == 0, (pace, frames, plan)


def late_frames(plan: list[pieces.Piece], pace: float, release: int) -> float:
    """How late the latest piece arrives (frames; <= 0: none late), decoded one after
    another at ``pace`` and played from when piece ``release`` is decoded."""
    done, clock = [], 0.0
    for piece in plan:
        clock += (piece.hi - piece.lo) / pace
        done.append(clock)
    start = done[release]
    later = range(release + 1, len(plan))
    return max((done[i] - (start + plan[i].start - plan[0].start) for i in later), default=-1e9)


def test_a_slow_worker_holds_the_first_audio_until_the_rest_keeps_ahead() -> None:
    for pace in (0.5, 0.8, 0.95, 1.2):
        plan = pieces.schedule(300, 10, 40, pace)
        assert covers(plan, 10, 300) and len(plan) > 2
        release = pieces.release_after(plan, pace)
        assert 0 < release < len(plan) - 1  # held, yet before the segment is whole
        assert late_frames(plan, pace, release) <= -pieces.RELEASE_MARGIN
        assert late_frames(plan, pace, release - 1) > -pieces.RELEASE_MARGIN  # no earlier
    # a worker that keeps ahead: the first piece goes at once
    plan = pieces.schedule(300, 10, 40, 3.0)
    assert pieces.release_after(plan, 3.0) == 0
    assert late_frames(plan, 3.0, 0) <= -pieces.RELEASE_MARGIN
    # no pace at all: the segment whole
    assert pieces.release_after(plan, 0.0) == len(plan) - 1


def test_held_pieces_go_out_together_once_the_release_piece_is_decoded() -> None:
    plan = pieces.schedule(300, 10, 40, 0.8)
    decoded: list[int] = []

    def decoder(lo: int, hi: int, _given: Any) -> Any:
        decoded.append(lo)
        return np.ones((hi - lo) * 600, dtype=np.float32), []

    out = pieces.decode(plan, decoder, 600, "own", release=2)
    first = next(out)
    assert len(decoded) == 3 and first.size > 0  # pieces 0..2 decoded before any audio
    rest = [first, *out]
    assert len(rest) == len(plan) and sum(a.size for a in rest) == (300 - 10) * 600


def test_the_pace_meter_falls_fast_and_rises_slowly() -> None:
    meter = pieces.PaceMeter(2.0)
    meter.observe(1.0, 1.0)  # a piece at real time: half way down at once
    assert meter.pace == pytest.approx(1.5)
    meter.observe(4.0, 1.0)
    assert meter.pace == pytest.approx(1.5 + 0.2 * 2.5)
    assert meter.plan_pace() == pytest.approx(meter.pace / pieces.PACE_SAFETY)
    meter.observe(0.0, 1.0)  # nothing measured: no change
    assert meter.pace == pytest.approx(2.0)
    with pytest.raises(ValueError):
        pieces.PaceMeter(0.0)


def test_joins_move_to_the_quietest_boundary_nearby() -> None:
    quiet = np.full(201, 5.0, dtype=np.float32)
    quiet[30] = -9.0  # a pause 2 frames after where the first join would fall
    plan = pieces.schedule(200, 12, 16, 3.0, quiet=quiet)
    assert plan[0].end == 30 and covers(plan, 12, 200)
    energy = np.array([[0, 0, 9, 9, 0, 0, 9, 9]], dtype=np.float32)  # 4 frames
    assert pieces.boundary_loudness(energy).tolist() == [0, 9, 9, 9, 9]


def test_a_piece_sized_by_the_pace_moves_to_a_pause_before_its_target_never_after() -> None:
    """Later, it would arrive after the audio before it ran out, and the first audio
    would be held one piece longer (release_after): with a pause on each side of where
    the second piece would end, it takes the one before; the first audio goes at once."""
    pace = 2.5
    quiet = np.full(201, 5.0, dtype=np.float32)
    quiet[42] = -9.0  # the first piece ends at its target, 10 + 32
    # the second holds what 24 frames out (32 less the margin) cover at the pace
    room = int(pace * (32 - pieces.RELEASE_MARGIN)) - pieces.LEFT_CONTEXT
    target = 42 + room - pieces.RIGHT_CONTEXT
    quiet[target + 2] = -9.0  # quieter, after the target
    quiet[target - 3] = -1.0  # a pause, before it
    plan = pieces.schedule(200, 10, 32, pace, quiet=quiet)
    assert plan[0].end == 42 and plan[1].end == target - 3 and covers(plan, 10, 200)
    assert pieces.release_after(plan, pace) == 0
    assert late_frames(plan, pace, 0) <= -pieces.RELEASE_MARGIN
    # the first piece still moves either way
    first = np.full(201, 5.0, dtype=np.float32)
    first[10 + 32 + 2] = -9.0
    assert pieces.schedule(200, 10, 32, pace, quiet=first)[0].end == 10 + 32 + 2


# --------------------------------------------------------------------------- clicks


def test_the_click_detector_finds_a_broken_join_and_not_a_whole_one() -> None:
    rate = 24_000
    t = np.arange(rate // 2) / rate
    tone = 0.3 * np.sin(2 * np.pi * 180 * t) * (1 + 0.3 * np.sin(2 * np.pi * 3 * t))
    at = tone.size // 2
    assert joins.clicks(tone, [at]) == 0
    restarted = tone.copy()
    restarted[at:] = 0.3 * np.sin(2 * np.pi * 180 * t[: tone.size - at])  # phase from zero
    assert joins.clicks(restarted, [at]) == 1
    stepped = tone.copy()
    stepped[at:] *= 1.5  # a level step, no discontinuity of phase
    assert joins.level_step_db(stepped, tone, at) == pytest.approx(3.52, abs=0.1)


# --------------------------------------------------------------------------- the model


@pytest.fixture(scope="module")
def kokoro() -> Iterator[KokoroBackend]:
    if not installed():
        pytest.skip("kokoro assets not installed (make kokoro-voices)")
    # the float graph: the int8 one quantizes each activation over the frames decoded, so
    # its pieces differ from its whole decode by that too (15 dB SNR, docs/kokoro.md)
    # with the idle session (two threads); whole unless a test asks for pieces
    backend = KokoroBackend(threads=2, graph="float", pieces="off")
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def segment(kokoro: KokoroBackend) -> dict[str, Any]:
    """The front of :data:`SENTENCE` and its whole decode (with its statistics)."""
    assert kokoro.model is not None
    voice = kokoro.resolve_voice(VoiceSettings("zh-yunxi"))
    call = tokenize(kokoro.phonemes(SENTENCE, voice))[0]
    frames, features = kokoro.model.front(call.ids, voice.pack[len(call.ids) - 1], 1.0)
    whole, stats = kokoro.model.decode(features, 0, features.frames, None)
    return {"frames": frames, "features": features, "whole": whole, "stats": stats}


def decode_pieces(kokoro: KokoroBackend, segment: dict[str, Any], **kw: Any) -> Any:
    assert kokoro.model is not None
    model, features = kokoro.model, segment["features"]
    begin = leading_cut(segment["frames"])
    plan = pieces.schedule(features.frames, begin, pieces.FIRST_PIECE, pieces.PLAN_PACE, **kw)
    stats = segment["stats"]

    def decoder(lo: int, hi: int, _given: Any) -> Any:
        return model.decode(features, lo, hi, stats)

    out = list(pieces.decode(plan, decoder, kokoro.hop))
    return plan, begin, out


@needs_model
def test_pieces_equal_the_whole_decode_with_its_statistics(
    kokoro: KokoroBackend, segment: dict[str, Any]
) -> None:
    plan, begin, out = decode_pieces(kokoro, segment)
    assert len(plan) >= 3 and len(out) == len(plan)
    audio = np.concatenate(out)
    reference = segment["whole"][begin * kokoro.hop :]
    assert audio.size == reference.size
    assert joins.snr_db(audio, reference) > PIECES_SNR_DB
    places = [(p.start - begin) * kokoro.hop for p in plan[1:]]
    assert joins.clicks(audio, places) <= joins.clicks(reference, places)
    assert max(joins.level_step_db(audio, reference, at) for at in places) < 1.0


@needs_model
def test_the_phase_runs_on_across_pieces(kokoro: KokoroBackend, segment: dict[str, Any]) -> None:
    features = segment["features"]
    f0 = features.f0.reshape(1, 1, -1).astype(np.float64)
    turns = f0 * np.arange(1, 10).reshape(1, -1, 1) / 24_000
    expected = np.cumsum(turns - np.floor(turns), axis=-1) * 2 * np.pi * 300
    np.testing.assert_allclose(features.phase, expected, rtol=1e-4, atol=0.05)
    assert pieces.phase_slice(features.phase, 40, 60)[0, 0, 0] == features.phase[0, 0, 40]
    # a piece given its own phase from zero (the decoder's cumulative sum restarted) no
    # longer continues the whole decode: its voiced audio moves
    assert kokoro.model is not None
    model, stats, hop, lo = kokoro.model, segment["stats"], kokoro.hop, 60
    hi = features.frames
    right, _ = model.decode(features, lo, hi, stats)
    restarted = pieces.Features(
        features.aligned, features.f0, features.energy,
        features.phase - features.phase[:, :, 2 * lo : 2 * lo + 1], features.style,
    )  # fmt: skip
    wrong, _ = model.decode(restarted, lo, hi, stats)
    keep = slice(pieces.LEFT_CONTEXT * hop, None)
    reference = segment["whole"][lo * hop :]
    assert joins.snr_db(right[keep], reference[keep]) > PIECES_SNR_DB
    assert (
        joins.snr_db(wrong[keep], reference[keep]) < joins.snr_db(right[keep], reference[keep]) - 10
    )


def set_pace(monkeypatch: pytest.MonkeyPatch, kokoro: KokoroBackend, pace: float) -> None:
    """The pace both decoder sessions measured (the shared one and the lone call's)."""
    monkeypatch.setattr(kokoro, "pace", pieces.PaceMeter(pace))
    monkeypatch.setattr(kokoro, "idle_pace", pieces.PaceMeter(pace))


def speak(kokoro: KokoroBackend, text: str, voice_id: str, stop_after: int | None = None) -> Any:
    voice = kokoro.resolve_voice(VoiceSettings(voice_id))
    chunks: list[np.ndarray] = []
    words: list[WordTiming] = []

    def emit(_index: int, pcm: np.ndarray) -> bool:
        chunks.append(pcm)
        return stop_after is None or len(chunks) < stop_after

    kokoro.synthesize_batch(
        [SynthesisJob(text, voice, leading=True)], emit, lambda _i, w: words.extend(w)
    )
    return chunks, words


@needs_model
@pytest.mark.parametrize(
    ("voice_id", "text"),
    [
        ("zh-yunxi", SENTENCE),
        ("en-us-heart", "Thank you for calling the billing department today."),
    ],
)
def test_pieces_keep_the_words_and_the_length_of_the_whole(
    kokoro: KokoroBackend, monkeypatch: pytest.MonkeyPatch, voice_id: str, text: str
) -> None:
    whole, whole_words = speak(kokoro, text, voice_id)
    monkeypatch.setattr(kokoro, "pieces", "on")
    parts, part_words = speak(kokoro, text, voice_id)
    assert len(whole) == 1 and len(parts) >= 2
    assert sum(c.size for c in parts) == whole[0].size
    assert part_words == whole_words and whole_words
    assert np.abs(parts[0][:1200].astype(np.int32)).max() < 300  # it opens quietly


@needs_model
def test_leading_pieces_decode_only_an_utterance_s_first_segment_in_pieces(
    kokoro: KokoroBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ENGINE_KOKORO_PIECES=leading`` (the default): the segment a caller waits on
    comes in pieces (first audio after the first piece), a later segment of the
    utterance whole, as the model was trained; the same length and words either way."""
    voice = kokoro.resolve_voice(VoiceSettings("zh-yunxi"))
    whole, _ = speak(kokoro, SENTENCE, "zh-yunxi")
    monkeypatch.setattr(kokoro, "pieces", "leading")
    out: dict[bool, list[np.ndarray]] = {True: [], False: []}
    for leading in (True, False):

        def keep(_index: int, pcm: np.ndarray, into: list[np.ndarray] = out[leading]) -> bool:
            into.append(pcm)
            return True

        kokoro.synthesize_batch([SynthesisJob(SENTENCE, voice, leading=leading)], keep)
    assert len(out[True]) >= 2 and len(out[False]) == 1
    assert sum(c.size for c in out[True]) == out[False][0].size == whole[0].size
    identity = dict(kokoro.cache_identity(voice).extra)["decode"]
    assert identity.startswith("leading-pieces/")


def decoding_in_pieces(monkeypatch: pytest.MonkeyPatch, kokoro: KokoroBackend) -> list[int]:
    """Every segment in pieces; the list returned gets an item per decoder run."""
    assert kokoro.model is not None
    runs: list[int] = []
    decode = kokoro.model.decode

    def counted(*args: Any, **kw: Any) -> Any:
        runs.append(1)
        return decode(*args, **kw)

    monkeypatch.setattr(kokoro, "pieces", "on")
    monkeypatch.setattr(kokoro.model, "decode", counted)
    return runs


@needs_model
def test_a_stop_after_the_first_piece_decodes_no_more(
    kokoro: KokoroBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = decoding_in_pieces(monkeypatch, kokoro)
    set_pace(monkeypatch, kokoro, 8.0)  # keeps ahead: no hold
    chunks, words = speak(kokoro, SENTENCE, "zh-yunxi", stop_after=1)
    assert len(chunks) == 1 and len(runs) == 1 and not words


@needs_model
def test_a_decoder_slower_than_the_audio_holds_the_first_piece_back(
    kokoro: KokoroBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pace measured on this machine below real time: the first audio waits until
    the rest can follow without a hole, and the audio is the same length."""
    runs = decoding_in_pieces(monkeypatch, kokoro)
    set_pace(monkeypatch, kokoro, 0.6 * pieces.PACE_SAFETY)
    voice = kokoro.resolve_voice(VoiceSettings("zh-yunxi"))
    decoded_at_emit: list[int] = []
    whole: list[np.ndarray] = []

    def emit(_index: int, pcm: np.ndarray) -> bool:
        decoded_at_emit.append(len(runs))
        whole.append(pcm)
        return True

    kokoro.synthesize_batch([SynthesisJob(SENTENCE, voice, leading=True)], emit)
    held = decoded_at_emit[0]
    assert held > 2  # several pieces decoded before the first audio went out
    assert decoded_at_emit[:held] == [held] * held  # ... and out together
    assert len(whole) == len(runs)  # then each piece as it is decoded
    set_pace(monkeypatch, kokoro, 8.0)
    fast, _ = speak(kokoro, SENTENCE, "zh-yunxi")
    assert sum(c.size for c in whole) == sum(c.size for c in fast)


@needs_model
def test_the_cache_identity_names_the_graph_and_the_decoding(
    kokoro: KokoroBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    voice = kokoro.resolve_voice(VoiceSettings("zh-yunxi"))
    identity = kokoro.cache_identity(voice)
    expected = assets.FLOAT_SHA256 if kokoro.graph == "float" else assets.MODEL_SHA256
    assert identity.model_digest == expected and not identity.stochastic
    assert dict(identity.extra)["decode"] == "whole"
    monkeypatch.setattr(kokoro, "pieces", "on")
    assert dict(kokoro.cache_identity(voice).extra)["decode"].startswith("pieces/")


@needs_model
def test_a_lone_synthesis_on_two_threads_sounds_the_same(kokoro: KokoroBackend) -> None:
    """Alone, a synthesis decodes on the two-thread session; beside another call (one
    counted as running), on the shared one: the same audio."""
    assert kokoro.idle() and kokoro._idle_session is not None
    voice = kokoro.resolve_voice(VoiceSettings("zh-yunxi"))
    out: dict[bool, list[np.ndarray]] = {True: [], False: []}
    for alone in (True, False):

        def keep(_index: int, pcm: np.ndarray, into: list[np.ndarray] = out[alone]) -> bool:
            into.append(pcm)
            return True

        kokoro._active += 0 if alone else 1
        try:
            kokoro.synthesize_batch([SynthesisJob(SENTENCE, voice, leading=True)], keep)
        finally:
            kokoro._active -= 0 if alone else 1
    np.testing.assert_array_equal(np.concatenate(out[True]), np.concatenate(out[False]))


@needs_model
def test_the_scheduler_s_word_decides_the_lone_session(
    kokoro: KokoroBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With an idle session the backend declares lone calls; a job the scheduler says
    runs beside another decodes on the shared session even when nothing else runs yet,
    one it says runs alone (or a caller that says nothing) on the idle one."""
    assert kokoro.capabilities.lone_calls and kokoro.idle()
    voice = kokoro.resolve_voice(VoiceSettings("zh-yunxi"))
    sessions: list[object] = []

    def spy(index: int, job: SynthesisJob, voice: object, emit: object, session: object) -> None:
        sessions.append(session)

    monkeypatch.setattr(kokoro, "_synthesize_job", spy)
    for alone in (False, True, None):
        kokoro.synthesize_batch([SynthesisJob("你好。", voice, alone=alone)], lambda i, pcm: True)
    assert sessions == [None, kokoro._idle_session, kokoro._idle_session]


def test_a_backend_decoding_its_leading_segment_in_pieces_declares_it_paced() -> None:
    """``paced_leading`` (the scheduler counts a leading segment's audio from its first
    piece) only where leading segments come in pieces; ``lone_calls`` only with an idle
    session."""
    base = Capabilities(independent_calls=True, batch=True, word_timings=True)
    for setting in ("leading", "on"):
        assert declared(base, idle_session=False, pieces=setting).paced_leading
    off = declared(base, idle_session=True, pieces="off")
    assert not off.paced_leading and off.lone_calls
    assert not declared(base, idle_session=False, pieces="on").lone_calls


def lone_job_sessions(
    kokoro: KokoroBackend, monkeypatch: pytest.MonkeyPatch, *, narrowing: bool
) -> tuple[list[object], list[tuple[str, int]], np.ndarray]:
    """A lone job of :data:`SENTENCE` (the scheduler's ``alone``), given ``narrowed``
    when ``narrowing``: the session of each decoder run, the audio and narrowing events
    (each with the decoder runs before it), and the audio."""
    assert kokoro.model is not None
    voice = kokoro.resolve_voice(VoiceSettings("zh-yunxi"))
    sessions: list[object] = []
    events: list[tuple[str, int]] = []
    chunks: list[np.ndarray] = []
    decode = kokoro.model.decode

    def spied(features: Any, lo: int, hi: int, given: Any, session: Any = None) -> Any:
        sessions.append(session)
        return decode(features, lo, hi, given, session)

    def emit(_index: int, pcm: np.ndarray) -> bool:
        events.append(("audio", len(sessions)))
        chunks.append(pcm)
        return True

    def narrowed() -> None:
        events.append(("narrowed", len(sessions)))

    monkeypatch.setattr(kokoro, "pieces", "leading")
    monkeypatch.setattr(kokoro.model, "decode", spied)
    job = SynthesisJob(SENTENCE, voice, True, True, narrowed if narrowing else None)
    kokoro.synthesize_batch([job], emit)
    monkeypatch.undo()
    return sessions, events, np.concatenate(chunks)


@needs_model
def test_a_lone_call_goes_on_one_core_once_its_first_audio_is_out(
    kokoro: KokoroBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lone job that may narrow, where one core keeps ahead of its audio: its first
    piece on the idle session (both threads), then ``narrowed`` once, after that first
    audio went out and before the next piece, and the rest on the shared session (the
    scheduler starts a newcomer on the freed core); the same audio as decoded on both
    cores throughout. Not given ``narrowed`` (a caller without a scheduler), it keeps
    both cores."""
    set_pace(monkeypatch, kokoro, 8.0)
    sessions, events, narrowed_audio = lone_job_sessions(kokoro, monkeypatch, narrowing=True)
    idle = kokoro._idle_session
    assert len(sessions) >= 2 and sessions[0] is idle
    assert sessions[1:] == [None] * (len(sessions) - 1)
    assert events[:2] == [("audio", 1), ("narrowed", 1)]
    assert [e for e in events if e[0] == "narrowed"] == [("narrowed", 1)]
    set_pace(monkeypatch, kokoro, 8.0)
    sessions, events, whole_audio = lone_job_sessions(kokoro, monkeypatch, narrowing=False)
    assert sessions == [idle] * len(sessions) and all(e[0] == "audio" for e in events)
    np.testing.assert_array_equal(narrowed_audio, whole_audio)


@needs_model
def test_a_lone_call_keeps_both_cores_when_one_would_hold_its_first_audio_longer(
    kokoro: KokoroBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shared session's pace below real time and the idle one's well above: pieces
    for one core would hold the first audio back, so the lone job never narrows."""
    set_pace(monkeypatch, kokoro, 8.0)
    monkeypatch.setattr(kokoro, "pace", pieces.PaceMeter(0.6 * pieces.PACE_SAFETY))
    sessions, events, _ = lone_job_sessions(kokoro, monkeypatch, narrowing=True)
    assert len(sessions) >= 2 and sessions == [kokoro._idle_session] * len(sessions)
    assert all(kind == "audio" for kind, _ in events)


def checkpointed_job(
    kokoro: KokoroBackend, monkeypatch: pytest.MonkeyPatch, go_on: bool
) -> tuple[list[tuple[str, float, float]], int]:
    """A leading job of :data:`SENTENCE` (not alone) given a ``checkpoint`` that answers
    ``go_on``: the audio events (seconds emitted so far) and checkpoint calls in order,
    and the decoder runs."""
    assert kokoro.model is not None
    voice = kokoro.resolve_voice(VoiceSettings("zh-yunxi"))
    events: list[tuple[str, float, float]] = []
    emitted = [0.0]
    decode = kokoro.model.decode
    runs = [0]

    def counted(features: Any, lo: int, hi: int, given: Any, session: Any = None) -> Any:
        runs[0] += 1
        return decode(features, lo, hi, given, session)

    def emit(_index: int, pcm: np.ndarray) -> bool:
        emitted[0] += pcm.size / 24000
        events.append(("audio", emitted[0], 0.0))
        return True

    def checkpoint(out_s: float, next_s: float) -> bool:
        events.append(("checkpoint", out_s, next_s))
        return go_on

    monkeypatch.setattr(kokoro, "pieces", "leading")
    monkeypatch.setattr(kokoro.model, "decode", counted)
    job = SynthesisJob(SENTENCE, voice, True, False, None, checkpoint)
    kokoro.synthesize_batch([job], emit)
    monkeypatch.undo()
    return events, runs[0]


@needs_model
def test_a_job_in_pieces_passes_a_checkpoint_before_each_piece_after_its_first_audio(
    kokoro: KokoroBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint comes after the first audio, before each later piece, with the
    audio out so far (within a crossfade of what was emitted) and the next piece's decode
    at the measured pace; answered False, no further piece is decoded and nothing more is
    emitted."""
    set_pace(monkeypatch, kokoro, 3.0)
    events, runs = checkpointed_job(kokoro, monkeypatch, go_on=True)
    checkpoints = [e for e in events if e[0] == "checkpoint"]
    assert events[0][0] == "audio" and len(checkpoints) == runs - 1 >= 2
    for at, (kind, out_s, next_s) in enumerate(events):
        if kind == "checkpoint":
            emitted = events[at - 1][1]
            assert emitted - 0.02 <= out_s <= emitted + 0.02
            assert 0.0 < next_s < 5.0
    set_pace(monkeypatch, kokoro, 3.0)
    events, runs = checkpointed_job(kokoro, monkeypatch, go_on=False)
    assert [e[0] for e in events][-1] == "checkpoint"
    assert runs == sum(1 for e in events if e[0] == "audio")  # the released pieces only
